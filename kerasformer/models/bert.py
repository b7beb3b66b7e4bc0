"""BERT: a bidirectional encoder, with masked-LM and classification task models.

token + position + segment embeddings -> LayerNorm -> dropout -> N x
EncoderBlock (post-norm, GELU) -> sequence output; a tanh pooler over the
first ([CLS]) token -> pooled output.
"""

import keras
import numpy as np
from keras import ops

from kerasformer.layers import EncoderBlock
from kerasformer.layers.embedding import TokenEmbedding, check_token_ids
from kerasformer.layers.feedforward import ACTIVATIONS, resolve_activation
from kerasformer.layers.residual import make_norm
from kerasformer.models.base import (
    TaskModel,
    TransformerModel,
    check_choice,
    constructor_arguments,
    position_layer,
)

POSITION_TYPES = ("learned", "sinusoidal", "rotary")


@keras.saving.register_keras_serializable(package="kerasformer")
class BERT(TransformerModel):
    """The BERT encoder (functional `keras.Model`).

    Args:
        vocab_size: number of tokens.
        num_layers: number of encoder blocks.
        num_heads: attention heads per block.
        hidden_dim: model width d.
        intermediate_dim: FFN width (default 4d).
        max_sequence_length: size of the learned position table.
        num_segments: number of segment (token type) ids, at least 1 (BERT: 2).
        dropout: embedding and residual dropout (BERT: 0.1).
        attention_dropout: dropout on attention probabilities (BERT: 0.1;
            0 keeps the fused attention kernel usable).
        position_type: "learned" (BERT), "sinusoidal" or "rotary".
        activation: FFN activation (BERT: exact "gelu").
        norm_type: "layer_norm" or "rms_norm".
        norm_first: pre-norm; BERT is post-norm.
        norm_epsilon: epsilon of the norms (BERT: 1e-12).
        pad_token_id: token id of padding; keys equal to it are masked.

    Inputs: `{"token_ids": (B, T), "segment_ids": (B, T)}`. Segment ids may be
    left out, or token ids given alone: one segment (zeros), as `transformers`
    defaults `token_type_ids`.
    Outputs: `{"sequence_output": (B, T, d), "pooled_output": (B, d)}`.

    Example:

    >>> model = BERT(vocab_size=100, num_layers=2, num_heads=2, hidden_dim=32)
    >>> ids = np.array([[2, 7, 9, 3, 0]])
    >>> model({"token_ids": ids, "segment_ids": np.array([[0, 0, 0, 1, 1]])})["pooled_output"].shape
    (1, 32)
    >>> model(ids)["sequence_output"].shape  # One segment.
    (1, 5, 32)
    """

    def __init__(
        self,
        vocab_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        attention_dropout=0.0,
        position_type="learned",
        activation="gelu",
        norm_type="layer_norm",
        norm_first=False,
        norm_epsilon=1e-12,
        pad_token_id=0,
        **kwargs,
    ):
        config = constructor_arguments(locals(), BERT)
        check_choice("position_type", position_type, POSITION_TYPES)
        initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        token_embedding = TokenEmbedding(
            vocab_size, hidden_dim, embeddings_initializer=initializer, name="token_embedding"
        )
        position_embedding = position_layer(position_type, max_sequence_length, initializer)
        segment_embedding = None
        if num_segments:
            segment_embedding = keras.layers.Embedding(
                num_segments, hidden_dim, embeddings_initializer=initializer, name="segment_embedding"
            )
        embedding_norm = make_norm(norm_type, norm_epsilon, None, "embedding_norm")
        embedding_dropout = keras.layers.Dropout(dropout, name="embedding_dropout")
        blocks = [
            EncoderBlock(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim,
                activation=activation,
                norm_first=norm_first,
                norm_type=norm_type,
                norm_epsilon=norm_epsilon,
                dropout=dropout,
                attention_dropout=attention_dropout,
                use_rotary=position_type == "rotary",
                kernel_initializer=initializer,
                name=f"block_{i}",
            )
            for i in range(num_layers)
        ]
        final_norm = make_norm(norm_type, norm_epsilon, None, "final_norm") if norm_first else None
        pooler = keras.layers.Dense(
            hidden_dim, activation="tanh", kernel_initializer=initializer, name="pooler"
        )

        # Functional graph.
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input((None,), dtype="int32", name="segment_ids")
        padding_mask = ops.not_equal(token_ids, pad_token_id)  # (B, T)
        x = token_embedding(token_ids)  # (B, T, C)
        if position_embedding is not None:
            x = x + position_embedding(x)
        if segment_embedding is not None:
            x = x + segment_embedding(segment_ids)
        x = embedding_dropout(embedding_norm(x))
        for block in blocks:
            x = block(x, padding_mask=padding_mask)  # (B, T, C)
        if final_norm is not None:
            x = final_norm(x)
        pooled = pooler(x[:, 0])  # (B, C)
        super().__init__(
            inputs={"token_ids": token_ids, "segment_ids": segment_ids},
            outputs={"sequence_output": x, "pooled_output": pooled},
            **kwargs,
        )
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding
        self.segment_embedding = segment_embedding
        self.embedding_norm = embedding_norm
        self.blocks = blocks
        self.final_norm = final_norm
        self.pooler = pooler
        self._set_config(config)

    def input_vocabularies(self):
        vocabularies = {"token_ids": (self.token_embedding.vocab_size, "vocab_size")}
        if self.segment_embedding is not None:
            vocabularies["segment_ids"] = (self.segment_embedding.input_dim, "num_segments")
        return vocabularies

    def complete_inputs(self, inputs):
        if not isinstance(inputs, (dict, list, tuple)):  # Token ids alone.
            inputs = {"token_ids": inputs}
        if isinstance(inputs, dict) and "token_ids" in inputs and inputs.get("segment_ids") is None:
            token_ids = inputs["token_ids"]
            zeros = np.zeros_like(token_ids) if isinstance(token_ids, np.ndarray) else ops.zeros_like(token_ids)
            inputs = {**inputs, "segment_ids": zeros}  # (B, T): one segment
        return inputs

    def call(self, inputs, training=None, mask=None):
        # Keras's Embedding clamps an id past its table on JAX and fails
        # opaquely elsewhere; eager segment ids are checked here by name,
        # as `TokenEmbedding` checks token ids.
        if self.segment_embedding is not None and isinstance(inputs, dict) and "segment_ids" in inputs:
            check_token_ids(inputs["segment_ids"], self.segment_embedding.input_dim, "segment_ids", "num_segments")
        return super().call(inputs, training=training, mask=mask)


@keras.saving.register_keras_serializable(package="kerasformer")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + norm, then the tied embedding + bias.

    Args:
        token_embedding: the backbone's `TokenEmbedding`, used in reverse.
        activation: a `FeedForward` activation name ("gelu" for BERT).
        norm_epsilon: epsilon of the LayerNorm.
    """

    def __init__(self, token_embedding, activation="gelu", norm_epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.activation = activation
        self.norm_epsilon = norm_epsilon

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        self.dense = keras.layers.Dense(
            width,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            dtype=self.dtype_policy,
            name="dense",
        )
        self.dense.build(inputs_shape)
        self.norm = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build(inputs_shape)
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.token_embedding.vocab_size,), initializer="zeros"
        )
        self.built = True

    def call(self, inputs):
        x = ACTIVATIONS[self.activation](self.dense(inputs))  # (B, T, C)
        x = self.norm(x)
        return self.token_embedding(x, reverse=True) + self.output_bias  # (B, T, V)

    def compute_output_shape(self, inputs_shape):
        return (*inputs_shape[:-1], self.token_embedding.vocab_size)

    def get_config(self):
        # The embedding is the backbone's; the task model passes it back in.
        return {**super().get_config(), "activation": self.activation, "norm_epsilon": self.norm_epsilon}


@keras.saving.register_keras_serializable(package="kerasformer")
class BERTMaskedLM(TaskModel):
    """BERT with its masked-LM head: logits `(B, T, vocab_size)` at every position.

    Train with `sample_weight` that is 1 at the masked positions (see the
    data pipeline), as in BERT's pre-training. The backbone's pooler is not
    part of this objective (`transformers`' `BertForMaskedLM` has none): on
    TF and torch Keras warns that it gets no gradients; on JAX it gets zeros,
    so leave it out of weight decay, as `kerasformer.train.make_optimizer` does.

    Args:
        backbone: a `BERT`.
    """

    def __init__(self, backbone, **kwargs):
        config = constructor_arguments(locals(), BERTMaskedLM)
        head = MaskedLMHead(
            backbone.token_embedding,
            activation=resolve_activation(backbone.activation)[0],
            norm_epsilon=backbone.norm_epsilon,
            name="mlm_head",
        )
        inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in backbone.input}
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.mlm_head = head
        self._set_config(config)


@keras.saving.register_keras_serializable(package="kerasformer")
class BERTClassifier(TaskModel):
    """BERT for sequence classification: pooled output -> dropout -> logits.

    Args:
        backbone: a `BERT`.
        num_classes: number of classes.
        dropout: dropout before the classifier (BERT: 0.1).
    """

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        config = constructor_arguments(locals(), BERTClassifier)
        inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in backbone.input}
        pooled = backbone(inputs)["pooled_output"]
        classifier = keras.layers.Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="classifier",
        )
        logits = classifier(keras.layers.Dropout(dropout, name="classifier_dropout")(pooled))
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.classifier = classifier
        self._set_config(config)

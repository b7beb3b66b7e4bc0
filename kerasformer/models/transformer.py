"""The original encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).

embeddings x sqrt(d) + sinusoidal positions -> N x EncoderBlock (post-norm,
ReLU) ; target embeddings + positions -> N x DecoderBlock (causal self-attention,
cross-attention) -> linear projection tied to the target embedding -> logits.
"""

import math
from types import SimpleNamespace

import keras

from kerasformer.layers import DecoderBlock, EncoderBlock
from kerasformer.layers.embedding import TokenEmbedding
from kerasformer.layers.residual import make_norm
from kerasformer.models.base import check_choice, constructor_arguments, position_layer
from kerasformer.models.seq2seq import EncoderDecoderModel

POSITION_TYPES = ("sinusoidal", "learned")


@keras.saving.register_keras_serializable(package="kerasformer")
class Transformer(EncoderDecoderModel):
    """The original Transformer (functional `keras.Model`); base model by default.

    Args:
        vocab_size: source vocabulary size (and target's, unless given).
        num_layers: N, blocks in each of encoder and decoder (6).
        num_heads: h (8).
        hidden_dim: d_model (512).
        intermediate_dim: d_ff (default 4 d_model: 2048 in the base model, 4096 in the big one).
        target_vocab_size: target vocabulary, if different from the source's.
        max_sequence_length: size of the table for learned positions.
        dropout: P_drop, on embeddings+positions and residual branches (0.1).
        position_type: "sinusoidal" (the paper) or "learned".
        activation: FFN activation ("relu").
        norm_type: "layer_norm" or "rms_norm".
        norm_first: pre-norm (adds a final norm to each stack); the paper is
            post-norm.
        norm_epsilon: epsilon of the norms.
        share_embeddings: source and target share one embedding (a joint
            vocabulary, as in the paper's EN-DE model).
        tie_embeddings: the output projection is the transposed target
            embedding (the paper shares it).
        pad_token_id: source keys equal to it are masked.

    Inputs: `{"encoder_token_ids": (B, S), "decoder_token_ids": (B, T)}`.
    Output: logits `(B, T, target_vocab_size)`.

    Example:

    >>> model = Transformer(vocab_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)
    >>> model({"encoder_token_ids": np.array([[5, 6, 7]]),
    ...        "decoder_token_ids": np.array([[1, 5]])}).shape
    (1, 2, 100)
    """

    def __init__(
        self,
        vocab_size,
        num_layers=6,
        num_heads=8,
        hidden_dim=512,
        intermediate_dim=None,
        target_vocab_size=None,
        max_sequence_length=512,
        dropout=0.1,
        position_type="sinusoidal",
        activation="relu",
        norm_type="layer_norm",
        norm_first=False,
        norm_epsilon=1e-5,
        share_embeddings=True,
        tie_embeddings=True,
        pad_token_id=0,
        **kwargs,
    ):
        config = constructor_arguments(locals(), Transformer)
        check_choice("position_type", position_type, POSITION_TYPES)
        if share_embeddings and target_vocab_size not in (None, vocab_size):
            raise ValueError(
                "`share_embeddings=True` needs one vocabulary: `target_vocab_size` "
                f"({target_vocab_size}) differs from `vocab_size` ({vocab_size})."
            )
        block_options = dict(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            activation=activation,
            norm_first=norm_first,
            norm_type=norm_type,
            norm_epsilon=norm_epsilon,
            dropout=dropout,
        )

        def embedding(size, name):
            # Embeddings are multiplied by sqrt(d_model) (section 3.4).
            return TokenEmbedding(
                size,
                hidden_dim,
                scale=math.sqrt(hidden_dim),
                embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
                name=name,
            )

        source_embedding = embedding(vocab_size, "source_embedding")
        if share_embeddings:
            target_embedding = source_embedding
        else:
            target_embedding = embedding(target_vocab_size or vocab_size, "target_embedding")
        position_encoding = position_layer(position_type, max_sequence_length)

        def final_norm(name):
            return make_norm(norm_type, norm_epsilon, None, name) if norm_first else None

        parts = SimpleNamespace(
            source_embedding=source_embedding,
            target_embedding=target_embedding,
            position_encoding=position_encoding,
            encoder_position_bias=None,
            decoder_position_bias=None,
            dropout_layer=keras.layers.Dropout(dropout, name="dropout"),
            encoder_blocks=[
                EncoderBlock(**block_options, name=f"encoder_block_{i}") for i in range(num_layers)
            ],
            decoder_blocks=[
                DecoderBlock(**block_options, name=f"decoder_block_{i}") for i in range(num_layers)
            ],
            encoder_final_norm=final_norm("encoder_final_norm"),
            decoder_final_norm=final_norm("decoder_final_norm"),
            lm_head=None
            if tie_embeddings
            else keras.layers.Dense(target_vocab_size or vocab_size, name="lm_head"),
            output_scale=None,
            pad_token_id=pad_token_id,
        )
        self._build_graph(parts, **kwargs)
        self._set_config(config)

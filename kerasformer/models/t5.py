"""T5: an encoder-decoder with RMSNorm pre-norm, no biases and relative position bias.

encoder: shared embedding -> N x EncoderBlock (bidirectional relative bias,
one table shared by all blocks) -> RMSNorm. decoder: shared embedding -> N x
DecoderBlock (causal relative bias, cross-attention) -> RMSNorm -> LM head,
tied to the shared embedding with outputs scaled by d^-0.5 (T5 v1.0) or
separate (v1.1).
"""

from types import SimpleNamespace

import keras

from kerasformer.layers import DecoderBlock, EncoderBlock, RelativePositionBias
from kerasformer.layers.embedding import TokenEmbedding
from kerasformer.layers.positions import check_buckets
from kerasformer.layers.residual import make_norm
from kerasformer.models.base import constructor_arguments
from kerasformer.models.seq2seq import EncoderDecoderModel


@keras.saving.register_keras_serializable(package="kerasformer")
class T5(EncoderDecoderModel):
    """The T5 encoder-decoder (functional `keras.Model`).

    Args:
        vocab_size: number of tokens (shared by encoder and decoder).
        num_layers: encoder blocks.
        num_heads: attention heads.
        hidden_dim: model width d_model.
        intermediate_dim: FFN width d_ff (default 4d, as in t5-small and t5-base).
        head_dim: per-head width d_kv (default d_model / heads; T5 uses 64).
        num_decoder_layers: decoder blocks (default `num_layers`).
        relative_attention_num_buckets, relative_attention_max_distance:
            of `RelativePositionBias` (32 and 128 in T5).
        dropout: dropout everywhere (T5: 0.1).
        activation: "relu" (T5 v1.0) or "geglu_tanh" (v1.1's gated-gelu).
        norm_epsilon: RMSNorm epsilon (1e-6).
        tie_embeddings: LM head tied to the shared embedding, with the
            decoder output scaled by d^-0.5 (v1.0); False for v1.1.
        pad_token_id: encoder keys equal to it are masked; it also starts
            decoding, as in T5.

    Inputs: `{"encoder_token_ids": (B, S), "decoder_token_ids": (B, T)}`.
    Output: logits `(B, T, vocab_size)`.

    Example:

    >>> model = T5(vocab_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)
    >>> model({"encoder_token_ids": np.array([[5, 6, 1]]),
    ...        "decoder_token_ids": np.array([[0, 5]])}).shape
    (1, 2, 100)
    """

    def __init__(
        self,
        vocab_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        head_dim=None,
        num_decoder_layers=None,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout=0.1,
        activation="relu",
        norm_epsilon=1e-6,
        tie_embeddings=True,
        pad_token_id=0,
        **kwargs,
    ):
        config = constructor_arguments(locals(), T5)
        check_buckets(  # The encoder's are bidirectional, the stricter case.
            relative_attention_num_buckets,
            relative_attention_max_distance,
            bidirectional=True,
            names=("relative_attention_num_buckets", "relative_attention_max_distance"),
            owner="T5's ",
        )
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        block_options = dict(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            head_dim=head_dim,
            activation=activation,
            norm_first=True,
            norm_type="rms_norm",
            norm_epsilon=norm_epsilon,
            dropout=dropout,
            use_bias=False,
            attention_scale=1.0,  # T5 folds 1/sqrt(d) into its initialization.
        )

        def relative_bias(bidirectional, name):
            return RelativePositionBias(
                num_heads,
                num_buckets=relative_attention_num_buckets,
                max_distance=relative_attention_max_distance,
                bidirectional=bidirectional,
                initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
                name=name,
            )

        shared = TokenEmbedding(
            vocab_size,
            hidden_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
            name="token_embedding",
        )
        parts = SimpleNamespace(
            source_embedding=shared,
            target_embedding=shared,
            position_encoding=None,
            encoder_position_bias=relative_bias(True, "encoder_position_bias"),
            decoder_position_bias=relative_bias(False, "decoder_position_bias"),
            dropout_layer=keras.layers.Dropout(dropout, name="dropout"),
            encoder_blocks=[
                EncoderBlock(**block_options, name=f"encoder_block_{i}") for i in range(num_layers)
            ],
            decoder_blocks=[
                DecoderBlock(**block_options, name=f"decoder_block_{i}")
                for i in range(num_decoder_layers or num_layers)
            ],
            encoder_final_norm=make_norm("rms_norm", norm_epsilon, None, "encoder_final_norm"),
            decoder_final_norm=make_norm("rms_norm", norm_epsilon, None, "decoder_final_norm"),
            lm_head=None
            if tie_embeddings
            else keras.layers.Dense(vocab_size, use_bias=False, kernel_initializer=keras.initializers.RandomNormal(stddev=1.0), name="lm_head"),
            output_scale=hidden_dim**-0.5 if tie_embeddings else None,
            pad_token_id=pad_token_id,
        )
        self._build_graph(parts, **kwargs)
        self._initialize_as_t5(hidden_dim, intermediate_dim)
        self._set_config(config)

    def _initialize_as_t5(self, hidden_dim, intermediate_dim):
        """T5's initialization (Mesh TensorFlow's, as `transformers` writes it).

        Attention scores are not scaled by 1/sqrt(head_dim) (`attention_scale=1`):
        the query's init carries that factor instead. With the blocks' default
        Glorot init the scores of t5-small started ~8x too large, softmax
        saturated, and t5-tiny learned the number-words task
        (examples/train_translation.py) to 6.5% exact match; with T5's init, 90%.
        """
        normal = lambda std: keras.initializers.RandomNormal(stddev=std)  # noqa: E731
        for block in self.encoder_blocks + self.decoder_blocks:
            attentions = [block.self_attention] + ([block.cross_attention] if getattr(block, "cross_attention", None) else [])
            for attention in (residual.sublayer for residual in attentions):
                inner = attention.num_heads * attention.head_dim
                stds = {"query_dense": (hidden_dim * attention.head_dim) ** -0.5, "key_dense": hidden_dim**-0.5,
                        "value_dense": hidden_dim**-0.5, "output_dense": inner**-0.5}
                for name, std in stds.items():
                    kernel = getattr(attention, name).kernel
                    kernel.assign(normal(std)(kernel.shape))
            feedforward = block.feedforward.sublayer
            for dense, std in ((feedforward.intermediate_dense, hidden_dim**-0.5), (feedforward.gate_dense, hidden_dim**-0.5),
                               (feedforward.output_dense, intermediate_dim**-0.5)):
                if dense is not None:
                    dense.kernel.assign(normal(std)(dense.kernel.shape))

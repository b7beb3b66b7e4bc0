"""GPT: a decoder-only causal language model, GPT-2 layout by default.

token ids -> token embedding + positions -> N x DecoderBlock (causal,
pre-norm) -> final LayerNorm -> logits through the tied embedding.
"""

from types import SimpleNamespace

import keras

from kerasformer.layers import DecoderBlock
from kerasformer.layers.embedding import TokenEmbedding
from kerasformer.layers.residual import make_norm
from kerasformer.models.base import (
    GenerativeModel,
    check_choice,
    constructor_arguments,
    position_layer,
    empty_cache,
)

POSITION_TYPES = ("learned", "sinusoidal", "rotary")


@keras.saving.register_keras_serializable(package="kerasformer")
class GPT(GenerativeModel):
    """A decoder-only Transformer language model (functional `keras.Model`).

    With the defaults it is GPT-2: learned positions, pre-norm blocks with
    GELU (tanh) FFNs, a final LayerNorm and an LM head tied to the token
    embedding. The options change one thing each: `position_type="rotary"`,
    `norm_type="rms_norm"` and `activation="swiglu"` give a LLaMA-style model.

    Args:
        vocab_size: number of tokens.
        num_layers: number of decoder blocks.
        num_heads: attention heads per block.
        hidden_dim: model width d.
        intermediate_dim: FFN width (default 4d).
        max_sequence_length: context length; size of the learned position
            table (ignored by rotary and sinusoidal positions except as the
            default cache length of generation).
        dropout: dropout on embeddings and residual branches (GPT-2: 0.1).
        position_type: "learned" (GPT-2), "sinusoidal" or "rotary".
        activation: FFN activation ("gelu_tanh" for GPT-2, "swiglu", ...).
        norm_type: "layer_norm" or "rms_norm".
        norm_first: pre-norm (GPT-2) or post-norm.
        norm_epsilon: epsilon of the norms.
        tie_embeddings: the LM head is the transposed token embedding.
        use_bias: biases in projections (GPT-2: yes; LLaMA: no).
        num_key_value_heads: grouped-query attention (default: plain MHA).
        rotary_max_wavelength: the base of rotary positions (LLaMA 1/2:
            10000; LLaMA 3: 500000).

    Input: `token_ids` `(B, T)`. Output: logits `(B, T, vocab_size)`.

    Example:

    >>> model = GPT(vocab_size=100, num_layers=2, num_heads=2, hidden_dim=32)
    >>> model(np.array([[1, 2, 3]])).shape
    (1, 3, 100)
    """

    def __init__(
        self,
        vocab_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        max_sequence_length=1024,
        dropout=0.0,
        position_type="learned",
        activation="gelu_tanh",
        norm_type="layer_norm",
        norm_first=True,
        norm_epsilon=1e-5,
        tie_embeddings=True,
        use_bias=True,
        num_key_value_heads=None,
        rotary_max_wavelength=10000,
        **kwargs,
    ):
        config = constructor_arguments(locals(), GPT)
        check_choice("position_type", position_type, POSITION_TYPES)
        initializer = keras.initializers.RandomNormal(stddev=0.02)  # GPT-2, nanoGPT: N(0, 0.02)
        position_embedding = position_layer(position_type, max_sequence_length, initializer)
        parts = SimpleNamespace(
            token_embedding=TokenEmbedding(
                vocab_size, hidden_dim, embeddings_initializer=initializer, name="token_embedding"
            ),
            position_embedding=position_embedding,
            embedding_dropout=keras.layers.Dropout(dropout, name="embedding_dropout"),
            blocks=[
                DecoderBlock(
                    num_heads=num_heads,
                    intermediate_dim=intermediate_dim,
                    activation=activation,
                    norm_first=norm_first,
                    norm_type=norm_type,
                    norm_epsilon=norm_epsilon,
                    dropout=dropout,
                    use_bias=use_bias,
                    num_key_value_heads=num_key_value_heads,
                    use_rotary=position_type == "rotary",
                    rotary_max_wavelength=rotary_max_wavelength,
                    kernel_initializer=initializer,
                    name=f"block_{i}",
                )
                for i in range(num_layers)
            ],
            final_norm=make_norm(norm_type, norm_epsilon, None, "final_norm") if norm_first else None,
            lm_head=None
            if tie_embeddings
            else keras.layers.Dense(
                vocab_size, use_bias=False, kernel_initializer=initializer, name="lm_head"
            ),
        )
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        logits, _, _ = GPT.compute_logits(parts, token_ids)
        super().__init__(inputs=token_ids, outputs=logits, **kwargs)
        for name, value in vars(parts).items():
            setattr(self, name, value)
        # GPT-2 scales the init of the projections that feed the residual
        # stream by 1/sqrt(2 * layers), so the stream's variance stays ~1.
        residual_init = keras.initializers.RandomNormal(stddev=0.02 / (2 * num_layers) ** 0.5)
        for block in self.blocks:
            for dense in (block.self_attention.sublayer.output_dense, block.feedforward.sublayer.output_dense):
                dense.kernel.assign(residual_init(dense.kernel.shape))
        self._set_config(config)

    def compute_logits(
        self, token_ids, cache=None, cache_update_index=None, padding_mask=None, head_kernel=None
    ):
        """Logits for `token_ids` `(B, T)`; with a cache, placed at `cache_update_index`.

        `cache` is a tuple of `(B, 2, K, max_length, D)` tensors, one per block
        (see `empty_cache`); the keys and values of these tokens are written
        into it. `padding_mask` `(B, T)` (without a cache) hides padded keys,
        e.g. left padding. `head_kernel` is `tied_head_kernel()`, computed once
        by a caller that calls this in a loop. Returns
        `(logits (B, T, V), hidden (B, T, C), cache or None)`.
        """
        start = 0 if cache_update_index is None else cache_update_index
        x = self.token_embedding(token_ids)  # (B, T, C)
        if self.position_embedding is not None:
            x = x + self.position_embedding(x, start_index=start)  # (B, T, C)
        x = self.embedding_dropout(x)
        caches = []
        for i, block in enumerate(self.blocks):
            if cache is None:
                x = block(x, padding_mask=padding_mask)  # (B, T, C)
            else:
                x, layer_cache = block(
                    x, self_attention_cache=cache[i], cache_update_index=cache_update_index
                )  # (B, T, C), (B, 2, K, S_max, D)
                caches.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.lm_head is not None:
            logits = self.lm_head(x)  # (B, T, V)
        else:
            logits = self.token_embedding(x, reverse=True, transposed_table=head_kernel)  # (B, T, V)
        return logits, x, (tuple(caches) if caches else None)

    def input_vocabularies(self):
        return {"token_ids": (self.token_embedding.vocab_size, "vocab_size")}

    def tied_head_kernel(self):
        """The tied LM head's `(C, V)` kernel (the token table transposed), or None if untied."""
        return None if self.lm_head is not None else self.token_embedding.transposed_table()

    def empty_cache(self, batch_size, max_length):
        """A zero KV cache for `compute_logits`: a `(B, 2, K, max_length, D)` tensor per block."""
        return empty_cache(self.blocks, batch_size, max_length, self.compute_dtype)

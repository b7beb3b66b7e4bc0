"""Encoder and decoder blocks: attention and feed-forward sublayers in `Residual`s."""

import keras

from kerasformer.checks import check_batch_sizes, check_positive_int, check_rate
from kerasformer.layers.attention import (
    MultiHeadAttention,
    check_float_inputs,
    check_sequence_shapes,
    get_keras_mask,
)
from kerasformer.layers.feedforward import FeedForward, resolve_activation
from kerasformer.layers.residual import Residual, make_norm


class _TransformerBlock(keras.layers.Layer):
    """Options shared by `EncoderBlock` and `DecoderBlock`."""

    def __init__(
        self,
        num_heads,
        intermediate_dim=None,
        activation="relu",
        norm_first=False,
        norm_type="layer_norm",
        norm_epsilon=1e-5,
        dropout=0.0,
        attention_dropout=0.0,
        use_bias=True,
        head_dim=None,
        num_key_value_heads=None,
        attention_scale=None,
        use_rotary=False,
        rotary_max_wavelength=10000,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Fail here, naming the block's own arguments, not at build time.
        check_positive_int("num_heads", num_heads)
        check_rate("dropout", dropout)
        check_rate("attention_dropout", attention_dropout)
        resolve_activation(activation)
        make_norm(norm_type, norm_epsilon, None, None)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.norm_first = norm_first
        self.norm_type = norm_type
        self.norm_epsilon = norm_epsilon
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.use_bias = use_bias
        self.head_dim = head_dim
        self.num_key_value_heads = num_key_value_heads
        self.attention_scale = attention_scale
        self.use_rotary = use_rotary
        self.rotary_max_wavelength = rotary_max_wavelength
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _initializers(self):
        return {
            "kernel_initializer": keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            "bias_initializer": keras.initializers.get(
                keras.initializers.serialize(self.bias_initializer)
            ),
        }

    def _residual(self, sublayer, name):
        return Residual(
            sublayer,
            norm_first=self.norm_first,
            norm_type=self.norm_type,
            norm_epsilon=self.norm_epsilon,
            dropout=self.dropout,
            dtype=self.dtype_policy,
            name=name,
        )

    def _attention(self, name, use_rotary):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            num_key_value_heads=self.num_key_value_heads,
            use_bias=self.use_bias,
            dropout=self.attention_dropout,
            scale=self.attention_scale,
            use_rotary=use_rotary,
            rotary_max_wavelength=self.rotary_max_wavelength,
            dtype=self.dtype_policy,
            name=name,
            **self._initializers(),
        )

    def _feedforward(self, inputs_shape):
        feedforward = FeedForward(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            use_bias=self.use_bias,
            dropout=self.dropout,
            dtype=self.dtype_policy,
            name="feedforward",
            **self._initializers(),
        )
        feedforward.build(inputs_shape)
        residual = self._residual(feedforward, "feedforward_residual")
        residual.build(inputs_shape)
        return residual

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "activation": self.activation,
            "norm_first": self.norm_first,
            "norm_type": self.norm_type,
            "norm_epsilon": self.norm_epsilon,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "use_bias": self.use_bias,
            "head_dim": self.head_dim,
            "num_key_value_heads": self.num_key_value_heads,
            "attention_scale": self.attention_scale,
            "use_rotary": self.use_rotary,
            "rotary_max_wavelength": self.rotary_max_wavelength,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }


@keras.saving.register_keras_serializable(package="kerasformer")
class EncoderBlock(_TransformerBlock):
    """Self-attention then feed-forward, each in a residual sublayer.

    With the defaults (post-norm, ReLU, LayerNorm eps 1e-5, biases) it is
    `torch.nn.TransformerEncoderLayer`; `norm_first=True` is its pre-norm form.

    Args:
        num_heads: attention heads; must divide the width unless `head_dim`.
        intermediate_dim: feed-forward width, default 4x the model width.
        activation: feed-forward activation ("relu", "gelu", "gelu_tanh",
            "silu", "swiglu", "geglu", "reglu").
        norm_first: pre-norm if True, post-norm (the original) if False.
        norm_type: "layer_norm" or "rms_norm".
        norm_epsilon: epsilon of the norms.
        dropout: residual dropout, also used after the FFN activation.
        attention_dropout: dropout on attention probabilities (0 keeps the
            fused attention kernel usable).
        use_bias: biases in all projections (False for T5).
        head_dim, num_key_value_heads, attention_scale, use_rotary,
            rotary_max_wavelength: see `MultiHeadAttention`.
        kernel_initializer, bias_initializer: for all projections.

    Call arguments:
        inputs: `(B, T, C)`.
        padding_mask: `(B, T)`, True at real tokens; defaults to the Keras
            mask of `inputs`.
        attention_mask: `(B, T, T)`.
        attention_bias: additive bias, e.g. from `RelativePositionBias`.
        return_attention_scores: also return the `(B, H, T, T)` probabilities.

    Example:

    >>> block = EncoderBlock(num_heads=4, intermediate_dim=128)
    >>> block(np.random.rand(2, 10, 64).astype("float32")).shape
    (2, 10, 64)
    """

    def build(self, inputs_shape):
        check_sequence_shapes(inputs=inputs_shape)
        attention = self._attention("self_attention", self.use_rotary)
        attention.build(inputs_shape)
        self.self_attention = self._residual(attention, "self_attention_residual")
        self.self_attention.build(inputs_shape)
        self.feedforward = self._feedforward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        return_attention_scores=False,
        training=None,
    ):
        if padding_mask is None:
            padding_mask = get_keras_mask(inputs)
        outputs = self.self_attention(
            inputs,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        scores = None
        if return_attention_scores:
            outputs, scores = outputs
        outputs = self.feedforward(outputs, training=training)  # (B, T, C)
        return (outputs, scores) if return_attention_scores else outputs


@keras.saving.register_keras_serializable(package="kerasformer")
class DecoderBlock(_TransformerBlock):
    """Causal self-attention, optional cross-attention, then feed-forward.

    Cross-attention is created when the block is first called with
    `encoder_outputs` (encoder-decoder models); without, it is a GPT block.
    With the defaults it is `torch.nn.TransformerDecoderLayer`.

    Args: as `EncoderBlock`. Rotary positions apply to self-attention only.

    Call arguments:
        inputs: `(B, T, C)` decoder states.
        encoder_outputs: `(B, S, C')` memory for cross-attention.
        padding_mask: `(B, T)` for the decoder keys (the cache length
            when decoding with a cache); defaults to the Keras mask of `inputs`.
        attention_mask: `(B, T, T)` extra self-attention mask.
        encoder_padding_mask: `(B, S)`; defaults to the Keras mask of
            `encoder_outputs`.
        self_attention_bias, cross_attention_bias: additive biases.
        use_causal_mask: causal self-attention (default True).
        self_attention_cache: `(B, 2, K, S_max, D)`, with
            `cache_update_index`, for incremental decoding.
        cache_update_index: position of the first of `inputs`.
        cross_attention_cache: `(B, 2, K, S, D)` precomputed by
            `block.cross_attention.sublayer.compute_cache(encoder_outputs)`.
        return_attention_scores: also return the probabilities.

    Returns:
        `outputs`, followed by the self- (and cross-) attention scores if
        requested, followed by the updated self-attention cache if one was
        passed.

    Example:

    >>> block = DecoderBlock(num_heads=4)
    >>> block(np.random.rand(2, 10, 64).astype("float32")).shape
    (2, 10, 64)
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        check_sequence_shapes(inputs=inputs_shape, encoder_outputs=encoder_outputs_shape)
        attention = self._attention("self_attention", self.use_rotary)
        attention.build(inputs_shape)
        self.self_attention = self._residual(attention, "self_attention_residual")
        self.self_attention.build(inputs_shape)
        self.cross_attention = None
        if encoder_outputs_shape is not None:
            attention = self._attention("cross_attention", use_rotary=False)
            attention.build(inputs_shape, encoder_outputs_shape)
            self.cross_attention = self._residual(attention, "cross_attention_residual")
            self.cross_attention.build(inputs_shape)
        self.feedforward = self._feedforward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        attention_mask=None,
        encoder_padding_mask=None,
        self_attention_bias=None,
        cross_attention_bias=None,
        use_causal_mask=True,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        check_float_inputs(encoder_outputs=encoder_outputs)  # `inputs` is checked by the Residual.
        check_batch_sizes(inputs=inputs, encoder_outputs=encoder_outputs)
        if self_attention_cache is not None:
            self.self_attention.sublayer.check_cache(
                self_attention_cache, inputs.shape[1], cache_update_index, name="self_attention_cache"
            )
        if cross_attention_cache is not None and self.cross_attention is not None:
            self.cross_attention.sublayer.check_cache(cross_attention_cache, name="cross_attention_cache")
        if padding_mask is None:
            padding_mask = get_keras_mask(inputs)
        outputs = self.self_attention(
            inputs,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            attention_bias=self_attention_bias,
            use_causal_mask=use_causal_mask,
            cache=self_attention_cache,
            cache_update_index=cache_update_index,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        outputs, extras = (outputs[0], tuple(outputs[1:])) if isinstance(outputs, tuple) else (outputs, ())
        scores = extras[:1] if return_attention_scores else ()
        new_cache = extras[-1:] if self_attention_cache is not None else ()

        if self.cross_attention is not None:
            if encoder_outputs is None and cross_attention_cache is None:
                raise ValueError(
                    "This block has cross-attention: pass `encoder_outputs` "
                    "or `cross_attention_cache`."
                )
            if encoder_padding_mask is None and encoder_outputs is not None:
                encoder_padding_mask = get_keras_mask(encoder_outputs)
            outputs = self.cross_attention(
                outputs,
                context=encoder_outputs,
                padding_mask=encoder_padding_mask,
                attention_bias=cross_attention_bias,
                cache=cross_attention_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                outputs, cross_scores = outputs[0], outputs[1]
                scores += (cross_scores,)
            elif cross_attention_cache is not None:
                outputs = outputs[0]
        elif encoder_outputs is not None:
            raise ValueError(
                "`encoder_outputs` was passed to a DecoderBlock built without "
                "cross-attention (first called without `encoder_outputs`)."
            )
        outputs = self.feedforward(outputs, training=training)  # (B, T, C)
        results = (outputs, *scores, *new_cache)
        return results[0] if len(results) == 1 else results

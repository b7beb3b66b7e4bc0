"""The sublayer wrapper: a residual connection around a sublayer, with its norm."""

import keras

from kerasformer.checks import check_number, check_rate
from kerasformer.layers.attention import check_float_inputs

NORM_TYPES = ("layer_norm", "rms_norm")


def make_norm(norm_type, epsilon, dtype, name):
    """LayerNorm or RMSNorm; both compute in float32 under mixed precision."""
    check_number("norm_epsilon", epsilon, low=0)
    if norm_type == "layer_norm":
        return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
    if norm_type == "rms_norm":
        norm = keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
        # Per token, so the padding mask passes through as with LayerNorm. Keras's
        # RMSNorm drops it: a pre-norm attention then attended to padding.
        norm.supports_masking = True
        return norm
    raise ValueError(f"Unknown `norm_type` {norm_type!r}; expected one of {NORM_TYPES}.")


@keras.saving.register_keras_serializable(package="kerasformer")
class Residual(keras.layers.Layer):
    """Wraps a sublayer f as post-norm `LN(x + f(x))` or pre-norm `x + f(LN(x))`.

    Post-norm is the original Transformer and BERT; pre-norm trains more
    stably when deep (GPT-2, T5, most models since). Dropout is applied to
    f's output before the sum ("residual dropout" of the original paper).

    Args:
        sublayer: a Keras layer mapping `(B, T, C)` to `(B, T, C)`. If it
            returns a tuple (attention with scores or a cache), its first
            element is the residual branch and the rest is passed through.
        norm_first: pre-norm if True, post-norm if False.
        norm_type: "layer_norm" or "rms_norm".
        norm_epsilon: the norm's epsilon (1e-5 as in torch; T5 uses 1e-6).
        dropout: residual dropout rate.

    Call arguments:
        inputs: `(B, T, C)`.
        context: second positional input of the sublayer, e.g. the encoder
            outputs of cross-attention (not normed here).
        padding_mask, attention_mask, attention_bias, use_causal_mask, cache,
            cache_update_index, return_attention_scores: forwarded to the
            sublayer when given (see `MultiHeadAttention`).

    Example:

    >>> from kerasformer.layers import FeedForward
    >>> block = Residual(FeedForward(), norm_first=True)
    >>> block(np.random.rand(2, 10, 64).astype("float32")).shape
    (2, 10, 64)
    """

    def __init__(
        self,
        sublayer,
        norm_first=False,
        norm_type="layer_norm",
        norm_epsilon=1e-5,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_rate("dropout", dropout)
        self.sublayer = sublayer
        self.norm_first = norm_first
        self.norm_type = norm_type
        self.norm_epsilon = norm_epsilon
        self.dropout = dropout
        self.norm = make_norm(norm_type, norm_epsilon, self.dtype_policy, "norm")
        self.residual_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.norm.build(inputs_shape)
        # The sublayer builds on its first call, where all its input shapes are known.
        self.built = True

    def call(
        self,
        inputs,
        context=None,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        # Keras forbids a `**kwargs` of mixed tensors and flags in `call`, so
        # the arguments an attention sublayer may take are spelled out; only
        # those given are forwarded, so any `f(x, training)` layer also fits.
        forwarded = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "attention_bias": attention_bias,
            "use_causal_mask": use_causal_mask,
            "cache": cache,
            "cache_update_index": cache_update_index,
            "return_attention_scores": return_attention_scores,
        }
        forwarded = {k: v for k, v in forwarded.items() if v is not None and v is not False}
        check_float_inputs(inputs=inputs)
        args = () if context is None else (context,)
        x = self.norm(inputs) if self.norm_first else inputs
        outputs = self.sublayer(x, *args, training=training, **forwarded)
        extras = ()
        if isinstance(outputs, (tuple, list)):
            outputs, *extras = outputs
        outputs = inputs + self.residual_dropout(outputs, training=training)
        if not self.norm_first:
            outputs = self.norm(outputs)
        return (outputs, *extras) if extras else outputs

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        return {
            **super().get_config(),
            "sublayer": keras.saving.serialize_keras_object(self.sublayer),
            "norm_first": self.norm_first,
            "norm_type": self.norm_type,
            "norm_epsilon": self.norm_epsilon,
            "dropout": self.dropout,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["sublayer"] = keras.saving.deserialize_keras_object(config["sublayer"])
        return cls(**config)

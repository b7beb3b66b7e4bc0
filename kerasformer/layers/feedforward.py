"""The position-wise feed-forward network, plain or gated (GLU variants)."""

import keras
from keras import ops

from kerasformer.checks import check_rate
from kerasformer.layers.linear import dense_linear

# Activations by name; the tanh approximation of GELU is the one GPT-2 and
# T5 v1.1 were trained with, the exact one is BERT's and torch's default.
# On torch's CPU build the tanh one is slow (1.73 vs 0.47 ms forward for the
# exact one on a (2048, 1024) tensor, 2 Zen 4 cores). Its sigmoid form
# `x sigmoid(2u)`, written as in-place torch passes with the derivative kept
# for the backward, ran 2.75 vs 3.8 ms forward + backward alone but no faster
# in the training step of `benchmarks/train_throughput.py` (1.000x, median of
# 14 paired rounds): there each pass reads its tensor from memory, not cache.
ACTIVATIONS = {
    "relu": keras.activations.relu,
    "gelu": lambda x: keras.activations.gelu(x, approximate=False),
    "gelu_tanh": lambda x: keras.activations.gelu(x, approximate=True),
    "silu": keras.activations.silu,
}
# Shorthands for the gated variants of Shazeer, "GLU Variants Improve Transformer".
# "geglu_tanh" is T5 v1.1's "gated-gelu".
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "reglu": "relu"}


def resolve_activation(activation, gated=False):
    """Returns `(activation_name, gated)` with the GLU shorthands expanded."""
    if activation in GATED_ACTIVATIONS:
        return GATED_ACTIVATIONS[activation], True
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"Unknown `activation` {activation!r}; expected one of "
            f"{sorted(ACTIVATIONS) + sorted(GATED_ACTIVATIONS)}."
        )
    return activation, gated


@keras.saving.register_keras_serializable(package="kerasformer")
class FeedForward(keras.layers.Layer):
    """`W_2 act(x W_1 + b_1) + b_2`, or gated: `W_2 (act(x W_g) * (x W_1))`.

    Args:
        intermediate_dim: inner width. Defaults to 4x the input width.
        activation: "relu" (original Transformer), "gelu" (exact), "gelu_tanh"
            (GPT-2), "silu", or a gated shorthand "swiglu", "geglu",
            "geglu_tanh" (T5 v1.1), "reglu".
        gated: use a GLU: the activated gate projection multiplies a second,
            linear projection (T5 v1.1, LLaMA). Implied by the shorthands.
        use_bias: whether the projections have biases (T5 has none).
        dropout: dropout after the activation, as in `torch.nn.Transformer`.
        kernel_initializer, bias_initializer: initializers of the projections.

    Example:

    >>> ffn = FeedForward(activation="swiglu")
    >>> ffn(np.random.rand(2, 10, 64).astype("float32")).shape
    (2, 10, 64)
    """

    def __init__(
        self,
        intermediate_dim=None,
        activation="relu",
        gated=False,
        use_bias=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if intermediate_dim is not None and (not isinstance(intermediate_dim, int) or intermediate_dim < 1):
            raise ValueError(f"`intermediate_dim` must be a positive int or None (4x the width), got {intermediate_dim!r}.")
        check_rate("dropout", dropout)
        self.activation_name, self.gated = resolve_activation(activation, gated)
        self.activation = activation
        self.intermediate_dim = intermediate_dim
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        inner = self.intermediate_dim or 4 * width

        def dense(name, units):
            return keras.layers.Dense(
                units,
                use_bias=self.use_bias,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )

        self.intermediate_dense = dense("intermediate", inner)
        self.intermediate_dense.build(inputs_shape)
        self.gate_dense = None
        if self.gated:
            self.gate_dense = dense("gate", inner)
            self.gate_dense.build(inputs_shape)
        self.output_dense = dense("output", width)
        self.output_dense.build((*inputs_shape[:-1], inner))
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=None):
        act = ACTIVATIONS[self.activation_name]
        # 2-D matmuls: for the kernel gradients of 3-D ones, XLA on CPU copies
        # each (B, T, .) activation into a transposed layout, slowly (JAX
        # training, `benchmarks/train_throughput.py`: 2399 -> 2738 tok/s).
        lead = ops.shape(inputs)[:-1]
        flat = ops.reshape(inputs, (-1, inputs.shape[-1]))  # (B*T, C)
        hidden = dense_linear(self.intermediate_dense, flat)  # (B*T, F)
        if self.gated:
            hidden = act(dense_linear(self.gate_dense, flat)) * hidden  # (B*T, F)
        else:
            hidden = act(hidden)  # (B*T, F)
        hidden = self.inner_dropout(hidden, training=training)
        outputs = dense_linear(self.output_dense, hidden)  # (B*T, C)
        return ops.reshape(outputs, (*lead, outputs.shape[-1]))  # (B, T, C)

    def get_config(self):
        return {
            **super().get_config(),
            "intermediate_dim": self.intermediate_dim,
            "activation": self.activation,
            "gated": self.gated,
            "use_bias": self.use_bias,
            "dropout": self.dropout,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }

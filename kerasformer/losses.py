"""Losses for token prediction."""

import functools

import keras
from keras import ops

from kerasformer.tf_xla import compiling_with_xla


@keras.saving.register_keras_serializable(package="kerasformer")
class TokenCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy of logits `(..., V)` against token ids `(...)`.

    The value of `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`,
    computed on `(N, V)` rows. Keras's torch backend moves the vocabulary axis
    of `(B, T, V)` logits to axis 1 first: a copy plus a strided softmax that
    took ~18% of a GPT training step (vocabulary 8192, see
    `benchmarks/train_throughput.py`); on torch its gradient is also written
    as two passes (see `_torch_token_cross_entropy`). Padding is left out with
    `sample_weight`, as with any Keras loss; `reduction="mean_with_sample_weight"`
    then averages over the weighted tokens (as `torch.nn.CrossEntropyLoss`
    with `ignore_index` does) instead of over every position.

    Example:

    >>> loss = TokenCrossEntropy()
    >>> logits = np.zeros((2, 3, 8), "float32")  # (B, T, V): uniform over 8 tokens
    >>> round(float(loss(np.array([[1, 2, 3], [4, 5, 6]]), logits)), 4)  # ln 8
    2.0794
    >>> from kerasformer.models import GPT
    >>> model = GPT(vocab_size=8, num_layers=1, num_heads=2, hidden_dim=16)
    >>> model.compile(optimizer="adamw", loss=TokenCrossEntropy())
    """

    def __init__(self, name="token_cross_entropy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        if len(y_true.shape) == len(y_pred.shape):  # Labels with a trailing axis of 1.
            y_true = ops.squeeze(y_true, axis=-1)
        y_true = ops.cast(y_true, "int32")
        rows = ops.reshape(y_pred, (-1, y_pred.shape[-1]))  # (N, V), vocabulary axis contiguous
        labels = ops.reshape(y_true, (-1,))  # (N,)
        if keras.backend.backend() == "tensorflow" and compiling_with_xla():
            losses = _tf_xla_token_cross_entropy(rows, labels)  # (N,)
        elif keras.backend.backend() == "torch":
            losses = _torch_token_cross_entropy(rows, labels)  # (N,)
        elif keras.backend.backend() == "jax":
            # Keras's JAX version multiplies by a one-hot (N, V) matrix, forward
            # and backward; logsumexp minus the picked logit skips both passes.
            picked = ops.take_along_axis(rows, labels[:, None], axis=-1)[:, 0]  # (N,)
            losses = ops.logsumexp(rows, axis=-1) - picked  # (N,)
        else:  # TF's fused kernel, without XLA.
            losses = ops.sparse_categorical_crossentropy(labels, rows, from_logits=True)  # (N,)
        return ops.reshape(losses, ops.shape(y_true))  # (B, T)


def _tf_xla_token_cross_entropy(logits, labels):
    """`(N,)` losses of `(N, V)` logits for XLA, the gradient written as one pass.

    XLA lowers TF's fused kernel to a one-hot product summed over the whole
    `(N, V)` matrix, plus a gradient pass apart. Here the loss is logsumexp
    minus the picked logit, and the gradient `softmax - one_hot` is one
    elementwise pass over the logits: loss forward + backward at N=2048,
    V=8192 takes ~32 ms instead of ~56 ms. Without XLA the fused kernel is
    faster (69 vs 101 ms), so it stays there.
    """
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert  # Autograph would wrap `gradient`.
    @tf.custom_gradient
    def cross_entropy(logits):
        top = tf.stop_gradient(tf.reduce_max(logits, axis=-1, keepdims=True))  # (N, 1)
        log_sum = tf.math.log(tf.reduce_sum(tf.exp(logits - top), axis=-1, keepdims=True)) + top  # (N, 1)
        picked = tf.gather(logits, labels[:, None], batch_dims=1)  # (N, 1)

        def gradient(upstream):  # upstream: (N,)
            one_hot = tf.one_hot(labels, tf.shape(logits)[-1], dtype=logits.dtype)  # (N, V)
            return (tf.exp(logits - log_sum) - one_hot) * upstream[:, None]  # (N, V)

        return (log_sum - picked)[:, 0], gradient

    return cross_entropy(logits)


def _torch_token_cross_entropy(logits, labels):
    """`(N,)` losses of `(N, V)` logits on torch, the gradient written as two passes.

    `torch.nn.functional.cross_entropy`'s backward zero-fills an `(N, V)`
    gradient, scatters into it, then runs log-softmax's backward over it. Here
    the forward keeps the log-probabilities, and the backward is
    `softmax(log_probs) * upstream` minus `upstream` at the labels. In a training
    step of `benchmarks/train_throughput.py`'s GPT (N=2048, V=8192): 3455 vs
    3348 tokens/s, same process, best of 6 rounds.

    `softmax(log_probs)` is `exp(log_probs)` (the log-probabilities are
    normalized), but torch's CPU softmax kernel is the faster one: in that
    step `torch.exp` over the `(2048, 8192)` matrix took 18-23 ms; with the
    softmax the whole step was 1.03x faster (median of 8 paired rounds,
    torch 2.13 on 2 Zen 4 cores).
    """
    import torch

    if torch.compiler.is_compiling():  # Inductor fuses torch's own; Dynamo cannot trace the factory.
        return torch.nn.functional.cross_entropy(logits, labels.long(), reduction="none")
    return _torch_cross_entropy_function().apply(logits, labels.long())


@functools.cache
def _torch_cross_entropy_function():
    import torch

    class TorchCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, labels):
            log_probs = torch.log_softmax(logits, dim=-1)  # (N, V)
            ctx.save_for_backward(log_probs, labels)
            return -log_probs.gather(1, labels[:, None])[:, 0]  # (N,)

        @staticmethod
        def backward(ctx, upstream):  # upstream: (N,)
            log_probs, labels = ctx.saved_tensors
            gradient = torch.softmax(log_probs, dim=-1).mul_(upstream[:, None])  # (N, V) probabilities x upstream
            gradient.scatter_add_(1, labels[:, None], -upstream[:, None])  # minus the one-hot
            return gradient, None

    return TorchCrossEntropy

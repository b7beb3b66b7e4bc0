"""Losses for token prediction."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kerasformer")
class TokenCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy of logits `(..., V)` against token ids `(...)`.

    The value of `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`,
    computed on `(N, V)` rows. Keras's torch backend moves the vocabulary axis
    of `(B, T, V)` logits to axis 1 first: a copy plus a strided softmax that
    took ~18% of a GPT training step (vocabulary 8192, see
    `benchmarks/train_throughput.py`). Padding is left out with
    `sample_weight`, as with any Keras loss.

    Example:

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
        if keras.backend.backend() == "jax":
            # Keras's JAX version multiplies by a one-hot (N, V) matrix, forward
            # and backward; logsumexp minus the picked logit skips both passes.
            picked = ops.take_along_axis(rows, labels[:, None], axis=-1)[:, 0]  # (N,)
            losses = ops.logsumexp(rows, axis=-1) - picked  # (N,)
        else:  # TF and torch call their fused kernels.
            losses = ops.sparse_categorical_crossentropy(labels, rows, from_logits=True)  # (N,)
        return ops.reshape(losses, ops.shape(y_true))  # (B, T)

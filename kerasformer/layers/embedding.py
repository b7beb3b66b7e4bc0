"""Token embedding whose transpose can also serve as the output layer (tied head)."""

import functools

import keras
from keras import ops

from kerasformer.checks import check_number, check_positive_int
from kerasformer.layers.linear import linear
from kerasformer.tf_xla import compiling_with_xla, optimization_barrier


def _concrete_values(x):
    """`x` as numpy when it holds values now (eager), else None (traced)."""
    if isinstance(x, keras.KerasTensor):
        return None
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            return None
    elif backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "torch":
        import torch

        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return None
    return keras.ops.convert_to_numpy(x)


def check_token_ids(token_ids, vocab_size, name="token_ids", size_name="vocab_size"):
    """Raises a ValueError naming `name` (and `size_name`) if eager ids fall outside `[0, vocab_size)`.

    Traced (compiled) calls cannot raise, so they are checked where data
    enters: here when eager, and in generation, export and serving.
    """
    values = _concrete_values(token_ids)
    if values is None or values.size == 0:
        return
    if not (values.dtype.kind in "iu"):
        raise ValueError(f"`{name}` must be integer token ids, got dtype {values.dtype}.")
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` must lie in [0, {vocab_size}) ({size_name}={vocab_size}), "
            f"got values from {low} to {high}."
        )


def tied_logits(hidden, table):
    """`hidden (N, C) @ table (V, C)^T`: the logits `(N, V)` of an LM head tied to `table`.

    A 2-D matmul: TF's gradient of a "...c,vc->...v" einsum builds a
    `(B, T, V, C)` tensor (17 GB at B*T=2048, V=8192, C=256), and XLA on CPU
    ran a GPT training step 1.5x slower with the 2-D einsum "nc,vc->nv" than
    with a transpose + matmul (TF; equal on JAX, torch).

    Under XLA on CPU (TF compiled, JAX) the table's gradient is a plain
    matmul of a materialized `hidden^T`; see `_tf_xla_tied_logits`.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow" and compiling_with_xla():
        return _tf_xla_tied_logits(hidden, table)
    if backend == "jax" and _jax_on_cpu():
        return _jax_cpu_tied_logits()(hidden, table)
    return linear(hidden, ops.transpose(table))  # (N, V); oneDNN on torch CPU


def _jax_on_cpu():
    import jax

    return jax.default_backend() == "cpu"


@functools.cache
def _jax_cpu_tied_logits():
    """`tied_logits` for JAX on CPU, with the table's gradient written as on TF.

    The same product `upstream^T @ hidden` ran at ~100 GFLOP/s, and at ~160
    with `hidden^T` materialized between barriers (jax.jit alone, N=2048,
    V=8192, C=256, 2 cores). Throughput benchmark's GPT training step, median
    of paired rounds: 1.027x (8 rounds) and 1.025x (14). On GPU, cuBLAS takes
    transposed operands as they are, so the plain matmul stays.
    """
    import jax

    barrier = jax.lax.optimization_barrier

    @jax.custom_vjp
    def logits(hidden, table):
        return hidden @ table.T  # (N, V)

    def forward(hidden, table):
        return hidden @ table.T, (hidden, table)

    def backward(saved, upstream):  # upstream: (N, V)
        hidden, table = saved
        table_gradient_t = barrier(barrier(hidden.T) @ upstream)  # (C, V), hidden^T materialized
        return upstream @ table, table_gradient_t.T  # (N, C), (V, C)

    logits.defvjp(forward, backward)
    return logits


def _tf_xla_tied_logits(hidden, table):
    """`tied_logits` for XLA, with the table's gradient as a plain `(C, N) @ (N, V)` matmul.

    XLA on CPU computes the table's gradient `upstream^T @ hidden`, which
    contracts the token axis of both operands, at ~95 GFLOP/s for N=2048,
    V=8192, C=256 (2 cores), against ~150 GFLOP/s for the same product with
    `hidden^T` materialized first. Barriers keep XLA from folding the
    transposes back into the dot. GPT training step, TF (N=2048, V=8192,
    C=256): the head's backward takes 113 instead of 145 ms.
    """
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert  # Autograph would wrap `gradient`.
    @tf.custom_gradient
    def logits(hidden, table):
        def gradient(upstream):  # upstream: (N, V)
            hidden_t = optimization_barrier(tf.transpose(hidden))  # (C, N), materialized
            table_gradient_t = optimization_barrier(tf.matmul(hidden_t, upstream))  # (C, V)
            return tf.matmul(upstream, table), tf.transpose(table_gradient_t)  # (N, C), (V, C)

        return tf.matmul(hidden, table, transpose_b=True), gradient  # (N, V)

    return logits(hidden, table)


@keras.saving.register_keras_serializable(package="kerasformer")
class TokenEmbedding(keras.layers.Layer):
    """A `(vocab_size, hidden_dim)` embedding table, usable in reverse as the LM head.

    `embedding(ids)` looks rows up; `embedding(hidden, reverse=True)` computes
    `hidden @ table^T`, the logits of a head tied to the input embedding
    (GPT-2, BERT, T5 v1.0, the original Transformer). A loop that applies the
    head many times (generation) takes `transposed_table()` once and passes it
    as `transposed_table=`: XLA otherwise copies the transposed table into a
    fresh buffer on every iteration (8 MB per token at V=8192, C=256).

    Args:
        vocab_size: number of tokens.
        hidden_dim: embedding width.
        scale: multiplier of looked-up embeddings; the original Transformer
            uses `sqrt(hidden_dim)`.
        embeddings_initializer: initializer of the table.

    Example:

    >>> embedding = TokenEmbedding(100, 16)
    >>> hidden = embedding(np.array([[1, 2, 3]]))
    >>> embedding(hidden, reverse=True).shape
    (1, 3, 100)
    """

    def __init__(
        self,
        vocab_size,
        hidden_dim,
        scale=None,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("hidden_dim", hidden_dim)
        check_number("scale", scale, none_ok=True)
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.scale = scale
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.hidden_dim),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def transposed_table(self):
        """The head's `(hidden_dim, vocab_size)` kernel: the table transposed, in the compute dtype."""
        return ops.transpose(ops.cast(self.embeddings, self.compute_dtype))  # (C, V)

    def call(self, inputs, reverse=False, transposed_table=None):
        if reverse:
            flat = ops.reshape(inputs, (-1, self.hidden_dim))  # (B*T, C)
            if transposed_table is None:
                logits = tied_logits(flat, ops.cast(self.embeddings, self.compute_dtype))  # (B*T, V)
            else:
                logits = linear(flat, transposed_table)  # (B*T, V)
            return ops.reshape(logits, (*ops.shape(inputs)[:-1], self.vocab_size))  # (B, T, V)
        check_token_ids(inputs, self.vocab_size)
        outputs = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)  # (B, T, C)
        if self.scale is not None:
            outputs = outputs * self.scale
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_spec(self, inputs, reverse=False, transposed_table=None):
        if reverse:
            shape = (*inputs.shape[:-1], self.vocab_size)
        else:
            shape = (*inputs.shape, self.hidden_dim)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "hidden_dim": self.hidden_dim,
            "scale": self.scale,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        }

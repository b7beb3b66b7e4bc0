"""Helpers for TensorFlow code paths that only XLA compiles (`jit_compile=True`).

Some TF graphs run faster under XLA on CPU when written differently (see
`losses.py` and `layers/embedding.py`); these helpers tell when a function is
traced for XLA and keep XLA from undoing a chosen layout.
"""


def compiling_with_xla():
    """Whether TF is tracing a function that XLA will compile (`jit_compile=True`)."""
    import tensorflow as tf

    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:  # A TF without this helper: callers take their portable path.
        return False
    return GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def optimization_barrier(x):
    """`x`, computed as written: XLA may not fold it into its consumers (XLA only).

    E.g. a transpose stays a materialized copy instead of becoming a
    transposed operand of the next dot.
    """
    from tensorflow.compiler.tf2xla.python.xla import optimization_barrier as barrier

    return barrier(x)[0]  # The op takes and returns a tuple of tensors.

"""Fused `keras.ops.dot_product_attention` vs explicit einsum+softmax, fwd+bwd.

Times the attention core of `kerasformer.layers.MultiHeadAttention` (causal,
B16/T128/H4/D64 by default) on the current backend, compiled the way training
compiles it (jax.jit, tf.function(jit_compile=True), torch eager), and prints
the paths side by side (the explicit one also split into causal query blocks,
see `causal_query_blocks`). The choice in `_fused_attention_is_faster` rests on
these figures.

    KERAS_BACKEND=jax python benchmarks/attention_paths.py
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from common import median_seconds  # noqa: E402
from kerasformer.layers import MultiHeadAttention, attention  # noqa: E402


def make_step(layer, fused, q, k, v):
    """A function running forward and backward of the attention core once."""
    backend = keras.backend.backend()
    layer.fused_attention = fused

    def loss(q, k, v):
        out, _ = layer._attend(q, k, v, None, None, True, False, False)
        return keras.ops.sum(out * out)

    if backend == "jax":
        import jax

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(grad(q, k, v))
    if backend == "tensorflow":
        import tensorflow as tf

        q, k, v = (tf.constant(t) for t in (q, k, v))

        @tf.function(jit_compile=True)
        def grad():
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                value = loss(q, k, v)
            return tape.gradient(value, [q, k, v])

        return lambda: [t.numpy() for t in grad()]
    import torch

    q, k, v = (torch.tensor(t, requires_grad=True) for t in (q, k, v))

    def step():
        loss(q, k, v).backward()

    return step


def time_step(step, repeats):
    """Median milliseconds of `step()` after three warm-up calls (compilation)."""
    return 1e3 * median_seconds(step, repeats, warmup=3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    shape = (args.batch, args.length, args.heads, args.head_dim)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype("float32") for _ in range(3))
    layer = MultiHeadAttention(num_heads=args.heads)
    layer.build((None, None, args.heads * args.head_dim))
    fused = time_step(make_step(layer, True, q, k, v), args.repeats)
    chosen_blocks = attention.causal_query_blocks(args.length, args.length)
    timings = {}
    for blocks in (1, 4):  # The explicit path unsplit, and in 4 causal query blocks.
        attention.causal_query_blocks = lambda query_length, key_length, blocks=blocks: blocks
        timings[blocks] = time_step(make_step(layer, False, q, k, v), args.repeats)
    layer.fused_attention = None
    chosen = "fused" if attention._fused_attention_is_faster() else f"explicit in {chosen_blocks} block(s)"
    print(
        f"{keras.backend.backend():10s} B{args.batch}/T{args.length}/H{args.heads}/D{args.head_dim} "
        f"causal fwd+bwd: fused {fused:.2f} ms, explicit {timings[1]:.2f} ms, explicit in 4 causal blocks "
        f"{timings[4]:.2f} ms; explicit/fused {timings[1] / fused:.2f}x, blocks/explicit "
        f"{timings[4] / timings[1]:.2f}x; auto chooses {chosen}"
    )


if __name__ == "__main__":
    main()

"""Training throughput: kerasformer's GPT vs KerasHub's GPT2CausalLM, same config, same run.

4 layers, width 256, 4 heads, context 128, batch 16, vocabulary 8192, fp32,
AdamW, `fit` compiled as `kerasformer train` does it (XLA on TF and JAX, eager
torch) for both models, each with its library's training loss and AdamW
(`kerasformer.optimizers.AdamW`, which `kerasformer train` uses, and
`keras.optimizers.AdamW`; the same arithmetic, fused into one kernel on torch). Both models
run in one process, with the allocator `kerasformer train` sets
(kerasformer/allocator.py; `--allocator system` keeps glibc's default).

Times alternating rounds of both models and prints the best training tokens/s
of each, their ratio, and the model-FLOPs utilization: tokens/s x FLOPs/token
(6N + 12 L T d, as nanoGPT counts) over this machine's measured fp32 matmul
rate: the best of numpy's and each installed framework's own 2048 x 2048
matmul (all are printed).

    python benchmarks/train_throughput.py --all [--allocator system]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import run_per_backend  # noqa: E402

CONFIG = dict(vocab_size=8192, num_layers=4, num_heads=4, hidden_dim=256, length=128, batch=16)


def matmul_rate(matmul, size=2048, repeats=5, convert=lambda a: a, wait=lambda c: c):
    """fp32 FLOP/s of `matmul` on two (size, size) matrices, the best of a few runs.

    `convert` turns the numpy input into the framework's tensor once, outside
    the timing; `wait` blocks until an asynchronous result is ready.
    """
    import numpy as np

    a = convert(np.random.rand(size, size).astype("float32"))
    best = 0.0
    for _ in range(repeats + 1):  # The first call may compile.
        start = time.perf_counter()
        wait(matmul(a, a))
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def machine_matmul_rates(repeats=5):
    """fp32 matmul FLOP/s of numpy and of each installed framework, natively.

    The machine's rate is the best of them: on some CPUs one framework's
    kernels run far above numpy's BLAS (seen: 466 vs 268 GFLOP/s with
    AVX-512), and an MFU over the slower one would flatter the model.
    """
    import numpy as np

    rates = {"numpy": matmul_rate(np.matmul, repeats=repeats)}
    try:
        import tensorflow as tf

        with tf.device("CPU:0"):
            rates["tensorflow"] = matmul_rate(tf.linalg.matmul, repeats=repeats, convert=tf.constant, wait=np.asarray)
    except ImportError:
        pass
    try:
        import jax

        rates["jax"] = matmul_rate(
            jax.jit(jax.numpy.matmul), repeats=repeats, convert=jax.numpy.asarray, wait=jax.block_until_ready
        )
    except ImportError:
        pass
    try:
        import torch

        rates["torch"] = matmul_rate(torch.matmul, repeats=repeats, convert=torch.from_numpy)
    except ImportError:
        pass
    return rates


def compile_and_warm_up(model, batches, loss, optimizer):
    """Compiles `fit` as `kerasformer train` does and runs a few steps (tracing, XLA)."""
    from kerasformer.train import resolve_jit_compile

    jit_compile = resolve_jit_compile("auto")  # XLA on TF and JAX for both models.
    # No metrics for either model, as `kerasformer train gpt` compiles:
    # KerasHub's `CausalLM.compile` would add a token accuracy by default
    # (an argmax over the (B, T, V) logits every step, ~15 ms on TF).
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=[], jit_compile=jit_compile)
    model.fit(batches, epochs=1, steps_per_epoch=3, verbose=0)


def tokens_per_second(model, batches, steps):
    """Training tokens/s of one timed `fit` of `steps` steps."""
    start = time.perf_counter()
    model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
    return steps * CONFIG["batch"] * CONFIG["length"] / (time.perf_counter() - start)


def keras_hub_batches(inputs, labels):
    """KerasHub's input path: its tasks turn any input into a tf.data pipeline.

    Without tf.data's autotuner, which stalled half of all processes by ~0.3 s
    per step on 2 cores (see `kerasformer.data.default_workers`).
    """
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(CONFIG["batch"]).repeat()
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per model; the best counts")
    parser.add_argument("--allocator", default="reuse", help="reuse (as `kerasformer train`) or system, for both models")
    args = parser.parse_args()
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)

    import numpy as np

    from kerasformer.allocator import set_allocator

    set_allocator(args.allocator)  # Before the frameworks' threads allocate.

    # Before any model runs: the frameworks' idle worker threads slow numpy down.
    machine = matmul_rate(np.matmul)  # numpy's BLAS: the machine's fp32 matmul rate.

    import keras
    import keras_hub

    from kerasformer.data import ArrayBatches
    from kerasformer.losses import TokenCrossEntropy
    from kerasformer.models import GPT
    from kerasformer.optimizers import AdamW

    c = CONFIG
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, c["vocab_size"], (c["batch"] * args.steps, c["length"] + 1)).astype("int32")
    x, y = tokens[:, :-1], tokens[:, 1:]

    ours = GPT(c["vocab_size"], c["num_layers"], c["num_heads"], c["hidden_dim"], max_sequence_length=c["length"])
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=c["vocab_size"], num_layers=c["num_layers"], num_heads=c["num_heads"],
        hidden_dim=c["hidden_dim"], intermediate_dim=4 * c["hidden_dim"], max_sequence_length=c["length"], dropout=0.0,
    )
    theirs = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    # Each library's input path, both free of tf.data's autotune stall:
    # `kerasformer train`'s batches, and a tf.data pipeline for KerasHub.
    ours_batches = ArrayBatches(x, y, batch_size=c["batch"], steps=args.steps)
    their_batches = keras_hub_batches({"token_ids": x, "padding_mask": np.ones_like(x, bool)}, y)
    # Each library's own training loss: what `kerasformer train` and
    # `GPT2CausalLM.compile()` use (the values are equal; see losses.py);
    # and its AdamW (the same arithmetic; see optimizers.py).
    compile_and_warm_up(ours, ours_batches, TokenCrossEntropy(), AdamW(1e-4))
    compile_and_warm_up(
        theirs, their_batches, keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.optimizers.AdamW(1e-4)
    )
    # Alternating rounds, best of each: a background hiccup in one round
    # cannot decide the ratio. The machine's rate drifts with its neighbours'
    # load: it is measured again after every round and at the end, and the
    # best figure counts, so a slow moment cannot inflate the MFU.
    ours_rate = theirs_rate = 0.0
    for _ in range(args.rounds):
        ours_rate = max(ours_rate, tokens_per_second(ours, ours_batches, args.steps))
        theirs_rate = max(theirs_rate, tokens_per_second(theirs, their_batches, args.steps))
        machine = max(machine, matmul_rate(np.matmul))

    non_position_params = ours.count_params() - c["length"] * c["hidden_dim"]
    flops_per_token = 6 * non_position_params + 12 * c["num_layers"] * c["length"] * c["hidden_dim"]
    rates = machine_matmul_rates(repeats=10)
    rates["numpy"] = max(machine, rates["numpy"])
    best = max(rates, key=rates.get)
    achieved = ours_rate * flops_per_token
    print(
        f"{keras.backend.backend():10s} allocator {args.allocator} | kerasformer {ours_rate:8.0f} tok/s | KerasHub {theirs_rate:8.0f} tok/s | "
        f"ratio {ours_rate / theirs_rate:4.2f}x | {achieved / 1e9:.0f} GFLOP/s = MFU {achieved / rates[best]:5.1%} of the "
        f"machine's best measured fp32 matmul ({best}, {rates[best] / 1e9:.0f} GFLOP/s; "
        + ", ".join(f"{name} {rate / 1e9:.0f}" for name, rate in rates.items())
        + ")",
        flush=True,
    )


if __name__ == "__main__":
    main()

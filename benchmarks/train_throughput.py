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
matmul, measured again after every round (all are printed).

It also prints the matmul ceiling of that MFU: every matmul of one training
step (forward, input and kernel gradients, the attention core's batched
products), each timed alone as a plain product of its shape with the
backend's own compiled matmul, summed. A step whose matmuls run at their
standalone speed takes at least that long; the rest of the step is
everything else (norms, activations, softmax, loss, optimizer, layout copies)
and the matmuls' own slowdown inside the step (transposed operands, caches).
On 2 Zen 5 cores the ceiling came out at 81-86% MFU, and the steps spent
77-148 ms beyond their ~190-200 ms of matmuls.

Both models read the same batches through the same input path,
`kerasformer.data.ArrayBatches` (a `PyDataset`), read by `keras.Model.fit`,
so that the ratio compares training steps, not input pipelines.

On TF, KerasHub's speed varies between processes far more than ours: on 2
Zen 5 cores, 3119-6101 tok/s in four processes of the same code, while ours
ran 5471-7026 in processes interleaved with them. This happened with this
input path and with a tf.data pipeline, so it is not the input. Its slow
processes coincided with our slower ones: KerasHub loses more when the
machine slows. The ratio is then up to 1.9x instead of 1.03-1.15x. Compare
ratios from several runs.

    python benchmarks/train_throughput.py --all [--allocator system]

On a GPU the same script measures a published size in bf16 against the
accelerator's stated peak (a measured matmul rate is printed beside it):

    KERAS_BACKEND=jax python benchmarks/train_throughput.py --preset gpt2-small \
        --precision bf16 --batch 16 --peak-tflops 989      # an H200's dense bf16

`benchmarks/gpu_bf16.sh` runs that for JAX and torch. Without KerasHub
installed (it needs TensorFlow for its tokenizers, though not for its
models) only kerasformer is timed.
"""

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from common import run_per_backend  # noqa: E402

CONFIG = dict(vocab_size=8192, num_layers=4, num_heads=4, hidden_dim=256, length=128, batch=16)


def benchmark_config(preset=None, batch=None, length=None):
    """`CONFIG`, or the architecture of the GPT preset `preset`; `batch` and `length` override.

    A preset's context is its `max_sequence_length` unless `length` is given.
    """
    c = dict(CONFIG)
    if preset is not None:
        from kerasformer.models import GPT
        from kerasformer.models.presets import PRESETS

        gpt_presets = sorted(name for name, (builder, _) in PRESETS.items() if builder is GPT)
        if preset not in gpt_presets:
            raise ValueError(f"`--preset` must be a GPT preset, one of {gpt_presets}; got {preset!r}.")
        arguments = PRESETS[preset][1]
        c.update({key: arguments[key] for key in ("vocab_size", "num_layers", "num_heads", "hidden_dim")})
        c["length"] = arguments["max_sequence_length"]
    for key, value in (("batch", batch), ("length", length)):
        if value is not None:
            if value < 1:
                raise ValueError(f"`--{key}` must be a positive integer, got {value}.")
            c[key] = value
    return c


def matmul_rate(matmul, size=2048, repeats=5, convert=lambda a: a, wait=lambda c: c, products=1):
    """FLOP/s of `matmul` on two (size, size) matrices, the best of a few runs.

    `convert` turns the numpy input into the framework's tensor once, outside
    the timing; `wait` blocks until an asynchronous result is ready. Each
    run queues `products` products before it waits (on a GPU one product
    is shorter than its launch and synchronization).
    """
    a = convert(np.random.rand(size, size).astype("float32"))
    wait(matmul(a, a))  # The first call may compile.
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(products):
            c = matmul(a, a)
        wait(c)
        best = max(best, products * 2 * size**3 / (time.perf_counter() - start))
    return best


def machine_matmul_rates(repeats=5):
    """fp32 matmul FLOP/s of numpy and of each installed framework, natively.

    The machine's rate is the best of them: on some CPUs one framework's
    kernels run far above numpy's BLAS (seen: 466 vs 268 GFLOP/s with
    AVX-512), and an MFU over the slower one would flatter the model.
    """
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


def accelerator_matmul_rate(dtype, size=8192):
    """FLOP/s of the backend's own `size`^2 matmul in `dtype` on its default device (a GPU)."""
    import keras
    from keras import ops

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        matmul, wait = jax.jit(jax.numpy.matmul), jax.block_until_ready
    elif backend == "tensorflow":
        import tensorflow as tf

        matmul, wait = tf.function(tf.linalg.matmul, jit_compile=True), lambda c: c[0, 0].numpy()
    else:
        import torch

        matmul, wait = torch.matmul, lambda c: torch.cuda.synchronize() if c.is_cuda else c
    convert = lambda a: ops.cast(ops.convert_to_tensor(a), dtype)  # noqa: E731
    return matmul_rate(matmul, size, repeats=3, convert=convert, wait=wait, products=10)


def step_matmuls(c):
    """`(count, batch, m, k, n)` of every matmul in one training step of the GPT of config `c`.

    Their FLOPs sum to the MFU's count, 6N + 12 L T d per token, less the
    params outside matmuls (norms, biases). Attention counts its full
    (T, T) products, as that formula does.
    """
    tokens, width, layers = c["batch"] * c["length"], c["hidden_dim"], c["num_layers"]
    heads, length, head_dim = c["batch"] * c["num_heads"], c["length"], c["hidden_dim"] // c["num_heads"]
    shapes = []
    # q/k/v together, attention output, FFN up and down; then the tied head.
    projections = [(width, 3 * width, layers), (width, width, layers), (width, 4 * width, layers)]
    projections += [(4 * width, width, layers), (width, c["vocab_size"], 1)]
    for fan_in, fan_out, count in projections:
        shapes += [
            (count, 1, tokens, fan_in, fan_out),  # forward
            (count, 1, tokens, fan_out, fan_in),  # input gradient
            (count, 1, fan_in, tokens, fan_out),  # kernel gradient
        ]
    shapes += [
        (layers, heads, length, head_dim, length),  # scores q k^T
        (layers, heads, length, length, head_dim),  # probabilities @ v
        (layers, heads, length, head_dim, length),  # probabilities' gradient
        (3 * layers, heads, length, length, head_dim),  # gradients of v, q and k
    ]
    return shapes


def step_matmul_seconds(shapes, repeats=5, calls=4):
    """Seconds of the matmuls `shapes` (see `step_matmuls`), each timed alone, summed; and their FLOPs.

    Each shape runs as a plain `a (batch, m, k) @ b (batch, k, n)` through
    the backend's own product: XLA on TF and JAX; on torch the oneDNN path
    of `kerasformer.layers.linear` for 2-D products, as the model's
    projections take, and `torch.matmul` for batched ones. A product's time
    is that of one compiled call of `calls + 1` chained products less that
    of a call of one, best of `repeats`: the difference leaves out the
    call's own cost from Python (~0.35 ms for a TF function), which the
    compiled training step does not pay per matmul. Each product of the
    chain writes one element of its smaller operand for the next (the copy
    it may cost is the smaller one), so XLA can neither merge nor overlap
    them.
    """
    import math

    import keras
    from keras import ops

    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    matmul, convert, wait = ops.matmul, ops.convert_to_tensor, ops.convert_to_numpy
    if backend == "tensorflow":
        import tensorflow as tf

        compile_xla = functools.partial(tf.function, jit_compile=True)
    elif backend == "jax":
        import jax

        compile_xla, wait = jax.jit, jax.block_until_ready
    else:  # Eager torch: nothing merges the products.
        import torch

        from kerasformer.layers.linear import linear

        compile_xla, wait = None, lambda t: t

        def matmul(a, b):
            return linear(a, b) if a.ndim == 2 else torch.matmul(a, b)

    def written(x, out):  # x with its first element made to depend on `out`
        return ops.slice_update(x, [0] * len(x.shape), x[..., :1, :1] + out[..., :1, :1] * 0.0)

    def chain(length):
        def products(a, b):
            for _ in range(length):
                out = matmul(a, b)
                if compile_xla is not None:
                    if math.prod(a.shape) <= math.prod(b.shape):
                        a = written(a, out)
                    else:
                        b = written(b, out)
            return out[..., 0, 0]

        return products if compile_xla is None else compile_xla(products)

    def best_seconds(function, a, b):
        wait(function(a, b))  # compiles
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            wait(function(a, b))
            best = min(best, time.perf_counter() - start)
        return best

    one, many = chain(1), chain(calls + 1)
    total_seconds = total_flops = 0.0
    for count, batch, m, k, n in shapes:
        lead = () if batch == 1 else (batch,)
        a = convert(rng.standard_normal((*lead, m, k)).astype("float32"))
        b = convert(rng.standard_normal((*lead, k, n)).astype("float32"))
        seconds = (best_seconds(many, a, b) - best_seconds(one, a, b)) / calls
        total_seconds += count * max(seconds, 0.0)
        total_flops += count * 2 * batch * m * k * n
    return total_seconds, total_flops


def fit(model, batches, steps):
    """`keras.Model.fit` for one epoch of `steps` steps, for either model.

    KerasHub's tasks override `fit` only to turn any input into a tf.data (or
    grain) pipeline for their preprocessor; with `preprocessor=None` Keras's
    own `fit` runs the same training step on the `PyDataset` both models read.
    """
    import keras

    keras.Model.fit(model, batches, epochs=1, steps_per_epoch=steps, verbose=0)


def compile_and_warm_up(model, batches, loss, optimizer, jit_compile="auto"):
    """Compiles `fit` as `kerasformer train --jit-compile` does and runs a few steps (tracing, XLA)."""
    from kerasformer.train import resolve_jit_compile

    jit_compile = resolve_jit_compile(jit_compile)  # "auto": XLA on TF and JAX for both models.
    # No metrics for either model, as `kerasformer train gpt` compiles:
    # KerasHub's `CausalLM.compile` would add a token accuracy by default
    # (an argmax over the (B, T, V) logits every step, ~15 ms on TF).
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=[], jit_compile=jit_compile)
    fit(model, batches, steps=3)


def tokens_per_second(model, batches, steps, c):
    """Training tokens/s of one timed `fit` of `steps` steps of config `c`."""
    import keras

    # Reading one small variable back waits for every queued step (a GPU's
    # stream, JAX's asynchronous dispatch): all steps then lie in the timing.
    smallest = min(model.trainable_variables, key=lambda v: int(np.prod(v.shape)))
    start = time.perf_counter()
    fit(model, batches, steps)
    keras.ops.convert_to_numpy(smallest.value)
    return steps * c["batch"] * c["length"] / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per model; the best counts")
    parser.add_argument("--allocator", default="reuse", help="reuse (as `kerasformer train`) or system, for both models")
    parser.add_argument("--preset", help="a GPT preset's architecture (e.g. gpt2-small) instead of the small config")
    parser.add_argument("--batch", type=int, help=f"sequences per step (default {CONFIG['batch']})")
    parser.add_argument("--length", type=int, help="tokens per sequence (default: the config's context)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: mixed_bfloat16 for both models")
    parser.add_argument(
        "--jit-compile", choices=("auto", "true", "false"), default="auto",
        help="as `kerasformer train --jit-compile`, for both models (true on torch: torch.compile)",
    )
    parser.add_argument(
        "--peak-tflops", type=float,
        help="MFU over this stated peak (e.g. 989: an H200's dense bf16) instead of the measured fp32 CPU matmul rate",
    )
    args = parser.parse_args()
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error(f"--peak-tflops must be positive, got {args.peak_tflops}")
    from kerasformer.allocator import set_allocator

    set_allocator(args.allocator)  # Before the frameworks' threads allocate.
    c = benchmark_config(args.preset, args.batch, args.length)

    # Before any model runs: the frameworks' idle worker threads slow numpy down.
    machine = None if args.peak_tflops else matmul_rate(np.matmul)  # numpy's BLAS

    import keras

    try:
        import keras_hub
    except ImportError:  # e.g. a GPU machine without TensorFlow: kerasformer alone.
        keras_hub = None
        print("KerasHub is not installed: timing kerasformer alone, no ratio.", flush=True)

    from kerasformer.data import ArrayBatches
    from kerasformer.losses import TokenCrossEntropy
    from kerasformer.models import GPT
    from kerasformer.optimizers import AdamW

    if args.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")  # As `kerasformer train --precision bf16`.
    rng = np.random.default_rng(0)
    steps = max(args.steps, 3)  # The warm-up's 3 steps read batches too.
    tokens = rng.integers(1, c["vocab_size"], (c["batch"] * steps, c["length"] + 1)).astype("int32")
    x, y = tokens[:, :-1], tokens[:, 1:]

    ours = GPT(c["vocab_size"], c["num_layers"], c["num_heads"], c["hidden_dim"], max_sequence_length=c["length"])
    # One input path for both: `kerasformer train`'s batches (see the module docstring).
    ours_batches = ArrayBatches(x, y, batch_size=c["batch"], steps=steps)
    # Each library's own training loss: what `kerasformer train` and
    # `GPT2CausalLM.compile()` use (the values are equal; see losses.py);
    # and its AdamW (the same arithmetic; see optimizers.py).
    compile_and_warm_up(ours, ours_batches, TokenCrossEntropy(), AdamW(1e-4), args.jit_compile)
    theirs = None
    if keras_hub is not None:
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=c["vocab_size"], num_layers=c["num_layers"], num_heads=c["num_heads"],
            hidden_dim=c["hidden_dim"], intermediate_dim=4 * c["hidden_dim"], max_sequence_length=c["length"],
            dropout=0.0,
        )
        theirs = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        their_inputs = {"token_ids": x, "padding_mask": np.ones_like(x, bool)}
        their_batches = ArrayBatches(their_inputs, y, batch_size=c["batch"], steps=steps)
        compile_and_warm_up(
            theirs, their_batches, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            keras.optimizers.AdamW(1e-4), args.jit_compile,
        )
    # Alternating rounds, best of each: a background hiccup in one round
    # cannot decide the ratio. The machine's rate drifts with its neighbours'
    # load: every framework's rate is measured again after every round, and
    # each one's best figure counts, so a slow moment cannot inflate the MFU.
    ours_rate = theirs_rate = 0.0
    rates = {} if machine is None else {"numpy": machine}
    for _ in range(args.rounds):
        ours_rate = max(ours_rate, tokens_per_second(ours, ours_batches, args.steps, c))
        if theirs is not None:
            theirs_rate = max(theirs_rate, tokens_per_second(theirs, their_batches, args.steps, c))
        if machine is not None:
            for name, rate in machine_matmul_rates().items():
                rates[name] = max(rates.get(name, 0.0), rate)

    non_position_params = ours.count_params() - c["length"] * c["hidden_dim"]
    flops_per_token = 6 * non_position_params + 12 * c["num_layers"] * c["length"] * c["hidden_dim"]
    achieved = ours_rate * flops_per_token
    backend = keras.backend.backend()
    setting = f"{args.preset or 'small config'} B{c['batch']} T{c['length']} {args.precision}"
    if args.jit_compile != "auto":
        setting += f" jit_compile={args.jit_compile}"
    comparison = (
        f"KerasHub {theirs_rate:8.0f} tok/s | ratio {ours_rate / theirs_rate:4.2f}x" if theirs is not None
        else "KerasHub not run"
    )
    if args.peak_tflops:
        measured = accelerator_matmul_rate("bfloat16" if args.precision == "bf16" else "float32")
        print(
            f"{backend:10s} {setting} | kerasformer {ours_rate:8.0f} tok/s | {comparison} | "
            f"{achieved / 1e12:.3g} TFLOP/s = MFU {achieved / (args.peak_tflops * 1e12):5.1%} of the stated peak "
            f"{args.peak_tflops:g} TFLOP/s | {backend}'s own 8192^2 {args.precision} matmul here: "
            f"{measured / 1e12:.3g} TFLOP/s (MFU {achieved / measured:5.1%} of it)",
            flush=True,
        )
        return
    best = max(rates, key=rates.get)
    matmul_seconds, matmul_flops = step_matmul_seconds(step_matmuls(c))
    step_seconds = c["batch"] * c["length"] / ours_rate
    print(
        f"{backend:10s} {setting} allocator {args.allocator} | kerasformer {ours_rate:8.0f} tok/s | {comparison} | "
        f"{achieved / 1e9:.0f} GFLOP/s = MFU {achieved / rates[best]:5.1%} of the "
        f"machine's best measured fp32 matmul ({best}, {rates[best] / 1e9:.0f} GFLOP/s; "
        + ", ".join(f"{name} {rate / 1e9:.0f}" for name, rate in rates.items())
        + ")",
        flush=True,
    )
    print(
        f"{backend:10s} matmul ceiling | the step's {matmul_flops / 1e9:.1f} GFLOP of fp32 matmuls, each alone: "
        f"{matmul_seconds * 1e3:.0f} ms = {matmul_flops / matmul_seconds / 1e9:.0f} GFLOP/s, an MFU ceiling of "
        f"{flops_per_token * c['batch'] * c['length'] / matmul_seconds / rates[best]:5.1%} (the step in that time) | kerasformer's step {step_seconds * 1e3:.0f} ms, "
        f"{(step_seconds - matmul_seconds) * 1e3:.0f} ms beyond its matmuls",
        flush=True,
    )


if __name__ == "__main__":
    main()

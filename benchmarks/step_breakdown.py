"""Where a training step's time goes: matmuls, everything else, idle.

`train_throughput.py` prints how far the step lies beyond its matmuls timed
alone; this script says what fills that time, over a few steps of the same
GPT (its small config). On TF and JAX it profiles them with the framework's
own profiler, XLA's per-operation trace events turned on, and reads each
step's timeline:

    step        from one LM-head forward product to the next
    matmuls     wall time while any XLA dot (or a fusion around one) runs
    other only  wall time while other operations run and no dot does
    idle        wall time with no XLA operation running (dispatch, the host)

then the operations outside matmuls that took longest, named by the model
code that produced them (XLA's op_name metadata). Figures are medians over
the profiled steps.

Torch trains eagerly: each operator runs to its end before Python goes on,
so the time of each ATen operator, taken around its call (see
`torch_operator_seconds`), splits the step instead:

    step        wall time of a step whose operators are not timed
    matmuls     GEMM operators (mm, addmm, bmm, oneDNN's linear)
    attention   the fused attention core (SDPA's CPU kernels, forward and backward)
    other ops   every other operator
    host        the rest: Python between operators (Keras, autograd, the optimizer)

with the rate of the projections' matmuls (the step's FLOPs of them over
their time) and the other operators that took longest, by operator and
input shapes (means over the steps).

    KERAS_BACKEND=tensorflow python benchmarks/step_breakdown.py
    python benchmarks/step_breakdown.py --all

On 2 Zen 3 cores (TF 2.21, JAX 0.10.2, torch 2.13), one `--all` run:

    jax        step 637 ms = matmuls 449 + other only 119 + idle 56
    tensorflow step 504 ms = matmuls 434 + other only 61 + idle 8
    torch      step 593 ms = matmuls 444 + attention 42 + other ops 98 + host 9
               (the projections' matmuls at 145 GFLOP/s)

On torch GELU's forward and backward took 33 ms of that step (the tanh
form, GPT-2's: torch's exact-erf GELU ran 2.3x faster alone), and the loss's
log-softmax and softmax over the (2048, 8192) logits 24 ms.

JAX's idle time is ~1800 short gaps between the step's ~800 operations.
The machine's speed drifts by 10-20% from minute to minute, so compare runs
by their shares more than by their milliseconds. The list of operations is
what to work on: it showed the q/k/v gradient assembled from summed pads
(`split_columns` in `kerasformer/layers/attention.py`) as the costliest
operation outside matmuls on both backends.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# XLA reads its flags once, at its first compilation: set them before any.
_DUMP = tempfile.mkdtemp(prefix="step_breakdown_hlo_")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_cpu_enable_xprof_traceme=true --xla_dump_to={_DUMP} --xla_dump_hlo_as_text"
)

import numpy as np  # noqa: E402
from common import run_per_backend  # noqa: E402

# Events of the thunk executor itself, not of an XLA operation.
_NOT_OPERATIONS = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end:")


def read_hlo(dump_dir):
    """The optimized HLO text of the largest compiled train step in `dump_dir`."""
    files = [f for f in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")) if "step" in f]
    if not files:
        raise RuntimeError(f"XLA wrote no optimized train-step HLO to {dump_dir}.")
    return open(max(files, key=os.path.getsize)).read()


class Operations:
    """What the HLO says of each instruction name: a dot or not, its shape, its source op_name."""

    def __init__(self, hlo):
        fusion_calls = dict(re.findall(r"%(\S+) = \S+ fusion\(.*?calls=%(\S+),", hlo))
        bodies = {
            m.group(1).lstrip("%"): m.group(2)
            for m in re.finditer(r"\n(%?fused_computation[.\d]*) .*?\{(.*?)\n\}", hlo, re.S)
        }
        opcodes = dict(re.findall(r"%(\S+) = \S+ ([a-z\-]+)\(", hlo))
        self.shapes = dict(re.findall(r"%(\S+) = (\S+) ", hlo))
        self.sources = dict(re.findall(r"%(\S+) = .*?op_name=\"([^\"]+)\"", hlo))
        self.dots = {
            name for name, opcode in opcodes.items()
            if opcode == "dot" or " dot(" in bodies.get(fusion_calls.get(name, ""), "")
        }

    def head_forward(self, tokens, vocab_size, traced):
        """The traced dot that computes the (tokens, vocab) logits: one per step, the steps' boundary."""
        shape = f"f32[{tokens},{vocab_size}]"
        names = [n for n in self.dots & traced if self.shapes.get(n, "").startswith(shape)]
        forward = [n for n in names if "transpose(" not in self.sources.get(n, "")]
        if len(forward) != 1:
            raise RuntimeError(f"expected one LM-head forward product of shape {shape}, found {forward}.")
        return forward[0]

    def source(self, name):
        """The model code behind `name`, numbered copies folded together (block_3/AddN_11 -> block/AddN)."""
        source = re.sub(r"^jit\(train_step\)/", "", self.sources.get(name, name))
        return re.sub(r"(_\d+)+(?=/|\)|$)", "", source)[:90]


def read_events(profile_dir):
    """`(start_ps, duration_ps, name)` of every XLA operation in the profile, by start."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise RuntimeError(f"the profiler wrote no trace to {profile_dir}.")
    space = xplane_pb2.XSpace()
    with open(max(files, key=os.path.getmtime), "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if "Eigen" not in line.name:  # XLA's worker threads, where operations run.
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if name and not name.startswith(_NOT_OPERATIONS):
                    events.append((line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps, name))
    return sorted(events)


def covered(intervals):
    """Total length of the union of `(start, end)` intervals."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return total + (0 if current_end is None else current_end - current_start)


def breakdown(events, operations, anchor, top=12):
    """Per-step medians (ms) of step, matmuls, other only, idle; and the longest other operations."""
    starts = [start for start, _, name in events if name == anchor]
    if len(starts) < 3:
        raise RuntimeError(f"the trace holds {len(starts)} steps; profile more.")
    rows, others = [], collections.Counter()
    steps = list(zip(starts[:-1], starts[1:]))
    for step_start, step_end in steps:
        inside = [(s, s + d, n) for s, d, n in events if step_start <= s < step_end]
        dots = [(s, e) for s, e, n in inside if n in operations.dots]
        busy = covered([(s, e) for s, e, _ in inside])
        dot_time = covered(dots)
        rows.append([step_end - step_start, dot_time, busy - dot_time, step_end - step_start - busy])
        for s, e, name in inside:
            if name not in operations.dots:  # Its time with no dot running beside it.
                overlap = sum(min(e, de) - max(s, ds) for ds, de in dots if de > s and ds < e)
                others[(operations.source(name), operations.shapes.get(name, ""))] += e - s - overlap
    medians = [statistics.median(column) / 1e9 for column in zip(*rows)]
    longest = [(ps / len(steps) / 1e9, source, shape) for (source, shape), ps in others.most_common(top)]
    return medians, longest


def profile_steps(backend, model, batches, steps, profile_dir):
    """Runs `steps` training steps of `model` under the backend's profiler."""
    from train_throughput import fit

    if backend == "jax":
        import jax

        with jax.profiler.trace(profile_dir):
            fit(model, batches, steps)
    else:
        import tensorflow as tf

        tf.profiler.experimental.start(profile_dir)
        try:
            fit(model, batches, steps)
        finally:
            tf.profiler.experimental.stop()


# Operators that are one GEMM each, and the fused attention core's kernels (by substring).
_TORCH_MATMULS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "mkldnn._linear_pointwise")
_TORCH_ATTENTION = "scaled_dot_product"


def torch_operator_seconds(function):
    """Runs `function()` and returns seconds per `(operator, input shapes)` spent in torch's kernels.

    Each ATen operator is timed from Python through a dispatch mode (eager CPU
    operators run to their end before they return), beneath autograd, so that
    backward kernels and the optimizer's count too. `torch.profiler` was not
    used: it slowed some kernels themselves (the loss's softmax over the
    (2048, 8192) logits: 12 ms unprofiled, 25-38 ms profiled).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seconds = collections.Counter()

    def shapes(args):  # of the first two tensor arguments; a list of tensors as its length
        described = [
            tuple(a.shape) if isinstance(a, torch.Tensor) else f"{len(a)} tensors"
            for a in args
            if isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor))
        ]
        return str(described[:2])

    class Timing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            seconds[(str(func.overloadpacket), shapes(args))] += time.perf_counter() - start
            return out

    with Timing():
        function()
    return seconds


def torch_breakdown(model, batches, steps, c, top=12):
    """Per-step means (ms): the step, time by kind of operator; the projections' matmul rate; the longest others."""
    from train_throughput import fit, step_matmuls

    start = time.perf_counter()
    fit(model, batches, steps)
    step = (time.perf_counter() - start) / steps * 1e3  # ms, untimed operators
    totals, others = collections.Counter(), collections.Counter()
    for (name, shapes), seconds in torch_operator_seconds(lambda: fit(model, batches, steps)).items():
        ms = seconds * 1e3 / steps
        kind = "matmuls" if name in _TORCH_MATMULS else "attention" if _TORCH_ATTENTION in name else "other ops"
        totals[kind] += ms
        if kind == "other ops":
            others[(name, shapes)] += ms
    totals["host"] = max(step - sum(totals.values()), 0.0)
    flops = sum(count * 2 * b * m * k * n for count, b, m, k, n in step_matmuls(c) if b == 1)  # the projections
    return step, totals, flops / (totals["matmuls"] / 1e3), others.most_common(top)


def print_torch_breakdown(model, batches, steps, c):
    step, totals, matmul_rate, longest = torch_breakdown(model, batches, steps, c)
    print(
        f"torch      small config B{c['batch']} T{c['length']} fp32 | step {step:.0f} ms = "
        + " + ".join(f"{kind} {totals[kind]:.0f} ms ({totals[kind] / step:.0%})"
                     for kind in ("matmuls", "attention", "other ops", "host"))
        + f", means of {steps} steps | projections' matmuls at {matmul_rate / 1e9:.0f} GFLOP/s",
        flush=True,
    )
    print("torch      longest operators outside matmuls and attention, ms per step:", flush=True)
    for (name, shapes), ms in longest:
        print(f"torch        {ms:5.1f}  {name}  {shapes}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend, each in its own process")
    parser.add_argument("--steps", type=int, default=8, help="profiled training steps")
    args = parser.parse_args()
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)
    if args.steps < 3:
        parser.error(f"--steps must be at least 3 (steps lie between LM-head products), got {args.steps}")

    import keras

    backend = keras.backend.backend()
    from train_throughput import CONFIG, compile_and_warm_up

    from kerasformer.allocator import set_allocator
    from kerasformer.data import ArrayBatches
    from kerasformer.losses import TokenCrossEntropy
    from kerasformer.models import GPT
    from kerasformer.optimizers import AdamW

    set_allocator("reuse")  # As `kerasformer train` and the throughput benchmark.
    c = dict(CONFIG)
    steps = args.steps + 3  # The warm-up's 3 steps read batches too.
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, c["vocab_size"], (c["batch"] * steps, c["length"] + 1)).astype("int32")
    model = GPT(c["vocab_size"], c["num_layers"], c["num_heads"], c["hidden_dim"], max_sequence_length=c["length"])
    batches = ArrayBatches(tokens[:, :-1], tokens[:, 1:], batch_size=c["batch"], steps=steps)
    compile_and_warm_up(model, batches, TokenCrossEntropy(), AdamW(1e-4))
    if backend == "torch":
        shutil.rmtree(_DUMP, ignore_errors=True)  # No XLA here.
        print_torch_breakdown(model, batches, args.steps, c)
        return

    with tempfile.TemporaryDirectory(prefix="step_breakdown_trace_") as profile_dir:
        profile_steps(backend, model, batches, args.steps, profile_dir)
        events = read_events(profile_dir)
    operations = Operations(read_hlo(_DUMP))
    shutil.rmtree(_DUMP, ignore_errors=True)
    anchor = operations.head_forward(c["batch"] * c["length"], c["vocab_size"], {name for _, _, name in events})
    (step, dots, other, idle), longest = breakdown(events, operations, anchor)
    print(
        f"{backend:10s} small config B{c['batch']} T{c['length']} fp32 | step {step:.0f} ms = matmuls {dots:.0f} ms "
        f"({dots / step:.0%}) + other only {other:.0f} ms ({other / step:.0%}) + idle {idle:.0f} ms "
        f"({idle / step:.0%}), medians of {args.steps - 1} profiled steps",
        flush=True,
    )
    print(f"{backend:10s} longest operations outside matmuls, ms per step:", flush=True)
    for ms, source, shape in longest:
        print(f"{backend:10s}   {ms:5.1f}  {source}  {shape}", flush=True)


if __name__ == "__main__":
    main()

"""One AdamW update of the throughput benchmark's GPT: kerasformer's vs Keras's, same run.

The variables of `benchmarks/train_throughput.py`'s model (5.3M parameters),
decay on matrices only, global norm clipping as `kerasformer train` sets it.
Alternating rounds, the best (least disturbed) time of each counts. Only
torch differs: there `kerasformer.optimizers.AdamW` runs torch's fused AdamW
kernel; on TensorFlow and JAX both are the same Keras code, run eagerly here
(inside `fit`, XLA fuses either).

    python benchmarks/optimizer_step.py --all
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import run_per_backend  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend")
    parser.add_argument("--updates", type=int, default=10, help="updates per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)

    from kerasformer.allocator import set_allocator

    set_allocator("reuse")  # As `kerasformer train` does.
    import keras
    import numpy as np

    from kerasformer.models import GPT
    from kerasformer.optimizers import AdamW

    def make(optimizer_class):
        model = GPT(8192, 4, 4, 256, max_sequence_length=128)
        variables = model.trainable_variables
        optimizer = optimizer_class(1e-4, weight_decay=0.1, epsilon=1e-8, global_clipnorm=1.0)
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
        optimizer.build(variables)
        rng = np.random.default_rng(0)
        grads = [keras.ops.convert_to_tensor(rng.normal(size=v.shape).astype("float32")) for v in variables]
        return optimizer, grads, variables

    def milliseconds(optimizer, grads, variables):
        start = time.perf_counter()
        for _ in range(args.updates):
            optimizer.apply(grads, variables)
        keras.ops.convert_to_numpy(variables[0])  # Waits for asynchronous backends.
        return (time.perf_counter() - start) / args.updates * 1e3

    ours, keras_ = make(AdamW), make(keras.optimizers.AdamW)
    milliseconds(*ours), milliseconds(*keras_)  # Warm-up.
    best_ours = best_keras = float("inf")
    for _ in range(args.rounds):
        best_ours = min(best_ours, milliseconds(*ours))
        best_keras = min(best_keras, milliseconds(*keras_))
    parameters = sum(int(np.prod(v.shape)) for v in ours[2])
    print(
        f"{keras.backend.backend():10s} AdamW update of {parameters / 1e6:.1f}M parameters | kerasformer {best_ours:7.1f} ms | "
        f"keras.optimizers.AdamW {best_keras:7.1f} ms | ratio {best_keras / best_ours:4.2f}x faster",
        flush=True,
    )


if __name__ == "__main__":
    main()

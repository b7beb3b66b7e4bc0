"""Character-level Shakespeare with nanoGPT's CPU settings: validation loss and wall time.

4 layers, 4 heads, width 128, context 64, batch 12, 2000 steps, lr 1e-3
cosine to 1e-4 after 100 warm-up steps, AdamW betas (0.9, 0.99), weight
decay 0.1, dropout 0, no biases in the projections, first 90% of tinyshakespeare.txt for training and the
last 10% for validation. nanoGPT reports a validation loss of 1.88 for this
run; the script prints ours side by side, per backend.

    python benchmarks/shakespeare_char.py --all [--data ../shared/data/tinyshakespeare.txt]
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import run_per_backend  # noqa: E402

NANOGPT_VAL_LOSS = 1.88
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "tinyshakespeare.txt")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend")
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--validation-batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="initialization and batch order")
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        sys.exit(f"No data at {args.data}; pass --data path/to/tinyshakespeare.txt")
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)

    import keras

    from kerasformer.train import TrainConfig, train

    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(
            task="gpt", preset="gpt2-tiny", data=args.data, tokenizer="char", run_dir=run_dir,
            steps=args.steps, checkpoint_every=args.steps // 4, batch_size=12, sequence_length=64,
            learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=100, weight_decay=0.1,
            beta_1=0.9, beta_2=0.99, dropout=0.0, validation_steps=args.validation_batches, seed=args.seed,
            # nanoGPT's model for this run: no biases in the projections.
            overrides=dict(num_layers=4, num_heads=4, hidden_dim=128, use_bias=False),
        )
        start = time.perf_counter()
        results = train(config)
        seconds = time.perf_counter() - start
    loss = results["val_loss"]
    verdict = "meets" if loss <= NANOGPT_VAL_LOSS else "misses"
    print(
        f"{keras.backend.backend():10s} val loss {loss:.4f} vs nanoGPT {NANOGPT_VAL_LOSS} "
        f"(ratio {loss / NANOGPT_VAL_LOSS:.3f}, {verdict} the target), {args.steps} steps in {seconds:.0f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()

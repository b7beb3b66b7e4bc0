"""T5 and the original Transformer on a generated translation task: digits to English words.

    python examples/train_translation.py [--steps 1000] [--models t5 transformer]

"3 4 2" -> "three hundred forty two". Reports exact-match accuracy of greedy
decoding on held-out numbers, then translates one.
"""

import argparse

from kerasformer.cli import generate_text
from kerasformer.train import TrainConfig, train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--checkpoint-every", type=int, default=250)
parser.add_argument("--models", nargs="+", default=["t5", "transformer"])
args = parser.parse_args()

for task in args.models:
    run_dir = f"runs/translation_{task}"
    results = train(TrainConfig(task=task, run_dir=run_dir, steps=args.steps, checkpoint_every=args.checkpoint_every,
                                batch_size=32, sequence_length=16, learning_rate=2e-3, warmup_steps=min(100, args.steps // 2),
                                dropout=0.0))
    print(f"{task}: exact match {results['exact_match']:.3f};", "7 0 4 1 ->", generate_text(run_dir, "7 0 4 1", max_new_tokens=12))

"""BERT masked-language-model pre-training on a generated language (15% masking, 80/10/10).

    python examples/train_bert_mlm.py [--steps 1000]

Prints the masked-token accuracy on held-out sentences, then fills a mask.
"""

import argparse

import numpy as np

from kerasformer import data
from kerasformer.train import TrainConfig, load_run, train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--checkpoint-every", type=int, default=250)
parser.add_argument("--run-dir", default="runs/bert_mlm")
args = parser.parse_args()

train(TrainConfig(task="bert", run_dir=args.run_dir, steps=args.steps, checkpoint_every=args.checkpoint_every,
                  batch_size=32, sequence_length=24, learning_rate=2e-3, warmup_steps=min(100, args.steps // 2)))

model, tokenizer, _ = load_run(args.run_dir)
cls, sep, mask = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))
before, after = data.encode(tokenizer, "the small cats"), data.encode(tokenizer, "a dog .")
ids = np.array([[cls, *before, mask, *after, sep]])
logits = model.predict({"token_ids": ids, "segment_ids": np.zeros_like(ids)}, verbose=0)
guess = data.decode(tokenizer, [int(np.argmax(logits[0, len(before) + 1]))])
print("the small cats [MASK] a dog . ->", guess)

"""Character-level GPT on Shakespeare, with nanoGPT's CPU settings.

    python examples/train_gpt_shakespeare.py --data ../shared/data/tinyshakespeare.txt [--architecture llama]

4 layers, 4 heads, width 128, context 64, batch 12, lr 1e-3 cosine to 1e-4
after 100 warm-up steps, AdamW (0.9, 0.99), weight decay 0.1, no dropout,
90/10 split. 2000 steps take a few minutes on 2 CPU cores and reach a
validation loss near 1.89 with GPT-2's architecture (nanoGPT's model), or
near 1.67 with LLaMA's blocks (rotary positions, RMSNorm, SwiGLU) at the
same parameter count; then it writes a sample.
"""

import argparse

from kerasformer.cli import generate_text
from kerasformer.train import TrainConfig, train

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--checkpoint-every", type=int, default=250)
parser.add_argument("--run-dir", default="runs/shakespeare")
parser.add_argument("--architecture", choices=["gpt2", "llama"], default="gpt2")
args = parser.parse_args()

config = TrainConfig(
    task="gpt", preset="gpt2-tiny", data=args.data, tokenizer="char", run_dir=args.run_dir,
    steps=args.steps, checkpoint_every=args.checkpoint_every, batch_size=12, sequence_length=64,
    learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=min(100, args.steps // 2),
    weight_decay=0.1, beta_1=0.9, beta_2=0.99, dropout=0.0,
    overrides=dict(
        num_layers=4, num_heads=4, hidden_dim=128, use_bias=False,
        # SwiGLU's three matrices at 344 ~ two of GPT-2's MLP at 4 x 128.
        **(dict(position_type="rotary", norm_type="rms_norm", activation="swiglu", intermediate_dim=344)
           if args.architecture == "llama" else {}),
    ),
)
train(config)
# 500 characters, as nanoGPT samples: past its 64 positions the context slides (see `generate`).
print(generate_text(args.run_dir, "ROMEO:", max_new_tokens=500, temperature=0.8, top_k=20, seed=0))

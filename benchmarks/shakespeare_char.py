"""Character-level Shakespeare with nanoGPT's CPU settings: validation loss and wall time.

4 layers, 4 heads, width 128, context 64, batch 12, 2000 steps, lr 1e-3
cosine to 1e-4 after 100 warm-up steps, AdamW betas (0.9, 0.99), weight
decay 0.1, dropout 0, no biases, first 90% of tinyshakespeare.txt for
training and the last 10% for validation. nanoGPT reports a validation loss
of 1.88 for this run (one run, measured on 20 batches).

Two architectures of the kerasformer GPT, each with the same settings:
- `gpt2`: nanoGPT's model (GPT-2: learned positions, LayerNorm, GELU MLP);
- `llama`: `GPT(position_type="rotary", norm_type="rms_norm",
  activation="swiglu", intermediate_dim=344)`, LLaMA's blocks at the same
  parameter count (a SwiGLU of 3 x 128 x 344 ~ GPT-2's MLP of 2 x 128 x 512).

The peer of each, in the same run: `transformers`' `GPT2LMHeadModel` or
`LlamaForCausalLM` at the same sizes in torch, trained by nanoGPT's loop (its
learning-rate function, torch AdamW with decay on matrices, gradient clipping
at 1.0) on the same token stream, batches and validation batches. Each seed is
a different initialization and batch order; the script prints every run and
the means, ours over the peer's, and how much an estimate from 20 batches
(nanoGPT's) scatters around the mean of 200.

    python benchmarks/shakespeare_char.py --all --seeds 0 1 2 [--architectures gpt2 llama] [--data ../shared/data/tinyshakespeare.txt]
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import BACKENDS, machine_description  # noqa: E402

NANOGPT_VAL_LOSS = 1.88
NANOGPT_EVAL_BATCHES = 20  # nanoGPT's CPU run estimates its validation loss on 20 random batches.
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "tinyshakespeare.txt")
SETTINGS = dict(
    batch_size=12, sequence_length=64, learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=100,
    weight_decay=0.1, beta_1=0.9, beta_2=0.99, steps_per_epoch=500,
)
MODEL = dict(num_layers=4, num_heads=4, hidden_dim=128, use_bias=False)  # nanoGPT's model for this run: no biases.
ARCHITECTURES = {
    "gpt2": dict(),
    # LLaMA's choices; 344 ~ 2/3 of 4 x 128, so the parameter count stays GPT-2's.
    "llama": dict(position_type="rotary", norm_type="rms_norm", activation="swiglu", intermediate_dim=344),
}


def token_streams(path):
    """`(train, validation, vocabulary_size)`: character ids, split 90/10 as nanoGPT does."""
    from kerasformer import data

    text = data.read_text(path)
    tokenizer = data.train_tokenizer("char", [text])
    train, validation = data.split(data.encode(tokenizer, text))
    return train, validation, int(tokenizer.vocabulary_size())


def train_ours(args, seed, architecture):
    """Validation loss of `kerasformer train` with nanoGPT's settings."""
    from kerasformer.train import TrainConfig, train

    s = SETTINGS
    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(
            task="gpt", preset="gpt2-tiny", data=args.data, tokenizer="char", run_dir=run_dir,
            steps=args.steps, checkpoint_every=s["steps_per_epoch"], batch_size=s["batch_size"],
            sequence_length=s["sequence_length"], learning_rate=s["learning_rate"],
            min_learning_rate=s["min_learning_rate"], warmup_steps=s["warmup_steps"],
            weight_decay=s["weight_decay"], beta_1=s["beta_1"], beta_2=s["beta_2"], dropout=0.0,
            validation_steps=args.validation_batches, seed=seed,
            overrides=dict(**MODEL, **ARCHITECTURES[architecture]),
        )
        return train(config)["val_loss"]


def peer_model(architecture, vocabulary_size):
    """`transformers`' model of `architecture` at this run's sizes, with its own initialization."""
    import transformers

    sizes = dict(vocab_size=vocabulary_size, bos_token_id=None, eos_token_id=None)
    if architecture == "llama":
        config = transformers.LlamaConfig(
            **sizes, hidden_size=MODEL["hidden_dim"], num_hidden_layers=MODEL["num_layers"],
            num_attention_heads=MODEL["num_heads"], intermediate_size=ARCHITECTURES["llama"]["intermediate_dim"],
            max_position_embeddings=SETTINGS["sequence_length"], rms_norm_eps=1e-5, tie_word_embeddings=True,
            attention_bias=False, mlp_bias=False,
        )
        model = transformers.LlamaForCausalLM(config)  # N(0, 0.02) init, no biases.
        # nanoGPT's (and GPT-2's) init, as kerasformer's GPT: the projections into
        # the residual stream get N(0, 0.02 / sqrt(2 layers)).
        std = 0.02 / (2 * MODEL["num_layers"]) ** 0.5
        for layer in model.model.layers:
            for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
                linear.weight.data.normal_(0.0, std)
        return model
    config = transformers.GPT2Config(
        **sizes, n_positions=SETTINGS["sequence_length"], n_embd=MODEL["hidden_dim"], n_layer=MODEL["num_layers"],
        n_head=MODEL["num_heads"], activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
    )
    model = transformers.GPT2LMHeadModel(config)  # GPT-2's init, as nanoGPT's: N(0, 0.02), scaled c_proj.
    for name, parameter in model.named_parameters():  # nanoGPT's `bias=False`.
        if name.endswith(".bias"):
            parameter.data.zero_()
            parameter.requires_grad_(False)
    return model


def train_peer(args, seed, architecture):
    """Validation loss of `transformers`' model trained by nanoGPT's loop (torch)."""
    import torch

    from kerasformer.data import LanguageModelBatches

    s = SETTINGS
    train_stream, validation_stream, vocabulary_size = token_streams(args.data)
    # The same batches as `kerasformer train` draws for this seed.
    batches = LanguageModelBatches(train_stream, s["sequence_length"], s["batch_size"], s["steps_per_epoch"], seed=seed)
    validation = LanguageModelBatches(
        validation_stream, s["sequence_length"], s["batch_size"], args.validation_batches, seed=seed + 1
    )
    torch.manual_seed(seed)
    model = peer_model(architecture, vocabulary_size)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(  # nanoGPT's `configure_optimizers`: decay on tensors of rank >= 2.
        [
            {"params": [p for p in trained if p.dim() >= 2], "weight_decay": s["weight_decay"]},
            {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=s["learning_rate"],
        betas=(s["beta_1"], s["beta_2"]),
    )

    def learning_rate(step):  # nanoGPT's `get_lr`, decaying over all steps.
        if step < s["warmup_steps"]:
            return s["learning_rate"] * (step + 1) / (s["warmup_steps"] + 1)
        ratio = (step - s["warmup_steps"]) / (args.steps - s["warmup_steps"])
        coefficient = 0.5 * (1.0 + math.cos(math.pi * ratio))
        return s["min_learning_rate"] + coefficient * (s["learning_rate"] - s["min_learning_rate"])

    def loss_of(x, y):
        logits = model(torch.from_numpy(x)).logits  # (B, T, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).long().flatten())

    model.train()
    for step in range(args.steps):
        if step and step % s["steps_per_epoch"] == 0:
            batches.on_epoch_end()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        loss = loss_of(*batches[step % s["steps_per_epoch"]])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        losses = [loss_of(*validation[i]).item() for i in range(len(validation))]
    mean = sum(losses) / len(losses)
    # How far one estimate from NANOGPT_EVAL_BATCHES random batches (nanoGPT's
    # `--eval_iters=20`) scatters around this mean: one standard deviation.
    spread = statistics.stdev(losses) / NANOGPT_EVAL_BATCHES**0.5
    print(f"SPREAD {architecture} seed {seed}: a {NANOGPT_EVAL_BATCHES}-batch estimate scatters by +-{spread:.4f} (one standard deviation)", flush=True)
    return round(mean, 4)


def run_seeds(args, train_function, label):
    """Trains once per architecture and seed, prints each run."""
    for architecture in args.architectures:
        for seed in args.seeds:
            start = time.perf_counter()
            loss = train_function(args, seed, architecture)
            print(
                f"RUN {architecture:5s} {label:10s} seed {seed}: val loss {loss:.4f}, "
                f"{args.steps} steps in {time.perf_counter() - start:.0f} s",
                flush=True,
            )


def mean_of(lines, architecture, prefix, marker):
    """Mean of the figures after `marker` in the `prefix` lines of `architecture`."""
    values = [float(line.split(marker)[1].split(",")[0].split()[0]) for line in lines if line.startswith(f"{prefix} {architecture} ")]
    return sum(values) / len(values)


def run_all(args):
    """Every backend and the peer, each in its own process; prints the comparison."""
    print(f"machine: {machine_description()}", flush=True)
    lines = {}
    for name in (*BACKENDS, "peer"):
        env = {**os.environ, "KERAS_BACKEND": "torch" if name == "peer" else name, "TF_CPP_MIN_LOG_LEVEL": "3"}
        argv = [a for a in sys.argv[1:] if a != "--all"] + (["--peer"] if name == "peer" else [])
        result = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True)
        lines[name] = [line for line in result.stdout.splitlines() if line.startswith(("RUN", "SPREAD"))]
        sys.stdout.write("".join(line + "\n" for line in lines[name]))
        if result.returncode:
            sys.stderr.write(result.stderr[-3000:])
            return False
    for architecture in args.architectures:
        peer = mean_of(lines["peer"], architecture, "RUN", "val loss ")
        spread = mean_of(lines["peer"], architecture, "SPREAD", "+-")
        z = (NANOGPT_VAL_LOSS - peer) / spread
        print(
            f"{architecture}: mean over seeds {args.seeds}: peer (transformers, nanoGPT's loop) {peer:.4f}; "
            f"nanoGPT's README {NANOGPT_VAL_LOSS}, one run measured on {NANOGPT_EVAL_BATCHES} batches, an estimate "
            f"that scatters by +-{spread:.4f}: {abs(z):.1f} standard deviations {'below' if z < 0 else 'above'} the peer's mean"
        )
        for backend in BACKENDS:
            ours = mean_of(lines[backend], architecture, "RUN", "val loss ")
            print(
                f"{architecture:5s} {backend:10s} kerasformer {ours:.4f} | peer {peer:.4f} | ratio {ours / peer:.3f} | "
                f"vs nanoGPT's {NANOGPT_VAL_LOSS}: {ours / NANOGPT_VAL_LOSS:.3f}",
                flush=True,
            )
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend and the peer")
    parser.add_argument("--peer", action="store_true", help="run only the peer (transformers, torch)")
    parser.add_argument("--architectures", nargs="+", choices=sorted(ARCHITECTURES), default=list(ARCHITECTURES))
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--validation-batches", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="initialization and batch order")
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        sys.exit(f"No data at {args.data}; pass --data path/to/tinyshakespeare.txt")
    if args.steps % SETTINGS["steps_per_epoch"]:
        sys.exit(f"--steps must be a multiple of {SETTINGS['steps_per_epoch']}")
    if args.all:
        sys.exit(0 if run_all(args) else 1)
    import keras

    run_seeds(args, train_peer if args.peer else train_ours, "peer" if args.peer else keras.backend.backend())


if __name__ == "__main__":
    main()

"""Greedy generation speed: kerasformer vs KerasHub's GPT2CausalLM, same config.

4 layers, width 256, 4 heads, vocabulary 8192, an 8-token prompt and 128 new
tokens, batch 1 and 8, fp32, random weights. The two models run in
alternating rounds; prints the best new tokens/s of each, their ratio, and the
median of the rounds' paired ratios. Run under one backend, or all three with
--all:

    KERAS_BACKEND=torch python benchmarks/generate.py
    python benchmarks/generate.py --all
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import alternating_seconds, run_per_backend  # noqa: E402

CONFIG = dict(vocab_size=8192, num_layers=4, num_heads=4, hidden_dim=256, prompt=8, new_tokens=128)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="run every backend")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed rounds per model")
    args = parser.parse_args()
    if args.all:
        sys.exit(0 if run_per_backend(__file__, sys.argv[1:]) else 1)

    import keras
    import keras_hub
    import numpy as np

    from kerasformer.generate import generate
    from kerasformer.models import GPT

    c = CONFIG
    length = c["prompt"] + c["new_tokens"]
    ours = GPT(c["vocab_size"], c["num_layers"], c["num_heads"], c["hidden_dim"], max_sequence_length=length)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=c["vocab_size"],
        num_layers=c["num_layers"],
        num_heads=c["num_heads"],
        hidden_dim=c["hidden_dim"],
        intermediate_dim=4 * c["hidden_dim"],
        max_sequence_length=length,
    )
    theirs = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

    for batch in args.batch_sizes:
        prompts = np.random.default_rng(0).integers(1, c["vocab_size"], (batch, c["prompt"])).astype("int32")
        token_ids = np.zeros((batch, length), "int32")
        token_ids[:, : c["prompt"]] = prompts
        padding_mask = token_ids != 0

        def run_ours():
            generate(ours, prompts, max_new_tokens=c["new_tokens"])

        def run_theirs():
            theirs.generate(
                {"token_ids": token_ids, "padding_mask": padding_mask},
                max_length=length,
                stop_token_ids=None,
            )

        new_tokens = batch * c["new_tokens"]
        ours_times, their_times = alternating_seconds([run_ours, run_theirs], args.repeats)
        ours_rate, theirs_rate = new_tokens / min(ours_times), new_tokens / min(their_times)
        paired = statistics.median(t / o for o, t in zip(ours_times, their_times))
        print(
            f"{keras.backend.backend():10s} batch {batch}: kerasformer {ours_rate:8.0f} new tok/s | "
            f"KerasHub {theirs_rate:8.0f} new tok/s | ratio {ours_rate / theirs_rate:5.2f}x "
            f"(median of {args.repeats} paired rounds {paired:5.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()

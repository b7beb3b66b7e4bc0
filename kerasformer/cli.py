"""`kerasformer train | generate | export | serve`.

    kerasformer train gpt --preset gpt2-tiny --data input.txt --steps 2000 --run-dir runs/shakespeare
    kerasformer train gpt --model num_layers=4 --model position_type=rotary ...  # any preset argument
    kerasformer generate runs/shakespeare --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8
    kerasformer generate runs/shakespeare --prompt "ROMEO:" --prompt "JULIET:"  # one batch, two texts
    kerasformer generate runs/bert --prompt "the cat [MASK] on the mat"  # a BERT run fills each [MASK]
    kerasformer export runs/shakespeare saved_models/shakespeare
    kerasformer serve saved_models/shakespeare --port 8501
"""

import argparse
import ast
import sys
from dataclasses import fields

DEFAULT_NEW_TOKENS = 100  # `kerasformer generate`'s text length when not given


def _train_parser(subparsers):
    from kerasformer.train import TASKS, TrainConfig

    parser = subparsers.add_parser("train", help="train a model (resumes a killed run in the same --run-dir)")
    settings = {f.name: f for f in fields(TrainConfig)}
    parser.add_argument("task", choices=TASKS, help=settings.pop("task").metadata["help"])
    settings.pop("overrides")  # `--model`, below.
    for f in settings.values():
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=f.type if f.type in (int, float) else str, default=f.default,
            choices=f.metadata["choices"],
            help=f.metadata["help"] + ("" if f.default is None else " (default: %(default)s)"),
        )
    parser.add_argument(
        "--model", dest="overrides", action="append", type=model_argument, default=[], metavar="NAME=VALUE",
        help="an argument of the preset's builder, e.g. --model position_type=rotary --model num_layers=4 (repeatable)",
    )


def model_argument(text):
    """`NAME=VALUE` -> `(NAME, VALUE)`; VALUE is a Python literal (4, 0.1, None, True) or else a string."""
    name, separator, value = text.partition("=")
    if not separator or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, e.g. num_layers=4, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def _generate_parser(subparsers):
    parser = subparsers.add_parser("generate", help="generate text with a trained run")
    parser.add_argument("run_dir", help="the --run-dir of `kerasformer train`, or a .keras file in it (e.g. its checkpoint.keras)")
    parser.add_argument(
        "--prompt", required=True, action="append",
        help="text to continue (GPT), to transform (T5, Transformer) or whose [MASK]s to fill (BERT); repeat it for a"
        " batch, printed in order",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None,
        help=f"tokens to generate; a GPT goes past its context in windows, as nanoGPT crops it; T5 and Transformer"
        f" stop at their end token, and a Transformer with learned positions by its table's end (default:"
        f" {DEFAULT_NEW_TOKENS}, or up to a GPT's context with --num-beams, which must fit in it)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy; above 0: sampling at this temperature (default: %(default)s)"
    )
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample among the most likely tokens of this total probability")
    parser.add_argument("--seed", type=int, default=None, help="a seed makes sampling repeatable")
    parser.add_argument(
        "--num-beams", type=int, default=1, help="beam search with this many beams (default: %(default)s, greedy or sampling)"
    )
    parser.add_argument(
        "--length-penalty", type=float, default=1.0,
        help="beam search ranks its finished texts by log-probability / length ** this; above 0 favours longer ones"
        " (default: %(default)s, as transformers)",
    )


def _export_parser(subparsers):
    parser = subparsers.add_parser("export", help="write a TensorFlow SavedModel of a trained run")
    parser.add_argument("run_dir", help="the --run-dir of `kerasformer train`, or a .keras file in it (e.g. its checkpoint.keras)")
    parser.add_argument("target", help="the SavedModel's folder, e.g. saved_models/NAME")


def _serve_parser(subparsers):
    from kerasformer.serve import DEFAULT_MAX_ANSWER_VALUES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TOKENS

    parser = subparsers.add_parser("serve", help="serve a SavedModel over TF Serving's REST API")
    parser.add_argument("saved_model", help="a folder written by `kerasformer export`")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8501, help="(default: %(default)s, TF Serving's REST port)")
    parser.add_argument("--name", default=None, help="model name in URLs (default: the folder name)")
    parser.add_argument("--workers", type=int, default=4, help="requests that run the model at once (default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="open client connections; more wait to be accepted until one closes (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help="the most tokens in a request, rows x (longest input + new tokens); more get 413 (default: %(default)s)")
    parser.add_argument("--max-answer-values", type=int, default=DEFAULT_MAX_ANSWER_VALUES,
                        help="the most numbers in an answer (logits are rows x tokens x vocabulary); more get 413 (default: %(default)s)")


def generate_text(run_dir, prompt, max_new_tokens=None, **options):
    """Text from a trained run: GPT continues `prompt`; T5/Transformer transform it; BERT fills its "[MASK]"s.

    `prompt` is a string, or a list of them generated as one batch (their
    lengths may differ); the result is a string or a list to match.
    `max_new_tokens` defaults to `DEFAULT_NEW_TOKENS`; for a GPT's beam
    search, which must fit its context, to at most the room the prompts leave.
    """
    from kerasformer import data
    from kerasformer.generate import generate, learned_position_limit, learned_positions_message
    from kerasformer.models import GPT, BERTMaskedLM
    from kerasformer.train import load_run

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    model, tokenizer, _ = load_run(run_dir)
    if isinstance(model, BERTMaskedLM):
        texts = fill_masks(model, tokenizer, prompts, **options)
        return texts[0] if isinstance(prompt, str) else texts
    ids = [data.encode(tokenizer, text, what="`prompt`") for text in prompts]
    for text, row in zip(prompts, ids):
        if len(row) == 0:
            raise ValueError(f"`prompt` {text!r} has no tokens; give it some text.")
    if max_new_tokens is None:
        max_new_tokens = DEFAULT_NEW_TOKENS
        room = model.max_sequence_length - max(len(row) for row in ids) if isinstance(model, GPT) else 0
        if options.get("num_beams", 1) > 1 and room > 0:  # With no room, `generate` names the problem.
            max_new_tokens = min(max_new_tokens, room)
    if isinstance(model, GPT):
        new = generate(model, ids, max_new_tokens=max_new_tokens, **options)
        texts = [data.continuation(tokenizer, *row) for row in zip(prompts, ids, new)]
    else:
        limit = learned_position_limit(model)  # A Transformer's table bounds source and output.
        if limit is not None:
            for text, row in zip(prompts, ids):
                if len(row) > limit:
                    raise ValueError(learned_positions_message(model, f"`prompt` {text!r} ({len(row)} tokens)"))
            # Its decoder cannot write past the table; a trained one ends with [END] before.
            max_new_tokens = min(max_new_tokens, limit)
        start, end = data.SPECIAL_TOKENS.index(data.START), data.SPECIAL_TOKENS.index(data.END)
        new = generate(model, ids, max_new_tokens=max_new_tokens, stop_token_ids=[end], start_token_id=start, **options)
        texts = [data.decode_target(tokenizer, row) for row in new]
    return texts[0] if isinstance(prompt, str) else texts


def fill_masks(model, tokenizer, prompts, temperature=0.0, top_k=None, top_p=None, seed=None, num_beams=1, length_penalty=1.0):
    """A BERT run's texts with each "[MASK]" replaced by its most likely token (as the export's `fill_mask_text`).

    Each prompt is read as `kerasformer train bert` writes its rows:
    [CLS] text [SEP], with the [MASK] token's id for each "[MASK]".
    """
    import numpy as np

    from kerasformer import data
    from kerasformer.generate import learned_position_limit, learned_positions_message

    if temperature or top_k or top_p is not None or seed is not None or num_beams != 1 or length_penalty != 1.0:
        raise ValueError(
            "A BERT run fills each [MASK] with its most likely token: `temperature`, `top_k`, `top_p`, `seed`, "
            "`num_beams` and `length_penalty` do not apply."
        )
    cls, sep, mask = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))
    rows = []
    for text in prompts:
        if data.MASK not in text:
            raise ValueError(f"`prompt` {text!r} has no {data.MASK} to fill.")
        pieces = [data.encode(tokenizer, piece, what="`prompt`") for piece in text.split(data.MASK)]
        ids = [int(t) for piece in pieces[:-1] for t in [*piece, mask]] + [int(t) for t in pieces[-1]]
        row = [cls, *ids, sep]
        limit = learned_position_limit(model.backbone)
        if limit is not None and len(row) > limit:
            raise ValueError(learned_positions_message(model.backbone, f"`prompt` {text!r} ({len(row)} tokens with [CLS] and [SEP])"))
        rows.append(row)
    token_ids = data.pad_batch(rows)  # (B, T), padded with 0, which BERT masks.
    logits = model.predict_on_batch({"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids)})  # (B, T, V)
    filled = np.where(token_ids == mask, np.asarray(logits).argmax(-1), token_ids)
    # Every token of the row but [CLS] and [SEP]: a mask may be filled with any id, padding's too.
    return [data.decode(tokenizer, filled[i, 1 : len(row) - 1], until_padding=False) for i, row in enumerate(rows)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kerasformer", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _train_parser(subparsers)
    _generate_parser(subparsers)
    _export_parser(subparsers)
    _serve_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        _run(args)
    except ValueError as error:  # Bad settings or input, named by the code that checked them: no traceback.
        parser.exit(2, f"kerasformer {args.command}: error: {error}\n")
    return 0


def _run(args):
    if args.command == "train":
        from kerasformer.train import TrainConfig, train

        settings = {k: v for k, v in vars(args).items() if k != "command"}
        config = TrainConfig(**{**settings, "overrides": dict(settings["overrides"])})
        train(config)
    elif args.command == "generate":
        texts = generate_text(
            args.run_dir, args.prompt, args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
            num_beams=args.num_beams, length_penalty=args.length_penalty,
        )
        print("\n\n".join(texts))  # One prompt's text, or each in order, a blank line apart.
    elif args.command == "export":
        from kerasformer.export import export_run

        print(export_run(args.run_dir, args.target))
    elif args.command == "serve":
        from kerasformer.serve import serve

        serve(args.saved_model, host=args.host, port=args.port, name=args.name, workers=args.workers,
              max_tokens=args.max_tokens, max_answer_values=args.max_answer_values,
              max_connections=args.max_connections)


if __name__ == "__main__":
    sys.exit(main())

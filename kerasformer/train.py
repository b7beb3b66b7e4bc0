"""Training runs: data -> model -> `fit` with warm-up + cosine AdamW -> evaluation.

A run lives in one folder: `model.keras` (final), `checkpoint.keras` (every
`checkpoint_every` steps), `backup/` (`BackupAndRestore`: a killed run started
again with the same folder resumes), `tokenizer/`, `log.csv`, `loss.png` and
`run.json` (the settings, written first, with which a run resumes; then the
final evaluation).
"""

import json
import math
import os
import re
import sys
import warnings
from dataclasses import asdict, dataclass, field

import keras
import numpy as np

from kerasformer import data
from kerasformer.allocator import ALLOCATORS, set_allocator
from kerasformer.checks import check_int, check_number, check_positive_int
from kerasformer.data import TOKENIZER_KINDS
from kerasformer.losses import TokenCrossEntropy
from kerasformer.optimizers import AdamW

TASKS = ("gpt", "bert", "t5", "transformer")
PRECISIONS = ("fp32", "bf16")
JIT_COMPILE_CHOICES = ("auto", "true", "false")
DEFAULT_PRESETS = {"gpt": "gpt2-tiny", "bert": "bert-tiny", "t5": "t5-tiny", "transformer": "transformer-tiny"}


def _setting(default, help, choices=None):
    """A `TrainConfig` field: its default, what it changes (`kerasformer train --help` shows it) and its choices."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    """Settings of a run; each field says what it changes (also in `kerasformer train --help`)."""

    task: str = _setting("gpt", "gpt (causal LM), bert (masked LM), t5 / transformer (seq2seq)", TASKS)
    preset: str = _setting(None, "architecture; defaults to the task's *-tiny preset")
    data: str = _setting(
        None, "text file (bert: one sentence a line; t5/transformer: source<TAB>target a line); default: a generated data set"
    )
    tokenizer: str = _setting(
        None,
        "gpt: any, char by default; bert, t5, transformer: wordpiece (its vocabulary reserves their special tokens);"
        " without --data the generated set's words by default",
        TOKENIZER_KINDS,
    )
    vocabulary_size: int = _setting(2000, "size of a trained bpe / wordpiece / sentencepiece vocabulary")
    run_dir: str = _setting("runs/latest", "folder of the run: checkpoints, backup, log, plot; a killed run resumes from it")
    steps: int = _setting(500, "training steps in all; a multiple of --checkpoint-every")
    batch_size: int = _setting(16, "sequences per step")
    sequence_length: int = _setting(64, "context of LM windows (a GPT's max_sequence_length); longest BERT / seq2seq example")
    learning_rate: float = _setting(1e-3, "peak learning rate, reached after the warm-up")
    min_learning_rate: float = _setting(1e-4, "the cosine decays to this; at most --learning-rate")
    warmup_steps: int = _setting(100, "linear warm-up from 0")
    weight_decay: float = _setting(0.1, "AdamW's decoupled decay, on matrices only (not biases, norms)")
    beta_1: float = _setting(0.9, "AdamW's first-moment decay")
    beta_2: float = _setting(0.99, "AdamW's second-moment decay")
    clipnorm: float = _setting(1.0, "global gradient-norm clipping; 0 turns it off")
    dropout: float = _setting(None, "overrides the preset's dropout")
    checkpoint_every: int = _setting(100, "steps between checkpoints, backups, log rows and validations")
    validation_steps: int = _setting(20, "validation batches at each checkpoint")
    precision: str = _setting("fp32", "bf16: mixed_bfloat16 (bfloat16 compute, float32 weights)", PRECISIONS)
    jit_compile: str = _setting(
        "auto", "auto: XLA on TensorFlow and JAX, eager torch; true on torch: torch.compile", JIT_COMPILE_CHOICES
    )
    allocator: str = _setting(
        "reuse", "reuse: malloc keeps freed memory for the next step (faster on CPU, see allocator.py)", ALLOCATORS
    )
    seed: int = _setting(0, "initialization, batch order and masking")
    overrides: dict = field(default_factory=dict)  # Extra preset arguments (`--model NAME=VALUE`).


def make_optimizer(model, config):
    """AdamW with linear warm-up then cosine decay; no decay on vectors, nor on variables no loss reaches."""
    decay_steps = max(config.steps - config.warmup_steps, 1)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=decay_steps,
        alpha=config.min_learning_rate / config.learning_rate,
        warmup_target=config.learning_rate,
        warmup_steps=config.warmup_steps,
    )
    optimizer = AdamW(  # Keras's AdamW; one fused update kernel on torch.
        learning_rate=schedule,
        weight_decay=config.weight_decay,
        beta_1=config.beta_1,
        beta_2=config.beta_2,
        epsilon=1e-8,  # PyTorch's and nanoGPT's (Keras: 1e-7).
        global_clipnorm=config.clipnorm or None,
    )
    vectors = [v for v in model.trainable_variables if len(v.shape) < 2]
    optimizer.exclude_from_weight_decay(var_list=vectors + untrained_variables(model))
    return optimizer


def untrained_variables(model):
    """Trainable variables of `model` that its loss does not reach: BERT's pooler under the masked-LM head.

    TF and torch give them no gradient and leave them as they are; JAX gives
    them zero gradients, and weight decay alone would shrink them. Without
    decay, Adam's update of a zero gradient is zero on every backend.
    """
    from kerasformer.models import BERTMaskedLM

    return list(model.backbone.pooler.trainable_variables) if isinstance(model, BERTMaskedLM) else []


# Tasks: tokenizer, model, batches and a final score ------------------------


def _gpt_task(config, build, tokenizer=None):
    text = data.read_text(config.data) if config.data else " ".join(data.generated_language(20000, seed=config.seed))
    if not text.strip():
        raise ValueError(f"`data` {config.data!r} has no text.")
    kind = config.tokenizer or "char"
    if tokenizer is None:
        tokenizer = data.train_tokenizer(kind, [text] if kind == "char" else text.splitlines() or [text], config.vocabulary_size)
    stream = data.encode(tokenizer, text)
    train_stream, validation_stream = data.split(stream)
    if len(validation_stream) < config.sequence_length + 2:  # The smaller part; windows of T + 1 tokens, at 2 offsets at least.
        raise ValueError(
            f"`data` is too short for `sequence_length`={config.sequence_length}: its validation tenth has "
            f"{len(validation_stream)} tokens, fewer than {config.sequence_length + 2}; give a longer text or a smaller `sequence_length`."
        )
    vocab_size = int(tokenizer.vocabulary_size())
    # The context it trains on, as nanoGPT's block_size: a larger learned table
    # would hold untrained positions, which generation past the context would read.
    model = build(vocab_size=vocab_size, max_sequence_length=config.sequence_length)
    train = data.LanguageModelBatches(train_stream, config.sequence_length, config.batch_size, config.checkpoint_every, seed=config.seed)
    # The same validation windows at every checkpoint and in the final
    # evaluation, so that their losses differ only as the weights do.
    validation = data.LanguageModelBatches(
        validation_stream, config.sequence_length, config.batch_size, config.validation_steps, seed=config.seed + 1, redraw=False
    )

    def evaluate(model):
        loss = model.evaluate(validation, verbose=0, return_dict=True)["loss"]
        return {"val_loss": round(loss, 4), "perplexity": round(math.exp(loss), 3)}

    return tokenizer, model, train, validation, evaluate


def _special_token_tokenizer(config, texts, generated_words):
    """The tokenizer of a bert or seq2seq run: WordPiece, whose vocabulary reserves `data.SPECIAL_TOKENS`.

    Those tasks write [CLS], [SEP], [MASK], [START] and [END] by their ids
    0-6; in a char, byte or SentencePiece vocabulary those ids are ordinary
    tokens. A WordPiece vocabulary is trained on `texts` for a data file (or
    when asked for), else the generated task's word list is the vocabulary.
    """
    if config.tokenizer not in (None, "wordpiece"):
        raise ValueError(
            f"`tokenizer` for the {config.task} task must be 'wordpiece' (its vocabulary reserves "
            f"{', '.join(data.SPECIAL_TOKENS)}), got {config.tokenizer!r}."
        )
    if config.data is None and config.tokenizer is None:
        return data.word_tokenizer(generated_words)
    return data.train_tokenizer("wordpiece", texts, config.vocabulary_size)


def _bert_task(config, build, tokenizer=None):
    from kerasformer.models import BERTMaskedLM

    sentences = data.read_text(config.data).splitlines() if config.data else data.generated_language(20000, seed=config.seed)
    sentences = [s for s in sentences if s.strip()]
    _check_count(config, len(sentences), "sentences")
    if tokenizer is None:
        tokenizer = _special_token_tokenizer(config, sentences, data.LANGUAGE_WORDS)
    cls_id, sep_id, mask_id = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))
    rows = [np.concatenate([[cls_id], ids[: config.sequence_length - 2], [sep_id]]) for ids in data.encode(tokenizer, sentences)]
    token_ids = data.pad_batch(rows, config.sequence_length)
    train_ids, validation_ids = data.split(token_ids)
    validation_ids = validation_ids[: config.batch_size * config.validation_steps]
    vocab_size = int(tokenizer.vocabulary_size())
    model = BERTMaskedLM(build(vocab_size=vocab_size, max_sequence_length=config.sequence_length))
    special = list(range(len(data.SPECIAL_TOKENS)))

    def mask(token_ids, labels, weights, seed):  # Fresh masks for every batch.
        inputs, labels, weights = data.mask_tokens(token_ids, mask_id, vocab_size, special_ids=special, seed=seed)
        return {"token_ids": inputs, "segment_ids": np.zeros_like(inputs)}, labels, weights

    train = data.ArrayBatches(train_ids, train_ids, None, config.batch_size, config.checkpoint_every, mask, config.seed)
    # Validation masks are drawn once, as in Google BERT's static eval data:
    # every checkpoint's val_loss and the final evaluation then score the same
    # masked tokens, and differ only as the weights do.
    validation = data.ArrayBatches(*mask(validation_ids, None, None, seed=config.seed + 1), config.batch_size, shuffle=False)

    def evaluate(model):
        results = model.evaluate(validation, verbose=0, return_dict=True)
        return {"val_loss": round(results["loss"], 4), "masked_token_accuracy": round(results["accuracy"], 4)}

    return tokenizer, model, train, validation, evaluate


def _seq2seq_task(config, build, tokenizer=None):
    from kerasformer.generate import generate

    if config.data:
        pairs = [line.split("\t") for line in data.read_text(config.data).splitlines() if "\t" in line]
        _check_count(config, len(pairs), "source<TAB>target lines")
        sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        sources, targets = data.numbers_to_words_dataset(20000, seed=config.seed)
    if tokenizer is None:
        tokenizer = _special_token_tokenizer(config, sources + targets, data.NUMBER_WORDS)
    start_id, end_id = data.SPECIAL_TOKENS.index(data.START), data.SPECIAL_TOKENS.index(data.END)
    source_ids = [ids[: config.sequence_length] for ids in data.encode(tokenizer, sources)]
    target_ids = [ids[: config.sequence_length - 1] for ids in data.encode(tokenizer, targets)]
    inputs, labels, weights = data.seq2seq_arrays(source_ids, target_ids, start_id, end_id)
    held_out = max(1, min(1000, len(labels) // 10))
    part = lambda a, s: {k: v[s] for k, v in a.items()} if isinstance(a, dict) else a[s]  # noqa: E731
    train_rows, validation_rows = slice(0, -held_out), slice(-held_out, None)
    # Sources and decoder inputs are at most `sequence_length` tokens: a larger
    # learned table (`--model position_type=learned`) would hold untrained
    # positions, as for a GPT.
    model = build(vocab_size=int(tokenizer.vocabulary_size()), max_sequence_length=config.sequence_length)
    train = data.ArrayBatches(*(part(a, train_rows) for a in (inputs, labels, weights)), config.batch_size, config.checkpoint_every, seed=config.seed)
    validation = data.ArrayBatches(*(part(a, validation_rows) for a in (inputs, labels, weights)), config.batch_size, shuffle=False)

    def evaluate(model):
        results = model.evaluate(validation, verbose=0, return_dict=True)
        sources = part(inputs, validation_rows)["encoder_token_ids"][:200]
        references = labels[validation_rows][:200]
        predicted = generate(model, sources, max_new_tokens=labels.shape[1], stop_token_ids=[end_id], start_token_id=start_id)
        exact = [_until(p, end_id) == _until(r, end_id) for p, r in zip(predicted, references)]
        return {
            "val_loss": round(results["loss"], 4),
            "token_accuracy": round(results["accuracy"], 4),
            "exact_match": round(float(np.mean(exact)), 4),
        }

    return tokenizer, model, train, validation, evaluate


def _check_count(config, count, what):
    """Names `data` when it has too few examples to train on some and validate on others."""
    if count < 2:
        raise ValueError(f"`data` {config.data!r} has {count} {what}; a run needs at least 2 (about 90% to train on, 10% to validate on).")


def _until(ids, end_id):
    """The tokens before `end_id` (or padding)."""
    out = []
    for token in ids:
        if token in (end_id, 0):
            break
        out.append(int(token))
    return out


def build_task(config, tokenizer=None):
    """`(tokenizer, model, train, validation, evaluate)` of a run; `tokenizer`: a saved one instead of training one."""
    from kerasformer.models import from_preset

    if config.task not in TASKS:
        raise ValueError(f"Unknown task {config.task!r}; expected one of {TASKS}.")
    preset = config.preset or DEFAULT_PRESETS[config.task]
    overrides = dict(config.overrides)
    if config.dropout is not None:
        overrides["dropout"] = config.dropout

    def build(**arguments):
        if config.task == "t5":  # Relative position buckets: no table, no length limit.
            arguments.pop("max_sequence_length", None)
        return from_preset(preset, **{**arguments, **overrides})

    task = {"gpt": _gpt_task, "bert": _bert_task, "t5": _seq2seq_task, "transformer": _seq2seq_task}[config.task]
    return task(config, build, tokenizer)


# The run --------------------------------------------------------------------


def save_atomically(save, path):
    """`save(path)` through a temporary file beside `path`, renamed into place when complete.

    Keras writes a `.keras` file in place, so a run killed while saving left
    a truncated zip that `kerasformer generate` and `export` could not read;
    now `path` holds the previous complete file until the new one is.
    """
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{os.getpid()}-{name}")  # The same suffix: Keras picks the format by it.
    try:
        save(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class _Checkpoint(keras.callbacks.Callback):
    """Saves the model (and its optimizer state) to `path` after every epoch, atomically."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        save_atomically(self.model.save, self.path)


class _StopIfDiverged(keras.callbacks.Callback):
    """Stops a run whose loss turned NaN or infinite, before its epoch is checkpointed, backed up or logged.

    Keras's epoch loss is a running mean, so one such step makes it
    non-finite. Checked once an epoch, not every step, so that the steps
    stay asynchronous. The run's checkpoint and backup keep the weights of
    the epoch before.
    """

    def __init__(self, steps_per_epoch):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            first, last = epoch * self.steps_per_epoch + 1, (epoch + 1) * self.steps_per_epoch
            steps = f"step {last}" if first == last else f"steps {first}-{last}"
            kept = f"The run's checkpoint and backup keep the weights of step {first - 1}" if epoch else "No checkpoint was written"
            raise ValueError(
                f"Training diverged: the loss of {steps} is {float(loss)}. {kept}. Train again in a new `run_dir` "
                f"with a lower `learning_rate` or a `clipnorm`."
            )


class _LossPlot(keras.callbacks.Callback):
    """Redraws `loss.png` from the CSV log after every epoch."""

    def __init__(self, csv_path, png_path, steps_per_epoch):
        super().__init__()
        self.csv_path, self.png_path, self.steps_per_epoch = csv_path, png_path, steps_per_epoch

    def on_epoch_end(self, epoch, logs=None):
        plot_losses(self.csv_path, self.png_path, self.steps_per_epoch)


def plot_losses(csv_path, png_path, steps_per_epoch=1):
    """Training and validation loss against training steps, from a Keras CSV log of `steps_per_epoch`-step epochs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # The plot is optional; the CSV log is always written.
        return False
    import csv

    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return False
    steps = [(int(r["epoch"]) + 1) * steps_per_epoch for r in rows]
    figure, axis = plt.subplots(figsize=(6, 4))
    for key in ("loss", "val_loss"):
        if key in rows[0]:
            axis.plot(steps, [float(r[key]) for r in rows], marker="o", label=key)
    axis.set_xlabel("training step")
    axis.set_ylabel("loss")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return True


def resolve_jit_compile(value):
    """The `compile(jit_compile=...)` value for "auto", "true" or "false".

    Keras's own "auto" turns XLA off for TensorFlow on machines without a GPU;
    our models compile under XLA on CPU too, and train ~1.7x faster there
    (nanoGPT's Shakespeare config, 2 cores: 101 vs 173 ms/step). On JAX and
    torch "auto" is Keras's choice: `jax.jit`, and eager torch (`True` there
    means `torch.compile`).
    """
    choice = str(value).lower()
    if choice not in JIT_COMPILE_CHOICES:
        raise ValueError(f"`jit_compile` must be 'auto', 'true' or 'false', got {value!r}.")
    if choice != "auto":
        return choice == "true"
    return True if keras.backend.backend() == "tensorflow" else "auto"  # Keras's "auto": XLA on JAX, eager torch.


def train(config):
    """Runs (or resumes) the training run of `config`; returns its evaluation dict."""
    if config.precision not in PRECISIONS:
        raise ValueError(f"`precision` must be 'fp32' or 'bf16', got {config.precision!r}.")
    if not isinstance(config.checkpoint_every, int) or config.checkpoint_every < 1:
        raise ValueError(f"`checkpoint_every` must be a positive number of steps, got {config.checkpoint_every!r}.")
    _check_settings(config)
    if config.steps % config.checkpoint_every:
        raise ValueError(
            f"`steps` ({config.steps}) must be a multiple of `checkpoint_every` ({config.checkpoint_every})."
        )
    set_allocator(config.allocator)  # Before the first step's threads allocate.
    keras.utils.set_random_seed(config.seed)
    if config.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    os.makedirs(config.run_dir, exist_ok=True)
    resuming = _check_resumable(config)
    _write_run_info(config)
    tokenizer_dir = os.path.join(config.run_dir, "tokenizer")
    # A resumed run reads the tokenizer it was trained with: one trained anew
    # (by another version of KerasHub or SentencePiece, say) could number the
    # tokens otherwise, and the restored weights would then read other text.
    reuse = resuming and os.path.isdir(tokenizer_dir)
    tokenizer, model, train_data, validation_data, evaluate = build_task(config, data.load_tokenizer(tokenizer_dir) if reuse else None)
    if not reuse:
        data.save_tokenizer(tokenizer, tokenizer_dir)
    weighted = config.task != "gpt"
    model.compile(
        optimizer=make_optimizer(model, config),
        # The mean over the tokens that count (masked tokens, real target
        # tokens), as BERT's and T5's papers and `transformers` report it;
        # Keras's default divides by every position, padding included.
        loss=TokenCrossEntropy(reduction="mean_with_sample_weight"),
        weighted_metrics=["accuracy"] if weighted else None,
        jit_compile=resolve_jit_compile(config.jit_compile),
    )
    csv_path = os.path.join(config.run_dir, "log.csv")
    # The backup goes last: once it records an epoch, that epoch's log row and
    # checkpoint are already written, so a run killed at any point resumes
    # with a complete log.
    callbacks = [
        _StopIfDiverged(config.checkpoint_every),  # First: before anything records the epoch.
        keras.callbacks.CSVLogger(csv_path, append=True),
        _LossPlot(csv_path, os.path.join(config.run_dir, "loss.png"), config.checkpoint_every),
        _Checkpoint(os.path.join(config.run_dir, "checkpoint.keras")),
        # `double_checkpoint`: a run killed while its backup was being written
        # resumes from the backup before (Keras falls back to it).
        keras.callbacks.BackupAndRestore(os.path.join(config.run_dir, "backup"), delete_checkpoint=False, double_checkpoint=True),
    ]
    with warnings.catch_warnings():
        # On TF and torch Keras warns, each epoch, of the variables without
        # gradients; those of `untrained_variables` have none by design. A
        # warning that names any other variable still shows.
        untrained = [v.path for v in untrained_variables(model)]
        if untrained:
            warnings.filterwarnings("ignore", message=re.escape(f"Gradients do not exist for variables {untrained} "))
        # One epoch is `checkpoint_every` steps: a checkpoint, a backup, a validation.
        model.fit(
            train_data,
            validation_data=validation_data,
            epochs=config.steps // config.checkpoint_every,
            callbacks=callbacks,
            verbose=1 if sys.stdout.isatty() else 2,  # A progress bar for people, lines for logs.
        )
    save_atomically(model.save, os.path.join(config.run_dir, "model.keras"))
    results = evaluate(model)
    _write_run_info(config, results)
    print("evaluation: " + ", ".join(f"{k}={v}" for k, v in results.items()), flush=True)
    return results


def _check_settings(config):
    """Raises a ValueError naming the first numeric setting out of its range (a negative learning rate trained to NaN)."""
    for name in ("steps", "batch_size", "sequence_length", "validation_steps", "vocabulary_size"):
        check_positive_int(name, getattr(config, name))
    check_int("warmup_steps", config.warmup_steps)
    check_int("seed", config.seed)
    check_number("learning_rate", config.learning_rate, low=0, low_open=True)
    check_number("min_learning_rate", config.min_learning_rate, low=0, high=config.learning_rate)
    check_number("weight_decay", config.weight_decay, low=0)
    check_number("beta_1", config.beta_1, low=0, high=1, high_open=True)
    check_number("beta_2", config.beta_2, low=0, high=1, high_open=True)
    check_number("clipnorm", config.clipnorm, low=0)
    check_number("dropout", config.dropout, low=0, high=1, high_open=True, none_ok=True)


# Settings a resumed run may change: its length, and how (not what) it computes.
RESUMABLE_CHANGES = ("steps", "jit_compile", "allocator")


def _write_run_info(config, evaluation=None):
    """`run.json`: the settings (written at the start, so a resumed run can be checked) and the final evaluation."""
    info = {"config": asdict(config)} if evaluation is None else {"config": asdict(config), "evaluation": evaluation}
    save_atomically(lambda path: _write_json(info, path), os.path.join(config.run_dir, "run.json"))


def _write_json(value, path):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def _check_resumable(config):
    """Whether `run_dir` holds a backup to resume; refuses one trained with other settings.

    The backup holds that run's weights and optimizer state: another model
    fails to load them deep in Keras, and another data set, tokenizer or
    schedule would silently continue a different run.
    """
    backup, info_path = os.path.join(config.run_dir, "backup"), os.path.join(config.run_dir, "run.json")
    if not (os.path.isdir(backup) and os.listdir(backup) and os.path.isfile(info_path)):
        return False  # Nothing to resume.
    with open(info_path) as f:
        before = json.load(f)["config"]
    now = json.loads(json.dumps(asdict(config)))  # As JSON stores it (tuples as lists).
    changed = [name for name in now if name not in RESUMABLE_CHANGES and before.get(name) != now[name]]
    if changed:
        differences = "; ".join(f"{name}: {before.get(name)!r} -> {now[name]!r}" for name in changed)
        raise ValueError(
            f"`run_dir` {config.run_dir!r} holds a run trained with other settings ({differences}); resume it with "
            f"its settings (only {', '.join(RESUMABLE_CHANGES)} may change) or give another `run_dir`."
        )
    return True


def load_run(run_dir):
    """`(model, tokenizer, run_info)` of a finished (or checkpointed) run.

    `run_dir` is the run's folder (its `model.keras`, else its latest
    `checkpoint.keras`), or one `.keras` file in it.
    """
    import kerasformer.models  # noqa: F401 - registers the model classes.

    if run_dir.endswith(".keras") and os.path.isfile(run_dir):
        path, run_dir = run_dir, os.path.dirname(run_dir) or "."
    else:
        for name in ("model.keras", "checkpoint.keras"):
            path = os.path.join(run_dir, name)
            if os.path.isfile(path):
                break
        else:
            raise ValueError(f"{run_dir!r} holds no model.keras or checkpoint.keras; give the --run-dir of `kerasformer train`.")
    if not os.path.isdir(os.path.join(run_dir, "tokenizer")):
        raise ValueError(f"{run_dir!r} has no tokenizer/ folder; give the --run-dir of `kerasformer train` (or a .keras file in it).")
    model = keras.saving.load_model(path)
    tokenizer = data.load_tokenizer(os.path.join(run_dir, "tokenizer"))
    info = {}
    if os.path.isfile(os.path.join(run_dir, "run.json")):
        with open(os.path.join(run_dir, "run.json")) as f:
            info = json.load(f)
    return model, tokenizer, info

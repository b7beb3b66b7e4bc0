"""The training CLI: a run trains, logs, plots, evaluates, and resumes after being killed."""

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings

import keras
import numpy as np
import pytest

from kerasformer.cli import generate_text
from kerasformer.train import TrainConfig, build_task, load_run, make_optimizer, resolve_jit_compile, save_atomically, train
from kerasformer.models import from_preset

TINY = ["--steps", "40", "--checkpoint-every", "10", "--batch-size", "8", "--sequence-length", "32",
        "--warmup-steps", "5", "--validation-steps", "2", "--learning-rate", "3e-3"]


def cli(*args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CI": "1"}
    return [sys.executable, "-m", "kerasformer.cli", *args], env


def test_schedule_warms_up_then_decays_and_spares_vectors_from_decay():
    model = from_preset("gpt2-tiny", vocab_size=32)
    config = TrainConfig(steps=200, warmup_steps=20, learning_rate=1e-3, min_learning_rate=1e-4)
    optimizer = make_optimizer(model, config)
    schedule = optimizer.learning_rate if callable(optimizer.learning_rate) else optimizer._learning_rate
    rates = [float(keras.ops.convert_to_numpy(schedule(step))) for step in (0, 10, 20, 110, 200)]
    assert rates[0] < rates[1] < rates[2] == pytest.approx(1e-3)
    assert rates[2] > rates[3] > rates[4] == pytest.approx(1e-4, rel=1e-3)
    optimizer.build(model.trainable_variables)
    decayed = {v.path for v in model.trainable_variables if optimizer._use_weight_decay(v)}
    assert all(len(v.shape) >= 2 for v in model.trainable_variables if v.path in decayed)
    assert any(len(v.shape) == 1 for v in model.trainable_variables)  # Biases and norms exist, undecayed.


def test_masked_lm_training_leaves_the_pooler_it_does_not_use_as_it_was():
    # The pooler is outside the masked-LM objective. TF and torch give it no
    # gradient; JAX gives it zeros, which weight decay alone would shrink.
    from kerasformer.models import BERTMaskedLM

    model = BERTMaskedLM(from_preset("bert-tiny", vocab_size=64))
    config = TrainConfig(task="bert", steps=10, warmup_steps=0, learning_rate=1e-2, weight_decay=0.1)
    model.compile(make_optimizer(model, config), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pooler, block = model.backbone.pooler.kernel, model.backbone.blocks[0].feedforward.sublayer.output_dense.kernel
    before = [np.array(keras.ops.convert_to_numpy(v)) for v in (pooler, block)]
    ids = np.random.default_rng(0).integers(5, 64, (8, 16))
    model.fit({"token_ids": ids, "segment_ids": np.zeros_like(ids)}, ids, batch_size=4, verbose=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(pooler), before[0])
    assert not np.allclose(keras.ops.convert_to_numpy(block), before[1])  # The encoder did train.


def _assert_final_evaluation_repeats_the_last_validation(run_dir, results):
    """Validation reads fixed windows / masks / batches: the final weights score as at the last checkpoint."""
    with open(run_dir / "log.csv") as f:
        last = list(csv.DictReader(f))[-1]
    np.testing.assert_allclose(results["val_loss"], float(last["val_loss"]), atol=2e-4)
    if "val_accuracy" in last:
        accuracy = results.get("masked_token_accuracy", results.get("token_accuracy"))
        np.testing.assert_allclose(accuracy, float(last["val_accuracy"]), atol=2e-4)


def test_train_cli_runs_logs_plots_evaluates_and_generates(tmp_path, capsys):
    run_dir = tmp_path / "gpt"
    # --model sets arguments of the preset's builder: here a LLaMA-style GPT.
    architecture = ["--model", "num_layers=1", "--model", "position_type=rotary", "--model", "activation=swiglu"]
    command, env = cli("train", "gpt", "--run-dir", str(run_dir), *TINY, *architecture)
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "evaluation: val_loss=" in result.stdout and "perplexity=" in result.stdout
    model = load_run(str(run_dir))[0]
    assert (model.num_layers, len(model.blocks), model.position_type, model.activation) == (1, 1, "rotary", "swiglu")
    for name in ("model.keras", "checkpoint.keras", "log.csv", "loss.png", "run.json", "tokenizer/tokenizer.json"):
        assert (run_dir / name).exists(), name
    with open(run_dir / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    _assert_final_evaluation_repeats_the_last_validation(run_dir, json.loads((run_dir / "run.json").read_text())["evaluation"])
    text = generate_text(str(run_dir), "the cat", max_new_tokens=10)
    assert text.startswith("the cat") and len(text) > len("the cat")
    # A .keras file of the run works too: its last checkpoint holds the final weights.
    assert generate_text(str(run_dir / "checkpoint.keras"), "the cat", max_new_tokens=10) == text
    with pytest.raises(ValueError, match="holds no model.keras or checkpoint.keras"):
        load_run(str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.keras").write_bytes((run_dir / "model.keras").read_bytes())
    with pytest.raises(ValueError, match="has no tokenizer/ folder"):
        load_run(str(tmp_path / "elsewhere" / "model.keras"))
    beams = generate_text(str(run_dir), "the cat", max_new_tokens=10, num_beams=3)
    assert beams.startswith("the cat") and len(beams) > len("the cat")
    # Beam search must fit the context (32 tokens here): the default length
    # stops there, where an explicit longer one is refused by name.
    assert len(generate_text(str(run_dir), ["the cat", "the"], num_beams=2)[0]) == 32
    with pytest.raises(ValueError, match=r"Beam search must fit the context: prompt \(7\) \+ `max_new_tokens` \(100\)"):
        generate_text(str(run_dir), "the cat", max_new_tokens=100, num_beams=2)
    with pytest.raises(ValueError, match="`prompt` '' has no tokens"):
        generate_text(str(run_dir), "", max_new_tokens=2)
    # Repeated --prompt: one batch of prompts of different lengths, each text as if generated alone.
    prompts = ["the cat", "a big dog ran to the"]
    alone = [generate_text(str(run_dir), prompt, max_new_tokens=6) for prompt in prompts]
    assert generate_text(str(run_dir), prompts, max_new_tokens=6) == alone
    from kerasformer.cli import main

    capsys.readouterr()
    main(["generate", str(run_dir), "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "6"])
    assert capsys.readouterr().out == alone[0] + "\n\n" + alone[1] + "\n"
    main(["generate", str(run_dir), "--prompt", prompts[0], "--max-new-tokens", "9", "--num-beams", "3", "--length-penalty", "0"])
    assert capsys.readouterr().out == generate_text(str(run_dir), prompts[0], max_new_tokens=9, num_beams=3, length_penalty=0.0) + "\n"
    # A bad request is one line naming the argument, not a traceback.
    command, env = cli("generate", str(run_dir), "--prompt", "the cat", "--top-p", "1.5")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("kerasformer generate: error: `top_p` must be a finite number > 0 and <= 1 or None, got 1.5.")


def test_a_bf16_run_trains_in_bfloat16_generates_and_exports(tmp_path):
    from kerasformer.export import export_run
    from tests.serving.export_test import run_saved_model

    run_dir = tmp_path / "bf16"
    command, env = cli("train", "gpt", "--run-dir", str(run_dir), *TINY, "--precision", "bf16")
    result = subprocess.run(command, env=env, capture_output=True, text=True)  # A process of its own: the policy is global.
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    with open(run_dir / "log.csv") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    assert losses[-1] < losses[0]
    model = load_run(str(run_dir))[0]
    assert model.blocks[0].dtype_policy.name == "mixed_bfloat16"  # bfloat16 compute...
    assert {v.dtype for v in model.trainable_variables} == {"float32"}  # ...float32 weights.
    text = generate_text(str(run_dir), "the cat", max_new_tokens=10)
    assert text.startswith("the cat") and len(text) > len("the cat")
    path = export_run(str(run_dir), str(tmp_path / "saved_model"))
    exported = run_saved_model(path, {"generate_text": {"text": ["the cat"], "max_new_tokens": 10, "temperature": 0.0,
                                                        "top_k": 0, "top_p": 1.0, "seed": 0}})
    assert exported["generate_text"]["text"][0].startswith("the cat")


def test_train_cli_refuses_a_malformed_model_argument(capsys, tmp_path):
    from kerasformer.cli import main

    with pytest.raises(SystemExit):
        main(["train", "gpt", "--model", "num_layers"])
    assert "expected NAME=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # A misspelt name: it used to train the preset as it is.
        main(["train", "t5", "--run-dir", str(tmp_path), "--model", "num_layer=4", "--model", "max_sequence_length=32"])
    assert exit_info.value.code == 2
    assert "error: T5 has no argument 'num_layer', 'max_sequence_length'; its arguments are" in capsys.readouterr().err


def test_train_cli_documents_every_setting_and_refuses_bad_choices(capsys):
    from dataclasses import fields

    from kerasformer.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens.
    for f in fields(TrainConfig):
        if f.name != "overrides":
            assert "".join(f.metadata["help"].split()) in shown, f.name
    for flag, value in (("--precision", "fp8"), ("--tokenizer", "unigram"), ("--allocator", "jemalloc"), ("--steps", "x")):
        with pytest.raises(SystemExit):
            main(["train", "gpt", flag, value])
        error = capsys.readouterr().err
        assert f"argument {flag}: invalid" in error and repr(value) in error


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    run_dir = tmp_path / "resumable"
    command, env = cli("train", "gpt", "--run-dir", str(run_dir), *TINY)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metadata = run_dir / "backup" / "training_metadata.json"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if metadata.exists():
            try:
                if json.loads(metadata.read_text())["epoch"] >= 2:
                    break
            except (ValueError, KeyError):
                pass
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = json.loads(metadata.read_text())["epoch"]
    assert 2 <= killed_at < 4, "the run must be killed midway"
    assert not (run_dir / "model.keras").exists()

    # Other settings would continue another run from this one's weights: refused, the backup untouched.
    other, _ = cli("train", "gpt", "--run-dir", str(run_dir), *TINY, "--batch-size", "4", "--model", "num_heads=2")
    refused = subprocess.run(other, env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert (
        "holds a run trained with other settings (batch_size: 8 -> 4; overrides: {} -> {'num_heads': 2}); "
        "resume it with its settings (only steps, jit_compile, allocator may change)"
    ) in refused.stderr
    assert json.loads(metadata.read_text())["epoch"] == killed_at
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Epoch {killed_at + 1}/4" in result.stdout and "Epoch 1/4" not in result.stdout
    with open(run_dir / "log.csv") as f:
        epochs = [int(r["epoch"]) for r in csv.DictReader(f)]
    assert sorted(set(epochs)) == [0, 1, 2, 3]
    model, _, info = load_run(str(run_dir))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 40  # Steps were restored, not redone.
    assert info["evaluation"]["val_loss"] > 0


def test_a_run_killed_while_writing_its_backup_resumes_from_the_one_before(tmp_path):
    run_dir = tmp_path / "run"
    settings = ["--run-dir", str(run_dir), *TINY[:1], "20", *TINY[2:]]  # Two epochs of 10 steps.
    command, env = cli("train", "gpt", *settings)
    assert subprocess.run(command, env=env, capture_output=True).returncode == 0
    backup = run_dir / "backup"
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2  # Epochs done.
    weights = backup / "latest.weights.h5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # As a kill mid-write leaves it.
    (run_dir / "model.keras").unlink()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Epoch 2/2" in result.stdout and "Epoch 1/2" not in result.stdout  # The backup of epoch 1, not a fresh start.
    model, _, _ = load_run(str(run_dir))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 20
    # A finished run goes on for more steps.
    longer, _ = cli("train", "gpt", "--run-dir", str(run_dir), *TINY[:1], "30", *TINY[2:])
    result = subprocess.run(longer, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Epoch 3/3" in result.stdout and "Epoch 2/3" not in result.stdout
    model, _, info = load_run(str(run_dir))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 30 and info["config"]["steps"] == 30


def test_a_resumed_run_reads_its_saved_tokenizer_instead_of_training_another(tmp_path, monkeypatch):
    from kerasformer import data

    text_file = tmp_path / "lines.txt"
    text_file.write_text("\n".join(data.generated_language(600, seed=0)) + "\n")
    config = TrainConfig(task="gpt", data=str(text_file), tokenizer="bpe", vocabulary_size=60, run_dir=str(tmp_path / "run"),
                         steps=10, checkpoint_every=5, batch_size=4, sequence_length=16, warmup_steps=2, validation_steps=1)
    train(config)
    saved = {path.name: path.read_bytes() for path in (tmp_path / "run" / "tokenizer").rglob("*") if path.is_file()}
    # Another library version could train another vocabulary from the same text,
    # which the restored weights would read as other tokens: not trained again.
    monkeypatch.setattr(data, "train_tokenizer", lambda *args: pytest.fail("a resumed run trained a new tokenizer"))
    train(dataclasses.replace(config, steps=15))
    model, tokenizer, info = load_run(str(tmp_path / "run"))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 15 and info["config"]["steps"] == 15
    assert {path.name: path.read_bytes() for path in (tmp_path / "run" / "tokenizer").rglob("*") if path.is_file()} == saved
    # The subword vocabulary gives back the text's line breaks, and the run's text keeps them.
    sentence = data.generated_language(1, seed=1)[0]
    assert data.decode(tokenizer, data.encode(tokenizer, sentence + "\n" + sentence)) == sentence + "\n" + sentence


def test_saves_replace_a_file_only_once_complete(tmp_path):
    path = tmp_path / "checkpoint.keras"
    path.write_bytes(b"the previous checkpoint")

    def killed_midway(target):
        with open(target, "wb") as f:
            f.write(b"half of a zip")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(killed_midway, str(path))
    assert path.read_bytes() == b"the previous checkpoint" and os.listdir(tmp_path) == ["checkpoint.keras"]
    model = from_preset("gpt2-tiny", vocab_size=32)
    save_atomically(model.save, str(path))
    assert keras.saving.load_model(str(path)).count_params() == model.count_params()
    assert os.listdir(tmp_path) == ["checkpoint.keras"]


@pytest.mark.parametrize(
    "task,metric,overrides",
    [
        ("bert", "masked_token_accuracy", {}),
        ("t5", "exact_match", {}),
        ("transformer", "exact_match", {}),
        ("transformer", "exact_match", {"position_type": "learned"}),
    ],
)
def test_other_tasks_train_and_report_their_score(task, metric, overrides, tmp_path):
    config = TrainConfig(task=task, run_dir=str(tmp_path / task), steps=20, checkpoint_every=10, batch_size=16,
                         sequence_length=24, warmup_steps=5, validation_steps=2, learning_rate=3e-3, overrides=overrides)
    results = train(config)
    assert 0.0 <= results[metric] <= 1.0
    assert (tmp_path / task / "model.keras").exists()
    _assert_final_evaluation_repeats_the_last_validation(tmp_path / task, results)
    # The training loss averages over the tokens that count (masked / real
    # target tokens), not over every position: checked on a validation batch.
    model = load_run(str(tmp_path / task))[0]
    inputs, labels, weights = build_task(config)[3][0]
    logits = keras.ops.convert_to_numpy(model.predict(inputs, verbose=0)).astype("float64")
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    token_losses = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    loss = model.evaluate(inputs, labels, sample_weight=weights, batch_size=len(labels), verbose=0, return_dict=True)["loss"]
    assert 0 < weights.sum() < weights.size  # Padding / unmasked positions are left out...
    np.testing.assert_allclose(loss, (token_losses * weights).sum() / weights.sum(), rtol=1e-4)  # ...of the mean.
    if task == "bert":  # `kerasformer generate` fills each [MASK] with the model's most likely token.
        from kerasformer import data

        tokenizer = data.load_tokenizer(tmp_path / task / "tokenizer")
        words = [w for w in data.LANGUAGE_WORDS if w.isalpha()][:5]
        texts = [f"{words[0]} {data.MASK} {words[1]}", f"{data.MASK} {words[2]} {words[3]} {data.MASK} {words[4]}"]
        cls, sep, mask = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))
        for text, filled in zip(texts, generate_text(str(tmp_path / task), texts)):
            row = [cls] + [mask if w == data.MASK else tokenizer.token_to_id(w) for w in text.split()] + [sep]
            logits = keras.ops.convert_to_numpy(model({"token_ids": np.array([row]), "segment_ids": np.zeros((1, len(row)), "int32")}))[0]
            expected = [tokenizer.id_to_token(int(logits[i].argmax())) if t == mask else w
                        for i, (t, w) in enumerate(zip(row[1:-1], text.split()), start=1)]
            assert filled == " ".join(expected)
        with pytest.raises(ValueError, match=r"`prompt` 'no mask here' has no \[MASK\] to fill"):
            generate_text(str(tmp_path / task), "no mask here")
        for option in ({"num_beams": 2}, {"length_penalty": 2.0}, {"temperature": 0.5}):
            with pytest.raises(ValueError, match="fills each \\[MASK\\] with its most likely token"):
                generate_text(str(tmp_path / task), texts[0], **option)
    else:  # A batch of sources of different lengths (padded, masked) gives each one's text alone.
        sources = ["1 2", "3 0 4 7"]  # Digits to number words.
        alone = [generate_text(str(tmp_path / task), source, max_new_tokens=8) for source in sources]
        assert generate_text(str(tmp_path / task), sources, max_new_tokens=8) == alone
    if overrides:  # Learned positions: a table of --sequence-length tokens.
        # The CLI's default of 100 new tokens is capped by the table: the text ends there at the latest.
        assert isinstance(generate_text(str(tmp_path / task), "1 2"), str)
        with pytest.raises(ValueError, match=r"`prompt` '1 2 3 .*' \(25 tokens\) must fit the learned positions: at most 24 tokens"):
            generate_text(str(tmp_path / task), " ".join("123456789"[i % 9] for i in range(25)))


@pytest.mark.parametrize("task", ["gpt", "bert", "transformer"])
def test_a_learned_position_table_is_the_trained_length(task):
    # Positions past --sequence-length would never be trained; generation
    # would read them as noise instead of refusing (see generate's messages).
    def table_length(**overrides):
        config = TrainConfig(task=task, sequence_length=24, overrides={"position_type": "learned", **overrides})
        model = build_task(config)[1]
        return getattr(model, "backbone", model).max_sequence_length  # BERTMaskedLM wraps its BERT.

    assert table_length() == 24
    assert table_length(max_sequence_length=40) == 40  # An explicit --model max_sequence_length wins.


def test_bert_on_a_text_file_learns_a_wordpiece_vocabulary_of_that_text(tmp_path):
    from kerasformer import data

    words = "river mountain valley forest meadow harbor lantern orchard".split()
    lines = [" ".join(words[(i + j) % len(words)] for j in range(6)) for i in range(400)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines))
    config = TrainConfig(task="bert", data=str(corpus), run_dir=str(tmp_path / "bert"), steps=10, checkpoint_every=10,
                         batch_size=8, sequence_length=16, warmup_steps=2, validation_steps=1, vocabulary_size=200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config)
    # Keras's warning of variables without gradients ("did you forget to
    # provide a `loss`?") would name the pooler, which masked-LM training leaves out by design.
    assert not [w for w in caught if "Gradients do not exist" in str(w.message)]
    tokenizer = data.load_tokenizer(tmp_path / "bert" / "tokenizer")
    ids = data.encode(tokenizer, " ".join(words))
    unknown = data.SPECIAL_TOKENS.index(data.UNK)
    assert len(ids) >= len(words) and unknown not in ids  # The file's words, not the generated set's.
    assert [tokenizer.id_to_token(i) for i in range(len(data.SPECIAL_TOKENS))] == data.SPECIAL_TOKENS
    with pytest.raises(ValueError, match="`tokenizer` for the bert task must be 'wordpiece'"):
        train(TrainConfig(task="bert", data=str(corpus), tokenizer="char", run_dir=str(tmp_path / "char")))


@pytest.mark.parametrize("task,text,message", [
    ("gpt", "", "has no text"),
    ("gpt", "hello world\n" * 40, r"too short for `sequence_length`=64: its validation tenth has 48 tokens, fewer than 66"),
    ("bert", "", "has 0 sentences; a run needs at least 2"),
    ("bert", "one sentence\n\n", "has 1 sentences; a run needs at least 2"),
    ("t5", "no tab on this line\n", "has 0 source<TAB>target lines; a run needs at least 2"),
    ("transformer", "1\tone\n", "has 1 source<TAB>target lines; a run needs at least 2"),  # Once nothing was left to train on.
])
def test_a_data_file_too_small_to_split_is_named(task, text, message, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"`data` .*" + message):
        build_task(TrainConfig(task=task, data=str(path)))
    if task == "transformer":  # Two lines are enough: one to train on, one to validate on.
        path.write_text("1\tone\n2\ttwo\n")
        train_data, validation_data = build_task(TrainConfig(task=task, data=str(path), batch_size=4))[2:4]
        assert (len(train_data.labels), len(validation_data.labels)) == (1, 1)


def test_a_diverging_run_stops_before_its_checkpoint_backup_and_log_take_the_nan_weights(tmp_path):
    # The first update has the warm-up's learning rate 0, so steps 1 and 2 compute a finite loss; the
    # second update, at 1e30 without clipping, makes step 3's loss NaN or infinite.
    config = TrainConfig(run_dir=str(tmp_path / "run"), steps=4, checkpoint_every=1, warmup_steps=2, batch_size=4,
                         sequence_length=16, validation_steps=1, learning_rate=1e30, min_learning_rate=0.0, clipnorm=0.0)
    with pytest.raises(ValueError, match=r"Training diverged: the loss of step 3 is (nan|inf)\. The run's checkpoint "
                                         r"and backup keep the weights of step 2\."):
        train(config)
    with open(tmp_path / "run" / "log.csv") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == [0, 1]
    model = keras.saving.load_model(str(tmp_path / "run" / "checkpoint.keras"))
    assert all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in model.weights)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="checkpoint_every"):
        train(TrainConfig(steps=25, checkpoint_every=10))
    for setting, value, message in [
        ("learning_rate", -1.0, "`learning_rate` must be a finite number > 0, got -1.0."),  # Trained to NaN before.
        ("min_learning_rate", 0.1, "`min_learning_rate` must be a finite number >= 0 and <= 0.001, got 0.1."),
        ("beta_2", 1.0, "`beta_2` must be a finite number >= 0 and < 1, got 1.0."),
        ("weight_decay", float("nan"), "`weight_decay` must be a finite number >= 0, got nan."),
        ("dropout", 1.5, "`dropout` must be a finite number >= 0 and < 1 or None, got 1.5."),
        ("batch_size", 0, "`batch_size` must be a positive int, got 0."),
        ("warmup_steps", -1, "`warmup_steps` must be an int >= 0, got -1."),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            train(TrainConfig(**{setting: value}))
    with pytest.raises(ValueError, match="precision"):
        train(TrainConfig(precision="fp8"))
    with pytest.raises(ValueError, match="checkpoint_every"):
        train(TrainConfig(checkpoint_every=0))
    with pytest.raises(ValueError, match="jit_compile"):
        resolve_jit_compile("sometimes")


def test_auto_jit_compiles_with_xla_on_tensorflow_and_jax():
    # Keras's own "auto" leaves TensorFlow eager-graph on CPU-only machines.
    expected = {"tensorflow": True, "jax": "auto", "torch": "auto"}[keras.backend.backend()]
    assert resolve_jit_compile("auto") == expected
    assert resolve_jit_compile("false") is False and resolve_jit_compile("TRUE") is True
    model = from_preset("gpt2-tiny", vocab_size=50, num_layers=1)
    model.compile(optimizer="adam", loss="mse", jit_compile=resolve_jit_compile("auto"))
    assert model.jit_compile is (keras.backend.backend() != "torch")

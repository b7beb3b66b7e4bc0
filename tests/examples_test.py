"""Each example runs end to end with a tiny setting."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")


def run_example(name, *args, cwd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CI": "1"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_quickstart_learns_the_language(tmp_path):
    # Its default settings, as a user first runs it: the sampled text is words of
    # the language. A stalled run (loss ~2.8) samples letters ("thaoor .o ha he").
    from kerasformer.data import generated_language

    text = run_example("quickstart.py", cwd=tmp_path).strip().splitlines()[-1]
    assert text.startswith("the old cat")
    language = {word for sentence in generated_language(5000) for word in sentence.split()}
    words = text.split()[:-1]  # The last may be cut off by the token budget.
    known = [word for word in words if word in language]
    assert len(known) >= 0.7 * len(words) > 0, text


@pytest.mark.skipif(not os.path.isfile(SHAKESPEARE), reason="../shared/data/tinyshakespeare.txt is absent")
def test_train_gpt_shakespeare(tmp_path):
    out = run_example(
        "train_gpt_shakespeare.py", "--data", SHAKESPEARE, "--steps", "20", "--checkpoint-every", "10",
        "--architecture", "llama", cwd=tmp_path,
    )
    assert "evaluation: val_loss=" in out and "ROMEO:" in out


def test_train_bert_mlm(tmp_path):
    out = run_example("train_bert_mlm.py", "--steps", "20", "--checkpoint-every", "10", cwd=tmp_path)
    assert "masked_token_accuracy=" in out and "->" in out


def test_train_translation(tmp_path):
    out = run_example("train_translation.py", "--steps", "20", "--checkpoint-every", "10", cwd=tmp_path)
    assert "t5: exact match" in out and "transformer: exact match" in out

"""TokenCrossEntropy against a numpy log-softmax written here."""

import keras
import numpy as np
import pytest

from kerasformer.losses import TokenCrossEntropy


def numpy_cross_entropy(labels, logits):
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


@pytest.mark.parametrize("label_shape", ["plain", "trailing_axis"])
def test_matches_numpy_with_and_without_sample_weights(label_shape):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype("float32") * 3
    labels = rng.integers(0, 11, (3, 5)).astype("int32")
    weights = (rng.random((3, 5)) > 0.3).astype("float32")
    expected = numpy_cross_entropy(labels, logits)
    given = labels[..., None] if label_shape == "trailing_axis" else labels
    loss = TokenCrossEntropy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loss(given, logits)), expected.mean(), rtol=1e-5)
    weighted = keras.ops.convert_to_numpy(loss(given, logits, sample_weight=weights))
    np.testing.assert_allclose(weighted, (expected * weights).sum() / weights.size, rtol=1e-5)
    per_token = TokenCrossEntropy(reduction=None)(given, logits)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(per_token), expected, rtol=1e-5, atol=1e-6)


def test_gradient_is_softmax_minus_one_hot():
    logits = keras.Variable(np.random.default_rng(1).normal(size=(2, 3, 7)).astype("float32"))
    labels = np.array([[0, 6, 2], [3, 3, 1]], "int32")
    probs = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(-1, keepdims=True)
    expected = (probs - np.eye(7)[labels]) / labels.size
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        gradient = jax.grad(lambda v: TokenCrossEntropy()(labels, v))(logits.value)
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = TokenCrossEntropy()(labels, logits.value)
        gradient = tape.gradient(value, logits.value)
    else:
        import torch

        leaf = torch.tensor(logits.numpy(), requires_grad=True)
        TokenCrossEntropy()(labels, leaf).backward()
        gradient = leaf.grad
    np.testing.assert_allclose(keras.ops.convert_to_numpy(gradient), expected, atol=1e-6)


def test_round_trips_through_config():
    loss = TokenCrossEntropy(name="lm", reduction="sum")
    clone = TokenCrossEntropy.from_config(loss.get_config())
    assert (clone.name, clone.reduction) == ("lm", "sum")


def test_a_model_compiled_with_it_loads_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    from kerasformer.models import GPT

    model = GPT(vocab_size=20, num_layers=1, num_heads=2, hidden_dim=8)
    model.compile(optimizer="adamw", loss=TokenCrossEntropy())
    path = str(tmp_path / "model.keras")
    model.save(path)
    code = f"import keras, kerasformer.models; print(type(keras.saving.load_model({path!r}).loss).__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("TokenCrossEntropy")

"""TokenCrossEntropy against a numpy log-softmax written here."""

import keras
import numpy as np
import pytest

from kerasformer.losses import TokenCrossEntropy
from tests.conftest import class_name_after_fresh_load, value_and_gradients


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
    over_weights = TokenCrossEntropy(reduction="mean_with_sample_weight")(given, logits, sample_weight=weights)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(over_weights), (expected * weights).sum() / weights.sum(), rtol=1e-5)
    per_token = TokenCrossEntropy(reduction=None)(given, logits)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(per_token), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_value_and_gradient_match_numpy(compiled):
    """Gradient = (softmax - one-hot) * weight / count, eager and compiled.

    Compiled is XLA on TF (its own formula there, see losses.py) and jax.jit;
    torch has no compiled path of its own.
    """
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 7)).astype("float32") * 3
    labels = np.array([[0, 6, 2], [3, 3, 1]], "int32")
    weights = np.array([[1, 0, 1], [1, 1, 0.5]], "float32")
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected_value = (numpy_cross_entropy(labels, logits) * weights).sum() / labels.size
    expected = (probs - np.eye(7)[labels]) * weights[..., None] / labels.size
    loss = TokenCrossEntropy()
    value, (gradient,) = value_and_gradients(
        lambda v: loss(labels, v, sample_weight=weights), logits, compiled=compiled
    )
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    np.testing.assert_allclose(gradient, expected, atol=1e-6)


def test_round_trips_through_config():
    loss = TokenCrossEntropy(name="lm", reduction="sum")
    clone = TokenCrossEntropy.from_config(loss.get_config())
    assert (clone.name, clone.reduction) == ("lm", "sum")


def test_a_model_compiled_with_it_loads_in_a_fresh_process(tmp_path):
    from kerasformer.models import GPT

    model = GPT(vocab_size=20, num_layers=1, num_heads=2, hidden_dim=8)
    model.compile(optimizer="adamw", loss=TokenCrossEntropy())
    assert class_name_after_fresh_load(model, tmp_path, "loss", imports="kerasformer.models") == "TokenCrossEntropy"

import keras
import numpy as np
import pytest
import torch

from kerasformer.layers import FeedForward
from tests.conftest import random_inputs, save_and_reload, to_numpy

TORCH_ACTIVATIONS = {
    "relu": torch.nn.functional.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def weights(dense):
    return [torch.tensor(to_numpy(w), dtype=torch.float64) for w in dense.weights]


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_plain_ffn_equals_torch(activation):
    x = random_inputs(2, 5, 16)
    layer = FeedForward(intermediate_dim=24, activation=activation)
    out = to_numpy(layer(x))
    w1, b1 = weights(layer.intermediate_dense)
    w2, b2 = weights(layer.output_dense)
    expected = TORCH_ACTIVATIONS[activation](torch.tensor(x, dtype=torch.float64) @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("activation,act", [("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu")])
def test_gated_ffn_equals_torch(activation, act):
    x = random_inputs(2, 5, 16)
    layer = FeedForward(intermediate_dim=24, activation=activation, use_bias=False)
    out = to_numpy(layer(x))
    (up,), (gate,), (down,) = weights(layer.intermediate_dense), weights(layer.gate_dense), weights(layer.output_dense)
    xt = torch.tensor(x, dtype=torch.float64)
    expected = (TORCH_ACTIVATIONS[act](xt @ gate) * (xt @ up)) @ down
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)


def test_inner_width_defaults_to_four_times_the_model_width():
    layer = FeedForward()
    layer(random_inputs(1, 2, 12))
    assert tuple(layer.intermediate_dense.kernel.shape) == (12, 48)
    assert layer.count_params() == 12 * 48 + 48 + 48 * 12 + 12


def test_unknown_activation_names_the_argument():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(activation="tanhh")
    with pytest.raises(ValueError, match="`intermediate_dim` must be a positive int or None"):
        FeedForward(intermediate_dim=0)
    with pytest.raises(ValueError, match=r"`dropout` must be a finite number >= 0 and < 1, got 2.0"):
        FeedForward(dropout=2.0)  # Keras's Dropout had named its own `rate`, at build time.


def test_config_and_keras_file_round_trip(tmp_path):
    layer = FeedForward(intermediate_dim=20, activation="geglu", use_bias=False, dropout=0.1)
    assert FeedForward.from_config(layer.get_config()).get_config() == layer.get_config()
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, layer(inputs))
    x = random_inputs(2, 3, 8)
    np.testing.assert_allclose(to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6)

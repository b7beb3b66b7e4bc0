import warnings

import keras
import numpy as np
import pytest

from kerasformer.layers import FeedForward, MultiHeadAttention, Residual
from tests.conftest import random_inputs, save_and_reload, to_numpy


def numpy_layer_norm(x, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


def numpy_rms_norm(x, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


class Double(keras.layers.Layer):
    """A stand-in sublayer with a known function f(x) = 2x + 1."""

    def call(self, x, training=None):
        return 2.0 * x + 1.0


@pytest.mark.parametrize("norm_type,norm", [("layer_norm", numpy_layer_norm), ("rms_norm", numpy_rms_norm)])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_residual_applies_the_norm_before_or_after(norm_first, norm_type, norm):
    x = random_inputs(2, 3, 8) * 3 + 1
    out = to_numpy(Residual(Double(), norm_first=norm_first, norm_type=norm_type)(x))
    f = lambda v: 2.0 * v + 1.0  # noqa: E731
    expected = x + f(norm(x)) if norm_first else norm(x + f(x))
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("norm_type", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_padding_mask_reaches_attention_through_the_norm(norm_first, norm_type):
    # Attention reads the padding mask of its input, which a pre-norm gives it.
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    residual = Residual(MultiHeadAttention(num_heads=2), norm_first=norm_first, norm_type=norm_type)
    model = keras.Model(tokens, residual(embedded))
    ids = np.random.default_rng(0).integers(1, 20, (2, 6)).astype("int32")
    ids[:, 4:] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        padded = to_numpy(model(ids))
    assert not [w for w in caught if "mask" in str(w.message)]  # Keras warns where a layer drops it.
    np.testing.assert_allclose(padded[:, :4], to_numpy(model(ids[:, :4])), atol=1e-5)


def test_residual_dropout_only_in_training():
    x = random_inputs(4, 16, 32)
    layer = Residual(Double(), norm_first=True, dropout=0.5)
    np.testing.assert_allclose(to_numpy(layer(x)), to_numpy(layer(x, training=False)))
    trained = to_numpy(layer(x, training=True))
    branch = trained - x
    assert 0.3 < np.mean(branch == 0) < 0.7  # About half the branch dropped.


def test_unknown_norm_type_names_the_argument():
    with pytest.raises(ValueError, match="norm_type"):
        Residual(Double(), norm_type="batch_norm")
    with pytest.raises(ValueError, match=r"`dropout` must be a finite number >= 0 and < 1, got 1.5"):
        Residual(Double(), dropout=1.5)
    with pytest.raises(ValueError, match=r"`norm_epsilon` must be a finite number >= 0, got -1"):
        Residual(Double(), norm_epsilon=-1)  # Had given NaN for some inputs.


@pytest.mark.parametrize("norm_type,norm", [("layer_norm", numpy_layer_norm), ("rms_norm", numpy_rms_norm)])
def test_mixed_precision_norm_is_computed_in_float32(norm_type, norm):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = Residual(Double(), norm_first=True, norm_type=norm_type)
    # Values near 100 with unit spread: statistics in bfloat16 would lose the spread.
    x = keras.ops.cast(100 + random_inputs(2, 4, 256), "bfloat16")
    out = layer.norm(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    expected = norm(np.float64(to_numpy(keras.ops.cast(x, "float32"))))
    # Only the final rounding to bfloat16 (8 bits of mantissa) is allowed.
    np.testing.assert_allclose(
        to_numpy(keras.ops.cast(out, "float32")), expected, rtol=2**-8, atol=1e-3
    )


def test_config_and_keras_file_round_trip(tmp_path):
    layer = Residual(FeedForward(activation="gelu"), norm_first=True, norm_type="rms_norm", norm_epsilon=1e-6, dropout=0.1)
    config = layer.get_config()
    restored = Residual.from_config(config)
    assert restored.get_config() == config
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, layer(inputs))
    x = random_inputs(2, 3, 8)
    np.testing.assert_allclose(to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6)

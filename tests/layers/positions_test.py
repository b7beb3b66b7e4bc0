import keras
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from kerasformer.layers import (
    PositionEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
)
from tests.conftest import random_inputs, save_and_reload, to_numpy


@pytest.mark.parametrize("width", [16, 15])
def test_sinusoidal_values_equal_the_formula(width):
    T, start = 50, 7
    encoding = to_numpy(SinusoidalPositionEncoding()(np.zeros((2, T, width), "float32"), start_index=start))
    assert encoding.shape == (2, T, width)
    expected = np.zeros((T, width))
    for pos in range(T):
        for j in range(width):
            i = j // 2
            angle = (pos + start) / 10000 ** (2 * i / width)
            expected[pos, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    np.testing.assert_allclose(encoding[1], expected, atol=2e-5)


def test_sinusoidal_works_for_any_length_with_dynamic_shapes():
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, SinusoidalPositionEncoding()(inputs))
    for length in (3, 700):
        assert to_numpy(model(np.zeros((1, length, 8), "float32"))).shape == (1, length, 8)


def test_learned_table_slices_positions_and_errors_past_its_length():
    layer = PositionEmbedding(sequence_length=10)
    out = to_numpy(layer(np.zeros((2, 4, 6), "float32"), start_index=3))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_allclose(out[0], table[3:7])
    np.testing.assert_allclose(out[1], table[3:7])
    with pytest.raises(ValueError, match="sequence_length=10"):
        layer(np.zeros((1, 11, 6), "float32"))
    with pytest.raises(ValueError, match="sequence_length=10"):
        layer(np.zeros((1, 4, 6), "float32"), start_index=8)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the table's graph check is TF's; JAX and torch have none")
def test_learned_table_check_stays_out_of_graphs_xla_compiles():
    # XLA drops the assert, and logged "Ignoring Assert operator" at each compiled `generate` and `fit`.
    import os
    import subprocess
    import sys

    code = """if True:
        import numpy as np, tensorflow as tf
        from kerasformer.layers import PositionEmbedding
        layer = PositionEmbedding(sequence_length=8)
        x = np.zeros((1, 4, 6), "float32")
        step = lambda x, start: layer(x, start_index=start)  # A traced start, as in `generate`'s loop.
        tf.function(step, jit_compile=True)(x, tf.constant(2))
        graph = tf.function(step).get_concrete_function(x, tf.TensorSpec((), tf.int32)).graph
        print(any(op.type == "Assert" for op in graph.get_operations()))
        """
    env = {"TF_CPP_MIN_LOG_LEVEL": "0", "KERAS_BACKEND": "tensorflow", "PYTHONPATH": os.pathsep.join(sys.path), "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Ignoring Assert operator" not in result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True"  # A graph that is not compiled keeps the check.


def test_rotary_dot_product_depends_only_on_relative_offset():
    rotary = RotaryEmbedding()
    D = 16
    q, k = random_inputs(1, 1, 1, D), random_inputs(1, 1, 1, D, seed=1)

    def score(m, n):
        qm = to_numpy(rotary(q, start_index=m))
        kn = to_numpy(rotary(k, start_index=n))
        return float((qm * kn).sum())

    for offset in (0, 3, -5):
        reference = score(10, 10 - offset)
        for shift in (1, 17, 100):
            assert score(10 + shift, 10 - offset + shift) == pytest.approx(reference, abs=1e-4)
    assert score(10, 7) != pytest.approx(score(10, 2), abs=1e-3)
    # Position 0 is the identity, and the rotation keeps the norm.
    np.testing.assert_allclose(to_numpy(rotary(q)), q, atol=1e-6)
    np.testing.assert_allclose(
        np.linalg.norm(to_numpy(rotary(q, start_index=42))), np.linalg.norm(q), rtol=1e-5
    )


def test_rotary_matches_the_llama_reference_formula():
    B, T, H, D = 2, 5, 3, 8
    x = random_inputs(B, T, H, D)
    inv = 1.0 / 10000 ** (np.arange(0, D, 2) / D)
    angles = np.arange(T)[:, None] * inv[None]
    emb = np.concatenate([angles, angles], -1)[None, :, None, :]
    rotated = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
    expected = x * np.cos(emb) + rotated * np.sin(emb)
    np.testing.assert_allclose(to_numpy(RotaryEmbedding()(x)), expected, atol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_bias_buckets_equal_t5_reference(bidirectional):
    relative = np.arange(-300, 300)[None, :]
    layer = RelativePositionBias(num_heads=2, bidirectional=bidirectional)
    ours = to_numpy(layer.bucket(keras.ops.convert_to_tensor(relative, "int32")))
    expected = T5Attention._relative_position_bucket(
        torch.tensor(relative), bidirectional=bidirectional, num_buckets=32, max_distance=128
    ).numpy()
    np.testing.assert_array_equal(ours, expected)


def test_relative_bias_looks_up_the_table_per_head():
    layer = RelativePositionBias(num_heads=3, bidirectional=False)
    bias = to_numpy(layer(np.zeros((1, 4, 8), "float32"), np.zeros((1, 6, 8), "float32"), query_start=2))
    assert bias.shape == (1, 3, 4, 6)
    table = to_numpy(layer.bias_embeddings)
    relative = np.arange(6)[None, :] - (np.arange(4)[:, None] + 2)
    buckets = T5Attention._relative_position_bucket(
        torch.tensor(relative), bidirectional=False, num_buckets=32, max_distance=128
    ).numpy()
    np.testing.assert_allclose(bias[0], table[buckets].transpose(2, 0, 1))


@pytest.mark.parametrize("make, message", [
    # Each had failed far from the argument (a broadcast, a division by zero) or computed nonsense.
    (lambda: RotaryEmbedding()(random_inputs(2, 6, 8)),
     r"RotaryEmbedding's `inputs` must have shape \(batch, length, heads, head_dim\), got shape \(2, 6, 8\)"),
    (lambda: RotaryEmbedding(max_wavelength=-1), r"`max_wavelength` must be a finite number > 0, got -1"),
    (lambda: RotaryEmbedding(scaling_factor=0), r"`scaling_factor` must be a finite number > 0, got 0"),
    (lambda: SinusoidalPositionEncoding()(random_inputs(3, 5)),
     r"SinusoidalPositionEncoding's `inputs` must have shape \(batch, length, width\), got shape \(3, 5\)"),
    (lambda: PositionEmbedding(8)(random_inputs(3, 5)), r"PositionEmbedding's `inputs` must have shape \(batch, length, width\)"),
    (lambda: PositionEmbedding(8)(random_inputs(2, 6, 8), start_index=-2), r"`start_index` must be >= 0, got -2"),
    (lambda: RelativePositionBias(num_heads=0), r"`num_heads` must be a positive int, got 0"),
    (lambda: RelativePositionBias(num_heads=2, num_buckets=2), r"`num_buckets` must be an int >= 4, got 2"),
    (lambda: RelativePositionBias(num_heads=2, num_buckets=32, max_distance=8), r"`max_distance` must be an int >= 9, got 8"),
])
def test_bad_arguments_name_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_causal_relative_bias_takes_as_few_as_two_buckets():
    bias = RelativePositionBias(num_heads=1, num_buckets=2, max_distance=2, bidirectional=False)
    assert tuple(bias(random_inputs(1, 4, 8)).shape) == (1, 1, 4, 4)


@pytest.mark.parametrize(
    "layer",
    [
        SinusoidalPositionEncoding(max_wavelength=500),
        PositionEmbedding(sequence_length=12),
        RotaryEmbedding(max_wavelength=500, scaling_factor=2.0),
    ],
    ids=["sinusoidal", "learned", "rotary"],
)
def test_config_and_keras_file_round_trip(layer, tmp_path):
    restored = layer.__class__.from_config(layer.get_config())
    assert restored.get_config() == layer.get_config()
    shape = (None, 2, 8) if isinstance(layer, RotaryEmbedding) else (8,)
    inputs = keras.Input((None, *shape[1:]) if len(shape) == 3 else (None, 8))
    model = keras.Model(inputs, layer(inputs))
    x = random_inputs(2, 5, *((2, 8) if len(shape) == 3 else (8,)))
    np.testing.assert_allclose(to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6)

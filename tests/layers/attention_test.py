import warnings

import keras
import numpy as np
import pytest

from kerasformer.layers import MultiHeadAttention, attention
from tests.conftest import random_inputs, save_and_reload, to_numpy, value_and_gradients


def numpy_attention(layer, query, value=None, mask=None, bias=None):
    """softmax(QK^T/sqrt(d) + bias) V with the layer's weights, in float64 numpy."""
    value = query if value is None else value
    w = {
        name: [np.float64(to_numpy(v)) for v in getattr(layer, name).weights]
        for name in ("query_dense", "key_dense", "value_dense", "output_dense")
    }
    q = np.einsum("btc,chd->bthd", query, w["query_dense"][0]) + w["query_dense"][1]
    k = np.einsum("bsc,ckd->bskd", value, w["key_dense"][0]) + w["key_dense"][1]
    v = np.einsum("bsc,ckd->bskd", value, w["value_dense"][0]) + w["value_dense"][1]
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshd->bthd", weights, v)
    output = np.einsum("bthd,hdc->btc", heads, w["output_dense"][0]) + w["output_dense"][1]
    return output, weights


def padding(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("return_scores", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", ["plain", "padding", "causal", "cross", "gqa", "bias"])
def test_attention_equals_numpy_reference(case, return_scores):
    B, T, S, C = 2, 6, 9, 32
    x = random_inputs(B, T, C)
    memory = random_inputs(B, S, C, seed=1) if case == "cross" else None
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2 if case == "gqa" else None)
    kwargs, mask, bias = {}, None, None
    if case == "padding":
        kwargs["padding_mask"] = padding([6, 3], T)
        mask = np.broadcast_to(kwargs["padding_mask"][:, None, :], (B, T, T))
    if case == "causal":
        kwargs["use_causal_mask"] = True
        mask = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
    if case == "bias":
        bias = random_inputs(1, 4, T, T, seed=2)
        kwargs["attention_bias"] = bias
    outputs = layer(x, memory, return_attention_scores=return_scores, **kwargs)
    expected, expected_weights = numpy_attention(
        layer, np.float64(x), None if memory is None else np.float64(memory), mask, bias
    )
    if return_scores:
        outputs, scores = outputs
        np.testing.assert_allclose(to_numpy(scores), expected_weights, atol=1e-5)
    np.testing.assert_allclose(to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("return_scores", [False, True], ids=["fused", "explicit"])
def test_a_single_key_equals_numpy_reference_without_a_warning(return_scores):
    # A one-token call (a GPT's first token, a decoder's start token) attends
    # over one key; Keras's softmax warns over an axis of size 1.
    x = random_inputs(2, 1, 32)
    layer = MultiHeadAttention(num_heads=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        outputs = layer(x, use_causal_mask=True, return_attention_scores=return_scores)
    expected, expected_weights = numpy_attention(layer, np.float64(x))
    if return_scores:
        outputs, scores = outputs
        np.testing.assert_allclose(to_numpy(scores), expected_weights, atol=1e-6)
    np.testing.assert_allclose(to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("blocks", [2, 3, 4])  # 3 does not divide T: the last block is longer
def test_causal_query_blocks_equal_numpy_reference(blocks, monkeypatch):
    """The explicit path's causal blocks (JAX's default at T >= 128), forced on every backend."""
    monkeypatch.setattr(attention, "causal_query_blocks", lambda query_length, key_length: blocks)
    B, T, C = 2, 128, 32
    x = random_inputs(B, T, C)
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2)
    layer.fused_attention = False  # torch would take SDPA
    outputs = layer(x, use_causal_mask=True)
    mask = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
    expected, _ = numpy_attention(layer, np.float64(x), None, mask)
    np.testing.assert_allclose(to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("used", [(0, 1, 2), (0, 2)], ids=["all_parts", "key_unused"])
def test_split_columns_values_and_gradient_match_numpy(used, compiled):
    """The fused q/k/v projection's split (GQA widths): the blocks, and as gradient their upstreams side by side."""
    sizes, bounds = (6, 2, 2), (0, 6, 8, 10)
    y = random_inputs(5, 10, seed=1)
    upstreams = [random_inputs(5, size, seed=2 + i) for i, size in enumerate(sizes)]

    def weighted_sum(tensor):
        parts = attention.split_columns(tensor, sizes)
        assert [tuple(part.shape) for part in parts] == [(5, size) for size in sizes]
        return sum(keras.ops.sum(keras.ops.multiply(parts[i], upstreams[i])) for i in used)

    value, (gradient,) = value_and_gradients(weighted_sum, y, compiled=compiled)
    blocks = [y[:, start:end] for start, end in zip(bounds[:-1], bounds[1:])]
    np.testing.assert_allclose(value, sum(np.sum(blocks[i] * upstreams[i]) for i in used), rtol=1e-5)
    expected = np.concatenate([upstreams[i] if i in used else np.zeros_like(upstreams[i]) for i in range(3)], axis=1)
    np.testing.assert_array_equal(gradient, expected)


def test_split_columns_gradient_is_one_concatenation():
    """Not the slices' gradient, pads summed, which XLA on CPU ran as passes over the full width."""
    sizes = (6, 2, 2)
    y = random_inputs(5, 10)

    def weighted_sum(tensor):
        parts = attention.split_columns(tensor, sizes)
        return sum(keras.ops.sum(part) * (i + 1.0) for i, part in enumerate(parts))

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        program = str(jax.make_jaxpr(jax.grad(weighted_sum))(y))
        assert "concatenate" in program and "pad" not in program, program
    elif backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def gradient(tensor):
            with tf.GradientTape() as tape:
                tape.watch(tensor)
                value = weighted_sum(tensor)
            return tape.gradient(value, tensor)

        graph = gradient.get_concrete_function(tf.TensorSpec((5, 10))).graph
        types = {op.type for op in graph.get_operations()}
        assert "ConcatV2" in types and not types & {"Pad", "AddN", "StridedSliceGrad"}, types
    else:
        import torch

        parts = attention.split_columns(torch.tensor(y, requires_grad=True), sizes)
        assert {type(part.grad_fn).__name__ for part in parts} == {"SplitWithSizesBackward0"}


def test_causal_query_blocks_only_for_long_square_static_self_attention():
    split = 4 if keras.backend.backend() == "jax" else 1  # Measured: no gain under XLA on TF.
    assert attention.causal_query_blocks(128, 128) == split
    assert attention.causal_query_blocks(256, 256) == split
    assert attention.causal_query_blocks(64, 64) == 1
    assert attention.causal_query_blocks(1, 128) == 1
    assert attention.causal_query_blocks(None, None) == 1


def test_causal_rows_have_exactly_zero_weight_on_future_keys():
    layer = MultiHeadAttention(num_heads=2)
    _, scores = layer(random_inputs(3, 7, 16), use_causal_mask=True, return_attention_scores=True)
    scores = to_numpy(scores)
    future = np.triu(np.ones((7, 7), bool), k=1)
    assert np.all(scores[..., future] == 0.0)
    assert np.all(scores[..., ~future] > 0.0)


def test_padding_and_explicit_mask_are_merged():
    B, T = 2, 5
    x = random_inputs(B, T, 16)
    layer = MultiHeadAttention(num_heads=2)
    pad = padding([5, 4], T)
    explicit = np.ones((B, T, T), bool)
    explicit[:, :, 0] = False  # Nobody looks at the first key.
    _, scores = layer(
        x, padding_mask=pad, attention_mask=explicit, use_causal_mask=True,
        return_attention_scores=True,
    )
    scores = to_numpy(scores)
    assert np.all(scores[1, :, 1:, 4] == 0)  # Padding (row 0 has no allowed key).
    assert np.all(scores[:, :, 1:, 0] == 0)  # Explicit mask.
    assert np.all(scores[:, :, 2, 3:] == 0)  # Causal.
    # A row with no allowed key (row 0) stays finite rather than NaN.
    assert np.all(np.isfinite(scores))


def test_fully_masked_rows_stay_finite_on_the_fused_path():
    x = random_inputs(2, 4, 16)
    out = MultiHeadAttention(num_heads=2)(x, padding_mask=np.zeros((2, 4), bool))
    assert np.all(np.isfinite(to_numpy(out)))


def test_keras_implicit_mask_is_used_and_propagated():
    tokens = np.array([[5, 3, 7, 0, 0], [2, 9, 4, 8, 1]])
    embedding = keras.layers.Embedding(10, 16, mask_zero=True)
    layer = MultiHeadAttention(num_heads=2)
    embedded = embedding(tokens)
    implicit = layer(embedded)
    explicit = layer(to_numpy(embedded), padding_mask=tokens != 0)
    unmasked = layer(to_numpy(embedded))
    np.testing.assert_allclose(to_numpy(implicit), to_numpy(explicit), atol=1e-6)
    assert not np.allclose(to_numpy(implicit)[0], to_numpy(unmasked)[0], atol=1e-4)

    # In a functional model the mask flows Embedding -> attention -> output.
    inputs = keras.Input((None,), dtype="int32")
    outputs = MultiHeadAttention(num_heads=2)(keras.layers.Embedding(10, 16, mask_zero=True)(inputs))
    assert outputs._keras_mask is not None
    model = keras.Model(inputs, outputs)
    changed = tokens.copy()
    changed[0, 3:] = 0
    a, b = to_numpy(model(tokens)), to_numpy(model(changed))
    np.testing.assert_allclose(a[0, :3], b[0, :3], atol=1e-6)


def test_an_explicit_padding_mask_wins_over_the_implicit_one():
    tokens = np.array([[5, 3, 7, 0, 0]])
    embedded = keras.layers.Embedding(10, 16, mask_zero=True)(tokens)
    layer = MultiHeadAttention(num_heads=2)
    everything = np.ones((1, 5), bool)
    np.testing.assert_allclose(
        to_numpy(layer(embedded, padding_mask=everything)),
        to_numpy(layer(to_numpy(embedded))),
        atol=1e-6,
    )


@pytest.mark.parametrize("num_key_value_heads", [4, 1])
@pytest.mark.parametrize("use_rotary", [False, True])
def test_incremental_decoding_with_cache_equals_full_causal_pass(use_rotary, num_key_value_heads):
    B, T, C, H = 2, 7, 32, 4
    x = random_inputs(B, T, C)
    layer = MultiHeadAttention(
        num_heads=H, num_key_value_heads=num_key_value_heads, use_rotary=use_rotary
    )
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = np.zeros((B, 2, num_key_value_heads, T, C // H), "float32")
    steps = []
    for t in range(T):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
    # A prompt of 3 tokens at once, then single tokens.
    cache = np.zeros((B, 2, num_key_value_heads, T, C // H), "float32")
    out, cache = layer(x[:, :3], cache=cache, cache_update_index=0)
    np.testing.assert_allclose(to_numpy(out), full[:, :3], atol=1e-5)
    out, cache = layer(x[:, 3:4], cache=cache, cache_update_index=3)
    np.testing.assert_allclose(to_numpy(out), full[:, 3:4], atol=1e-5)


def test_cross_attention_cache_is_computed_once_and_equals_no_cache():
    x, memory = random_inputs(2, 3, 16), random_inputs(2, 5, 24, seed=1)
    layer = MultiHeadAttention(num_heads=2)
    expected = to_numpy(layer(x, memory))
    cache = layer.compute_cache(memory)
    assert tuple(cache.shape) == (2, 2, 2, 5, 8)  # (B, 2, K, S, D)
    out, same_cache = layer(x, cache=cache)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(same_cache), to_numpy(cache))


def test_scale_argument_replaces_inverse_sqrt_head_dim():
    x = random_inputs(1, 4, 16)
    layer = MultiHeadAttention(num_heads=2, scale=1.0)
    _, scores = layer(x, return_attention_scores=True)
    reference = MultiHeadAttention(num_heads=2)
    reference.build((None, None, 16))
    for source, target in zip(layer.weights, reference.weights):
        target.assign(source * (8**0.25) if "query" in target.path or "key" in target.path else source)
    _, expected = reference(x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected), atol=1e-5)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(num_heads=3)(random_inputs(1, 4, 16))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        MultiHeadAttention(num_heads=4, num_key_value_heads=3)
    layer = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match="padding_mask"):
        layer(random_inputs(1, 4, 16), padding_mask=np.ones((1, 4, 4), bool))
    with pytest.raises(ValueError, match="attention_mask"):
        layer(random_inputs(1, 4, 16), attention_mask=np.ones((1, 4), bool))
    # Lengths that do not match the keys (queries) are named, not left to fail in a broadcast.
    with pytest.raises(ValueError, match=r"`padding_mask` must have shape \(batch, 4\) to match the keys, got shape \(1, 3\)"):
        layer(random_inputs(1, 4, 16), padding_mask=np.ones((1, 3), bool))
    with pytest.raises(ValueError, match=r"`attention_mask` must have shape \(batch, 4, 4\) .* got shape \(1, 4, 5\)"):
        layer(random_inputs(1, 4, 16), attention_mask=np.ones((1, 4, 5), bool))
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(num_heads=2, dropout=1.5)
    with pytest.raises(ValueError, match=r"`head_dim` must be a positive int, got 0"):
        MultiHeadAttention(num_heads=2, head_dim=0)  # Had failed in a division by zero.
    with pytest.raises(ValueError, match=r"`scale` must be a finite number > 0 or None, got 0"):
        MultiHeadAttention(num_heads=2, scale=0)
    # Shapes that failed deep inside Keras (an IndexError; an odd rotary head width at its first call).
    with pytest.raises(ValueError, match=r"`query` must have shape \(batch, length, width\), got shape \(4, 16\)"):
        MultiHeadAttention(num_heads=2)(random_inputs(4, 16))
    with pytest.raises(ValueError, match=r"`value` must have shape \(batch, length, width\)"):
        MultiHeadAttention(num_heads=2)(random_inputs(1, 4, 16), random_inputs(4, 16))
    with pytest.raises(ValueError, match=r"`head_dim`, here 3\) must be even"):
        MultiHeadAttention(num_heads=4, use_rotary=True).build((1, 4, 12))
    # Token ids for embeddings, and caches of the wrong size, had failed inside a backend op
    # (or, for ids on JAX and torch, been computed with).
    with pytest.raises(ValueError, match=r"`query` must be floating-point .* got dtype int32"):
        MultiHeadAttention(num_heads=2)(np.ones((1, 4, 16), "int32"))
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2)
    x = random_inputs(1, 3, 16)
    layer(x)
    with pytest.raises(ValueError, match=r"`cache` must have shape \(batch, 2, 2, length, 4\) .* got shape \(1, 2, 4, 8, 4\)"):
        layer(x, cache=np.zeros((1, 2, 4, 8, 4), "float32"), cache_update_index=0)
    with pytest.raises(ValueError, match=r"`cache_update_index` \(6\) with 3 new position\(s\) does not fit `cache` of length 8"):
        layer(x, cache=np.zeros((1, 2, 2, 8, 4), "float32"), cache_update_index=6)
    with pytest.raises(ValueError, match=r"`cache` holds 2 positions, fewer than the 3 new ones"):
        layer(x, cache=np.zeros((1, 2, 2, 2, 4), "float32"), cache_update_index=0)
    with pytest.raises(ValueError, match=r"`cache` must be floating-point"):
        layer(x, cache=np.zeros((1, 2, 2, 8, 4), "int32"), cache_update_index=0)
    # A batch of one query row against two key rows had been broadcast on JAX.
    with pytest.raises(ValueError, match=r"`query` and `value` must have the same batch size .* got \{'query': 1, 'value': 2\}"):
        layer(x, random_inputs(2, 5, 16))


def test_head_dim_need_not_divide_the_width():
    layer = MultiHeadAttention(num_heads=3, head_dim=8)
    assert tuple(layer(random_inputs(2, 4, 16)).shape) == (2, 4, 16)
    assert tuple(layer.query_dense.kernel.shape) == (16, 3, 8)


def test_config_and_keras_file_round_trip(tmp_path):
    layer = MultiHeadAttention(
        num_heads=4, num_key_value_heads=2, use_rotary=True, scale=0.5, use_bias=False
    )
    restored = MultiHeadAttention.from_config(layer.get_config())
    assert restored.get_config() == layer.get_config()

    inputs = keras.Input((None, 32))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    x = random_inputs(2, 5, 32)
    np.testing.assert_allclose(
        to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6
    )

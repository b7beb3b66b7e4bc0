import keras
import numpy as np
import pytest
import torch

from kerasformer.layers import DecoderBlock, EncoderBlock, PositionEmbedding
from tests.conftest import random_inputs, save_and_reload, to_numpy

B, T, S, C, H, F = 2, 7, 5, 32, 4, 64


def _tensor(x):
    return torch.tensor(np.asarray(to_numpy(x)), dtype=torch.float32)


def copy_attention(ours, theirs):
    """Our (C, H, D) EinsumDense kernels into torch's packed in-projection."""
    q, k, v, o = ours.query_dense, ours.key_dense, ours.value_dense, ours.output_dense
    C = q.kernel.shape[0]  # The model width.
    with torch.no_grad():
        theirs.in_proj_weight.copy_(
            torch.cat([_tensor(d.kernel).reshape(C, C).T for d in (q, k, v)])
        )
        theirs.in_proj_bias.copy_(torch.cat([_tensor(d.bias).reshape(C) for d in (q, k, v)]))
        theirs.out_proj.weight.copy_(_tensor(o.kernel).reshape(C, C).T)
        theirs.out_proj.bias.copy_(_tensor(o.bias))


def copy_dense(ours, theirs):
    with torch.no_grad():
        theirs.weight.copy_(_tensor(ours.kernel).T)
        theirs.bias.copy_(_tensor(ours.bias))


def copy_norm(ours, theirs):
    with torch.no_grad():
        theirs.weight.copy_(_tensor(ours.gamma))
        theirs.bias.copy_(_tensor(ours.beta))


def copy_feedforward(block, reference, norm):
    copy_dense(block.feedforward.sublayer.intermediate_dense, reference.linear1)
    copy_dense(block.feedforward.sublayer.output_dense, reference.linear2)
    copy_norm(block.feedforward.norm, norm)


def copy_encoder_block(block, reference):
    """An `EncoderBlock`'s weights into a `torch.nn.TransformerEncoderLayer`."""
    copy_attention(block.self_attention.sublayer, reference.self_attn)
    copy_norm(block.self_attention.norm, reference.norm1)
    copy_feedforward(block, reference, reference.norm2)


def copy_decoder_block(block, reference):
    """A `DecoderBlock`'s weights into a `torch.nn.TransformerDecoderLayer`."""
    copy_attention(block.self_attention.sublayer, reference.self_attn)
    copy_norm(block.self_attention.norm, reference.norm1)
    copy_attention(block.cross_attention.sublayer, reference.multihead_attn)
    copy_norm(block.cross_attention.norm, reference.norm2)
    copy_feedforward(block, reference, reference.norm3)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_block_equals_torch_encoder_layer(norm_first):
    x = random_inputs(B, T, C)
    lengths = np.array([T, 4])
    pad = np.arange(T)[None] < lengths[:, None]
    block = EncoderBlock(num_heads=H, intermediate_dim=F, norm_first=norm_first)
    ours = to_numpy(block(x, padding_mask=pad))

    reference = torch.nn.TransformerEncoderLayer(
        C, H, F, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    copy_encoder_block(block, reference)
    expected = reference(torch.tensor(x), src_key_padding_mask=torch.tensor(~pad)).detach().numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_block_equals_torch_decoder_layer(norm_first):
    x, memory = random_inputs(B, T, C), random_inputs(B, S, C, seed=1)
    memory_pad = np.arange(S)[None] < np.array([S, 3])[:, None]
    block = DecoderBlock(num_heads=H, intermediate_dim=F, norm_first=norm_first)
    ours = to_numpy(block(x, memory, encoder_padding_mask=memory_pad))

    reference = torch.nn.TransformerDecoderLayer(
        C, H, F, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    copy_decoder_block(block, reference)
    expected = reference(
        torch.tensor(x),
        torch.tensor(memory),
        tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
        tgt_is_causal=True,
        memory_key_padding_mask=torch.tensor(~memory_pad),
    ).detach().numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_encoder_block_parameter_count_at_base_size():
    block = EncoderBlock(num_heads=8, intermediate_dim=2048)
    block.build((None, None, 512))
    # 4d^2 + 4d attention, 2 d d_ff + d_ff + d FFN, 2 x 2d LayerNorm.
    assert block.count_params() == 3_152_384


def test_decoder_stack_is_causal():
    vocab, length = 50, 10
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab, C)(inputs)
    x = x + PositionEmbedding(sequence_length=length)(x)
    for _ in range(3):
        x = DecoderBlock(num_heads=H, norm_first=True, activation="gelu")(x)
    model = keras.Model(inputs, keras.layers.Dense(vocab)(x))
    tokens = np.random.default_rng(0).integers(1, vocab, (2, length))
    base = to_numpy(model(tokens))
    for t in range(length - 1):
        changed = tokens.copy()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % vocab
        out = to_numpy(model(changed))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :], atol=1e-4)


@pytest.mark.parametrize("cross", [False, True], ids=["decoder_only", "encoder_decoder"])
def test_stack_decoding_with_cache_equals_full_pass(cross):
    x, memory = random_inputs(B, T, C), random_inputs(B, S, C, seed=1)
    blocks = [
        DecoderBlock(num_heads=H, num_key_value_heads=2, use_rotary=True, norm_first=True, activation="swiglu", norm_type="rms_norm")
        for _ in range(2)
    ]
    encoder = memory if cross else None
    full = x
    for block in blocks:
        full = block(full, encoder)
    full = to_numpy(full)

    head_dim = C // H
    caches = [np.zeros((B, 2, 2, T, head_dim), "float32") for _ in blocks]  # (B, 2, K, S, D)
    cross_caches = [block.cross_attention.sublayer.compute_cache(memory) if cross else None for block in blocks]
    outputs = []
    for t in range(T):
        h = x[:, t : t + 1]
        for i, block in enumerate(blocks):
            h, caches[i] = block(
                h, self_attention_cache=caches[i], cache_update_index=t, cross_attention_cache=cross_caches[i]
            )
        outputs.append(to_numpy(h))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_blocks_return_attention_scores():
    x, memory = random_inputs(B, T, C), random_inputs(B, S, C, seed=1)
    out, scores = EncoderBlock(num_heads=H)(x, return_attention_scores=True)
    assert tuple(scores.shape) == (B, H, T, T)
    out, self_scores, cross_scores = DecoderBlock(num_heads=H)(x, memory, return_attention_scores=True)
    assert tuple(self_scores.shape) == (B, H, T, T)
    assert tuple(cross_scores.shape) == (B, H, T, S)
    assert np.all(to_numpy(self_scores)[..., np.triu(np.ones((T, T), bool), 1)] == 0)


def test_implicit_mask_from_embedding_is_honored_and_propagated():
    tokens = np.array([[4, 8, 15, 16, 0, 0], [23, 42, 7, 1, 2, 3]])
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, C, mask_zero=True)(inputs)
    x = EncoderBlock(num_heads=H)(x)
    assert x._keras_mask is not None
    x = EncoderBlock(num_heads=H)(x)
    model = keras.Model(inputs, x)
    base = to_numpy(model(tokens))
    changed = tokens.copy()
    changed[0, 5] = 0
    changed[0, 4] = 0
    np.testing.assert_allclose(to_numpy(model(changed))[0, :4], base[0, :4], atol=1e-5)
    # Padding a real sequence further does not change its real positions.
    longer = np.concatenate([tokens, np.zeros((2, 3), tokens.dtype)], axis=1)
    np.testing.assert_allclose(to_numpy(model(longer))[:, :6][0, :4], base[0, :4], atol=1e-5)
    np.testing.assert_allclose(to_numpy(model(longer))[1, :6], base[1], atol=1e-5)


def test_mixed_precision_runs_with_float32_softmax():
    keras.config.set_dtype_policy("mixed_bfloat16")
    x, memory = random_inputs(B, T, C), random_inputs(B, S, C, seed=1)
    block = DecoderBlock(num_heads=H, norm_first=True)
    out, self_scores, cross_scores = block(x, memory, return_attention_scores=True)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert block.self_attention.sublayer.query_dense.kernel.dtype == "float32"
    for scores in (self_scores, cross_scores):
        assert keras.backend.standardize_dtype(scores.dtype) == "float32"
        np.testing.assert_allclose(to_numpy(scores).sum(-1), 1.0, atol=1e-6)
    assert np.all(np.isfinite(to_numpy(keras.ops.cast(block(x, memory), "float32"))))


def test_tiny_model_trains_with_fit():
    vocab, length = 16, 12
    rng = np.random.default_rng(0)
    starts = rng.integers(0, vocab, (256, 1))
    steps = rng.integers(1, 4, (256, 1))
    sequences = (starts + steps * np.arange(length + 1)) % vocab  # Learnable rule.
    inputs = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocab, 32)(inputs)
    x = x + PositionEmbedding(sequence_length=length)(x)
    x = DecoderBlock(num_heads=2, intermediate_dim=64, norm_first=True)(x)
    x = DecoderBlock(num_heads=2, intermediate_dim=64, norm_first=True)(x)
    model = keras.Model(inputs, keras.layers.Dense(vocab)(x))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(sequences[:, :-1], sequences[:, 1:], batch_size=32, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="activation"):
        EncoderBlock(num_heads=2, activation="sigmoidal")
    # The block's own names, not those of its sublayers (`dropout` of the attention, Keras's `rate`).
    with pytest.raises(ValueError, match=r"`attention_dropout` must be a finite number >= 0 and < 1, got 1.0"):
        EncoderBlock(num_heads=2, attention_dropout=1.0)
    with pytest.raises(ValueError, match=r"`dropout` must be a finite number >= 0 and < 1, got -1.0"):
        DecoderBlock(num_heads=2, dropout=-1.0)
    with pytest.raises(ValueError, match="norm_type"):
        DecoderBlock(num_heads=2, norm_type="group_norm")
    with pytest.raises(ValueError, match="num_heads"):
        EncoderBlock(num_heads=5)(random_inputs(1, 3, 32))
    with pytest.raises(ValueError, match="padding_mask"):
        EncoderBlock(num_heads=2)(random_inputs(1, 3, 32), padding_mask=np.ones((1, 3, 3), bool))
    decoder_only = DecoderBlock(num_heads=2)
    decoder_only(random_inputs(1, 3, 32))
    with pytest.raises(ValueError, match="encoder_outputs"):
        decoder_only(random_inputs(1, 3, 32), random_inputs(1, 3, 32))
    with pytest.raises(ValueError, match=r"`inputs` must have shape \(batch, length, width\), got shape \(3, 32\)"):
        EncoderBlock(num_heads=2)(random_inputs(3, 32))
    with pytest.raises(ValueError, match=r"`encoder_outputs` must have shape \(batch, length, width\)"):
        DecoderBlock(num_heads=2)(random_inputs(1, 3, 32), random_inputs(3, 32))
    # Token ids for embeddings: TF failed in an add, JAX and torch computed with them.
    with pytest.raises(ValueError, match=r"`inputs` must be floating-point .* got dtype int32"):
        EncoderBlock(num_heads=2)(np.ones((1, 3, 32), "int32"))
    with pytest.raises(ValueError, match=r"`inputs` must be floating-point"):
        DecoderBlock(num_heads=2)(np.ones((1, 3, 32), "int32"))
    with pytest.raises(ValueError, match=r"`encoder_outputs` must be floating-point"):
        DecoderBlock(num_heads=2)(random_inputs(1, 3, 32), np.ones((1, 3, 32), "int32"))
    with pytest.raises(ValueError, match=r"`inputs` and `encoder_outputs` must have the same batch size .* got \{'inputs': 1, 'encoder_outputs': 2\}"):
        DecoderBlock(num_heads=2)(random_inputs(1, 3, 32), random_inputs(2, 5, 32))
    # Caches are named by the block's own arguments.
    block = DecoderBlock(num_heads=2)
    block(random_inputs(1, 3, 32), random_inputs(1, 5, 32))
    cross_cache = block.cross_attention.sublayer.compute_cache(random_inputs(1, 5, 32))
    with pytest.raises(ValueError, match=r"`self_attention_cache` must have shape \(batch, 2, 2, length, 16\)"):
        block(random_inputs(1, 1, 32), self_attention_cache=np.zeros((1, 2, 8, 16), "float32"),
              cache_update_index=0, cross_attention_cache=cross_cache)
    with pytest.raises(ValueError, match=r"does not fit `self_attention_cache` of length 4"):
        block(random_inputs(1, 1, 32), self_attention_cache=np.zeros((1, 2, 2, 4, 16), "float32"),
              cache_update_index=4, cross_attention_cache=cross_cache)
    with pytest.raises(ValueError, match=r"`cross_attention_cache` must have shape \(batch, 2, 2, length, 16\)"):
        block(random_inputs(1, 1, 32), self_attention_cache=np.zeros((1, 2, 2, 4, 16), "float32"),
              cache_update_index=0, cross_attention_cache=np.zeros((1, 2, 5, 16), "float32"))


@pytest.mark.parametrize("cross", [False, True], ids=["decoder_only", "encoder_decoder"])
def test_config_and_keras_file_round_trip(cross, tmp_path):
    block = DecoderBlock(
        num_heads=4, intermediate_dim=48, activation="swiglu", norm_first=True,
        norm_type="rms_norm", norm_epsilon=1e-6, use_bias=False, num_key_value_heads=2,
        use_rotary=not cross, attention_scale=1.0, dropout=0.1,
    )
    assert DecoderBlock.from_config(block.get_config()).get_config() == block.get_config()
    inputs = keras.Input((None, C))
    memory = keras.Input((None, 24))
    outputs = block(inputs, memory if cross else None)
    model = keras.Model([inputs, memory] if cross else inputs, outputs)
    x = [random_inputs(2, 5, C), random_inputs(2, 3, 24, seed=1)] if cross else random_inputs(2, 5, C)
    np.testing.assert_allclose(to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6)

    encoder = EncoderBlock(num_heads=4, activation="gelu")
    inputs = keras.Input((None, C))
    model = keras.Model(inputs, encoder(inputs))
    x = random_inputs(2, 5, C)
    np.testing.assert_allclose(to_numpy(save_and_reload(model, tmp_path)(x)), to_numpy(model(x)), atol=1e-6)

import warnings

import keras
import numpy as np
import pytest

from kerasformer.generate import Generator, filter_logits, generate, sample_tokens
from kerasformer.models import GPT, T5, Transformer
from tests.conftest import BACKEND, to_numpy

VOCAB = 50


def gpt(**kwargs):
    return GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=64, **kwargs)


def seq2seq(builder, tie_embeddings=False, **kwargs):
    model = builder(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64, tie_embeddings=tie_embeddings, **kwargs)
    # Sharp random weights, so that greedy tokens differ from step to step: a
    # sharp head, or (tied: the residual stream carries the input token to its
    # own logit) a sharp last feed-forward layer.
    if tie_embeddings:
        kernel = model.decoder_blocks[-1].feedforward.sublayer.output_dense.kernel
    else:
        kernel = model.lm_head.kernel
    kernel.assign(np.random.default_rng(0).normal(0, 3, kernel.shape).astype("float32"))
    return model


def last_logits_by_full_pass(model, tokens, width, source=None):
    """Logits after `tokens`, from a full forward pass over `tokens` padded with 0 to `width`.

    One width for a whole decoding: JAX compiles each eager op once per input
    shape, and a shape per length had made those compiles most of these
    tests' time. The causal mask keeps the padding out of the logits read; a
    leak would show as a mismatch with the cached loop, which never sees it.
    """
    padded = np.zeros((1, width), "int32")
    padded[0, : len(tokens)] = tokens
    inputs = padded if source is None else {"encoder_token_ids": np.array([source], "int32"), "decoder_token_ids": padded}
    return to_numpy(model(inputs))[0, len(tokens) - 1]


def greedy_by_full_passes(model, prompt, steps):
    sequence = list(prompt)
    for _ in range(steps):
        sequence.append(int(last_logits_by_full_pass(model, sequence, len(prompt) + steps - 1).argmax()))
    return sequence[len(prompt):]


def seq2seq_greedy_by_full_passes(model, source, steps, start=0):
    target = [start]
    for _ in range(steps):
        target.append(int(last_logits_by_full_pass(model, target, steps, source=source).argmax()))
    return target[1:]


GPT_OPTIONS = {
    "gpt2": {},
    "rotary_mqa": {"position_type": "rotary", "num_key_value_heads": 1},
    # An untied head: the loop gets no transposed table (see Generator._loop).
    "llama_untied": {"position_type": "rotary", "norm_type": "rms_norm", "activation": "swiglu", "tie_embeddings": False},
}


@pytest.mark.parametrize("options", GPT_OPTIONS.values(), ids=GPT_OPTIONS.keys())
def test_gpt_cached_greedy_equals_full_passes_for_ragged_prompts(options):
    model = gpt(**options)
    prompts = [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5, 6]]
    out = generate(model, prompts, max_new_tokens=7)
    assert out.shape == (3, 7)
    for prompt, row in zip(prompts, out):
        assert list(row) == greedy_by_full_passes(model, prompt, 7)
    # Same shapes, other prompts: the compiled loop is reused and still right.
    other = [[11, 12, 13], [14, 15], [16, 17, 18, 19, 20, 21]]
    out = generate(model, other, max_new_tokens=7)
    for prompt, row in zip(other, out):
        assert list(row) == greedy_by_full_passes(model, prompt, 7)


def greedy_in_windows_by_full_passes(model, prompt, steps, window):
    """nanoGPT's cropped context, one window at a time, by full forward passes.

    The first window is the prompt's last `window - 1` tokens; every later
    window starts from the text's last `window // 2` tokens; each is filled
    up to the table.
    """
    text, new = list(prompt), []
    context = text[-(window - 1):]
    while len(new) < steps:
        for _ in range(min(window - len(context), steps - len(new))):
            token = int(last_logits_by_full_pass(model, context, window).argmax())
            new, text, context = new + [token], text + [token], context + [token]
        context = text[-(window // 2):]
    return new


@pytest.mark.parametrize("position_type", ["learned", "rotary"])
def test_gpt_generates_past_its_context_in_windows(position_type):
    model = GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=12, position_type=position_type)
    # The last prompt is longer than the context: its last 11 tokens count.
    prompts = [[5, 6, 7], [8, 9], list(range(1, 16))]
    out = generate(model, prompts, max_new_tokens=20)
    assert out.shape == (3, 20)
    for prompt, row in zip(prompts, out):
        assert list(row) == greedy_in_windows_by_full_passes(model, prompt, 20, window=12)
    # A stop token ends its row in any window; the other rows go on.
    stop = int(out[0, 14])
    stopped = generate(model, prompts, max_new_tokens=20, stop_token_ids=[stop])
    first = list(out[0]).index(stop)
    np.testing.assert_array_equal(stopped[0, : first + 1], out[0, : first + 1])
    assert np.all(stopped[0, first + 1 :] == 0)
    for row in (1, 2):
        if stop not in out[row]:
            np.testing.assert_array_equal(stopped[row], out[row])
    # Seeded sampling repeats, and every window samples afresh.
    a, b = (generate(model, [[5, 6, 7]], max_new_tokens=30, temperature=1.0, seed=4) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, generate(model, [[5, 6, 7]], max_new_tokens=30, temperature=1.0, seed=5))
    if BACKEND != "torch":  # Every window has the table's shape: one trace per batch size and option set.
        assert model._kerasformer_generator.trace_count == 2  # (3, 12) greedy, (1, 12) sampled


@pytest.mark.parametrize("tie_embeddings", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("builder", [T5, Transformer])
def test_seq2seq_cached_greedy_equals_full_passes(builder, tie_embeddings):
    model = seq2seq(builder, tie_embeddings)
    sources = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    out = generate(model, sources, max_new_tokens=6, start_token_id=1)
    assert len(set(out.ravel().tolist())) > 1
    for source, row in zip(sources, out):
        assert list(row) == seq2seq_greedy_by_full_passes(model, list(source), 6, start=1)


def test_models_have_a_generate_method(tmp_path):
    """`model.generate(...)`, as KerasHub's and Hugging Face's models have it, also after a `.keras` round trip."""
    model = gpt()
    prompts = [[5, 6, 7], [8, 9]]
    out = model.generate(prompts, max_new_tokens=5)
    assert out.shape == (2, 5) and out.dtype == np.int32
    for prompt, row in zip(prompts, out):
        assert list(row) == greedy_by_full_passes(model, prompt, 5)
    sampled = model.generate(prompts, max_new_tokens=5, temperature=1.5, top_k=10, seed=3)
    np.testing.assert_array_equal(sampled, generate(model, prompts, max_new_tokens=5, temperature=1.5, top_k=10, seed=3))
    path = tmp_path / "gpt.keras"
    model.save(path)
    np.testing.assert_array_equal(keras.saving.load_model(path).generate(prompts, max_new_tokens=5), out)

    for builder in (T5, Transformer):
        model = seq2seq(builder)
        source = [5, 6, 7, 8]
        row = model.generate([source], max_new_tokens=4, start_token_id=1)[0]
        assert list(row) == seq2seq_greedy_by_full_passes(model, source, 4, start=1)
    with pytest.raises(ValueError, match="`max_new_tokens`"):
        model.generate([[5, 6]], max_new_tokens=0)


@pytest.mark.parametrize("builder", [T5, Transformer])
def test_bf16_seq2seq_decodes_from_a_bf16_cross_attention_cache(builder):
    # The cross-attention cache is projected outside a layer call, where Keras
    # does not autocast: it had come out float32 (on TF through a deprecated
    # mixed-dtype matmul that logged a warning), twice the memory, cast again
    # to bfloat16 as each decoding step read it.
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = seq2seq(builder, tie_embeddings=True)
    finally:
        keras.config.set_dtype_policy("float32")
    sources = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    encoder_outputs, padding_mask = model.encode(sources)
    caches = model.cross_attention_cache(encoder_outputs)
    for block, cache in zip(model.decoder_blocks, caches):
        assert keras.backend.standardize_dtype(cache.dtype) == "bfloat16"
        attention = block.cross_attention.sublayer
        for i, dense in enumerate([attention.key_dense, attention.value_dense]):  # Keras's own layer calls.
            expected = np.moveaxis(to_numpy(dense(encoder_outputs)).astype("float32"), 2, 1)  # (B, K, S, D)
            np.testing.assert_allclose(to_numpy(cache[:, i]).astype("float32"), expected, atol=0.02 * np.abs(expected).max())
    # Decoding from the cache gives the model's own logits. (Greedy tokens of
    # bfloat16 logits can tie and flip between a cached step and a full pass.)
    targets = np.array([[1, 4, 9, 3], [1, 7, 7, 2]])
    logits = model.decode(targets, encoder_outputs, padding_mask, cross_attention_cache=caches)[0]
    expected = to_numpy(model({"encoder_token_ids": sources, "decoder_token_ids": targets})).astype("float32")
    np.testing.assert_allclose(to_numpy(logits).astype("float32"), expected, atol=0.02 * np.abs(expected).max())
    assert generate(model, sources, max_new_tokens=6, start_token_id=1).shape == (2, 6)


def test_quantized_models_cached_greedy_equals_full_passes():
    # The loop's projections of an int8 model (`model.quantize`) apply the kernels' scales, as its layers' calls do.
    model = seq2seq(T5, tie_embeddings=True)
    model.quantize("int8")
    sources = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    out = generate(model, sources, max_new_tokens=6, start_token_id=1)
    assert len(set(out.ravel().tolist())) > 1
    for source, row in zip(sources, out):
        assert list(row) == seq2seq_greedy_by_full_passes(model, list(source), 6, start=1)
    model = gpt(position_type="rotary")
    model.quantize("int8")
    prompts = [[5, 6, 7], [8, 9]]
    out = generate(model, prompts, max_new_tokens=6)
    for prompt, row in zip(prompts, out):
        assert list(row) == greedy_by_full_passes(model, prompt, 6)

@pytest.mark.parametrize("builder", [T5, Transformer])
def test_seq2seq_sources_of_different_lengths_equal_each_alone(builder):
    # A list of sources is padded with the pad id, which the encoder masks:
    # each row equals greedy full passes over its source alone, unpadded.
    model = seq2seq(builder)
    sources = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [15]]
    out = generate(model, sources, max_new_tokens=5, start_token_id=1)
    assert out.shape == (3, 5)
    for source, row in zip(sources, out):
        assert list(row) == seq2seq_greedy_by_full_passes(model, source, 5, start=1)


def test_seq2seq_generation_keeps_to_learned_positions():
    # The decoder reads its start token and every new token but the last: a table of 8 gives 8 new tokens.
    model = seq2seq(Transformer, position_type="learned", max_sequence_length=8)
    sources = np.array([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 0, 0, 0, 0, 0]])
    out = generate(model, sources, max_new_tokens=8, start_token_id=1)
    for source, row in zip(sources, out):
        assert list(row) == seq2seq_greedy_by_full_passes(model, list(source), 8, start=1)
    message = "{} must fit the learned positions: at most 8 tokens \\(max_sequence_length=8\\)"
    with pytest.raises(ValueError, match=message.format("`max_new_tokens`")):
        generate(model, sources, max_new_tokens=9, start_token_id=1)
    with pytest.raises(ValueError, match=message.format("`inputs`")):
        generate(model, np.ones((1, 9), "int32"), max_new_tokens=2)


def test_same_shapes_do_not_recompile():
    model = gpt()
    generator = Generator(model)
    prompts = np.array([[1, 2, 3], [4, 5, 6]])
    generator(prompts, max_new_tokens=5)
    generator(prompts + 10, max_new_tokens=5)
    generator(prompts, max_new_tokens=5, temperature=0.0)
    if BACKEND == "torch":  # Eager loop; only the body is traced, once per shape.
        (function,) = generator._compiled.values()
        torch_body = function.__closure__[[c.cell_contents.__class__.__name__ for c in function.__closure__].index("_TorchBody")].cell_contents
        assert torch_body.trace_count == 1
    else:
        assert generator.trace_count == 1
    generator(prompts, max_new_tokens=5, temperature=0.7, top_k=5, seed=1)
    generator(prompts, max_new_tokens=5, temperature=1.3, top_k=9, seed=2)  # New values, same program.
    if BACKEND != "torch":
        assert generator.trace_count == 2


def loops_built(generator):
    """Compiled loops (TF, JAX) or traced decoding steps (torch) of `generator` so far."""
    if BACKEND != "torch":
        return generator.trace_count
    return sum(cell.cell_contents.trace_count for function in generator._compiled.values()
               for cell in function.__closure__ if type(cell.cell_contents).__name__ == "_TorchBody")


def test_other_lengths_reuse_one_compiled_loop_within_the_context():
    # Each new prompt or source length had compiled a loop of its own (~2 s on
    # TF) for a generation of milliseconds; buffers are now padded.
    model = GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=20)
    generator = Generator(model)
    for prompts, new_tokens in [([[5, 6, 7]], 5), ([[1, 2, 3, 4, 5, 6, 7, 8, 9]], 4), ([[8, 9], [4] * 7], 6)]:
        out = generator(prompts, max_new_tokens=new_tokens)
        for prompt, row in zip(prompts, out):
            assert list(row) == greedy_by_full_passes(model, prompt, new_tokens)
    assert loops_built(generator) == 2  # Batch 1 and batch 2, each padded to 16 positions.
    # Padding stops at the learned position table: 3 + 17 = 20 positions, not 32.
    assert list(generator([[5, 6, 7]], max_new_tokens=17)[0]) == greedy_by_full_passes(model, [5, 6, 7], 17)

    model = seq2seq(T5)
    generator = Generator(model)
    for source in ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17]):
        row = generator([source], max_new_tokens=4, start_token_id=1)[0]
        assert list(row) == seq2seq_greedy_by_full_passes(model, source, 4, start=1)
    assert loops_built(generator) == 1


@pytest.mark.skipif(BACKEND != "torch", reason="torch.jit.trace is the torch backend's decoding path")
def test_torch_traces_quietly_and_decodes_eagerly_where_tracing_fails(monkeypatch):
    import torch

    prompts = [[5, 6, 7], [8]]
    model = gpt()
    expected = [greedy_by_full_passes(model, prompt, 4) for prompt in prompts]
    with warnings.catch_warnings():
        # torch 2.13 deprecates jit.trace: not the user's to act on.
        warnings.filterwarnings("error", "`torch.jit", DeprecationWarning)
        np.testing.assert_array_equal(to_numpy(generate(model, prompts, max_new_tokens=4)), expected)

    def no_tracer(*args, **kwargs):
        raise RuntimeError("not supported on this Python")

    monkeypatch.setattr(torch.jit, "trace", no_tracer)
    untraced = Generator(model)
    with pytest.warns(RuntimeWarning, match="eagerly.*torch.jit.trace failed: RuntimeError: not supported"):
        np.testing.assert_array_equal(to_numpy(untraced(prompts, max_new_tokens=4)), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # Warned once; later shapes run eagerly, untraced.
        np.testing.assert_array_equal(to_numpy(untraced(prompts[:1], max_new_tokens=4)), expected[:1])


def test_stop_tokens_end_a_row_and_pad_the_rest():
    model = gpt()
    prompts = [[5, 6, 7], [8, 9, 10]]
    free = generate(model, prompts, max_new_tokens=8)
    stop = int(free[0, 2])
    out = generate(model, prompts, max_new_tokens=8, stop_token_ids=[stop])
    first = list(free[0]).index(stop)
    assert list(out[0, : first + 1]) == list(free[0, : first + 1])
    assert np.all(out[0, first + 1 :] == 0)
    if stop not in free[1]:
        np.testing.assert_array_equal(out[1], free[1])


def test_seeded_sampling_is_reproducible_and_varies_with_the_seed():
    model = gpt()
    prompts = [[1, 2, 3]] * 4
    a = generate(model, prompts, max_new_tokens=12, temperature=1.5, seed=7)
    b = generate(model, prompts, max_new_tokens=12, temperature=1.5, seed=7)
    c = generate(model, prompts, max_new_tokens=12, temperature=1.5, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(row) for row in a}) > 1  # Rows sample independently.


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = gpt()
    prompts = [[3, 4, 5], [6, 7, 8]]
    greedy = generate(model, prompts, max_new_tokens=6)
    np.testing.assert_array_equal(generate(model, prompts, max_new_tokens=6, temperature=2.0, top_k=1, seed=3), greedy)
    np.testing.assert_array_equal(generate(model, prompts, max_new_tokens=6, temperature=2.0, top_p=1e-6, seed=3), greedy)


def test_filter_and_sample_against_numpy():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.4, 0.1]], "float32"))
    top2 = to_numpy(filter_logits(keras.ops.convert_to_tensor(logits), top_k=np.int32(2)))
    assert np.all(top2[0, [0, 2]] < -1e8) and np.allclose(top2[0, [1, 3]], logits[0, [1, 3]])
    nucleus = to_numpy(filter_logits(keras.ops.convert_to_tensor(logits), top_p=np.float32(0.6)))
    assert np.all((nucleus[0] > -1e8) == [False, True, False, True])  # 0.4 + 0.3 >= 0.6
    assert np.all((nucleus[1] > -1e8) == [True, True, True, False])  # 0.4 + 0.25 (tie kept) ...
    # Inverse-CDF sampling: noise 0.05 picks the first token, 0.95 the last.
    probs = np.array([[0.1, 0.4, 0.2, 0.3]], "float32")
    for noise, expected in ((0.05, 0), (0.45, 1), (0.65, 2), (0.95, 3)):
        token = to_numpy(sample_tokens(np.log(probs), np.array([noise], "float32"), temperature=np.float32(1.0)))
        assert int(token[0]) == expected


@pytest.mark.parametrize("top_k, top_p", [(3, None), (None, 0.75), (3, 0.75), (10, 0.3), (1, 0.9), (0, 0.5)])
def test_filter_logits_keeps_the_tokens_of_transformers_warpers(top_k, top_p):
    """Temperature, then top-k, then top-p over the renormalized top k, as `transformers` samples."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = np.random.default_rng(top_k or 7).normal(0, 2, (4, 40)).astype("float32")
    # At temperature 0.7 the first row's probabilities are (0.5, 0.2, 0.15, 0.1, 0.05, ~0...): its top 3 hold
    # 0.85, so a nucleus of 0.75 of their renormalized mass is 2 tokens (3 of the whole distribution's).
    logits[0] = -30.0
    logits[0, :5] = 0.7 * np.log([0.5, 0.2, 0.15, 0.1, 0.05])
    reference = TemperatureLogitsWarper(0.7)(None, torch.tensor(logits))
    if top_k:
        reference = TopKLogitsWarper(top_k)(None, reference)
    if top_p is not None:
        reference = TopPLogitsWarper(top_p)(None, reference)
    options = {"top_k": None if top_k is None else np.int32(top_k), "top_p": None if top_p is None else np.float32(top_p)}
    ours = to_numpy(filter_logits(keras.ops.convert_to_tensor(logits / np.float32(0.7)), **options))
    np.testing.assert_array_equal(ours > -1e8, torch.isfinite(reference).numpy())


def test_bad_arguments_are_named():
    model = gpt()
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1, 2]], max_new_tokens=0)
    # Sampling options are checked by name: before, NaN or infinite temperatures
    # drew garbage, a float top_k was truncated, a bad seed got numpy's message.
    for options, message in [
        (dict(temperature=-1.0), "`temperature` must be a finite number >= 0, got -1.0."),
        (dict(temperature=float("nan")), "`temperature` must be a finite number >= 0, got nan."),
        (dict(temperature=float("inf")), "`temperature` must be a finite number >= 0, got inf."),
        (dict(temperature="0.5"), "`temperature` must be a finite number >= 0, got '0.5'."),
        (dict(temperature=1.0, top_k=2.5), "`top_k` must be an int >= 0 or None, got 2.5."),
        (dict(temperature=1.0, top_p=float("nan")), "`top_p` must be a finite number > 0 and <= 1 or None, got nan."),
        (dict(temperature=1.0, seed=-1), "`seed` must be an int >= 0 or None, got -1."),
        (dict(temperature=1.0, seed="a"), "`seed` must be an int >= 0 or None, got 'a'."),
        (dict(stop_token_ids=[3, 50]), r"`stop_token_ids` must be an int in \[0, 50\), got 50."),
        (dict(stop_token_ids="3"), "`stop_token_ids` must be a list of token ids, got '3'."),
        (dict(num_beams=2, length_penalty=float("nan")), "`length_penalty` must be a finite number, got nan."),
    ]:
        with pytest.raises(ValueError, match=message):
            generate(model, [[1, 2]], **options)
    # One stop id may be given alone, as `transformers`' `eos_token_id`.
    first = int(generate(model, [[1, 2]], max_new_tokens=1)[0, 0])
    np.testing.assert_array_equal(generate(model, [[1, 2]], max_new_tokens=4, stop_token_ids=first)[0], [first, 0, 0, 0])
    # An iterator of stop ids is read once: checked, then still there for the loop.
    np.testing.assert_array_equal(generate(model, [[1, 2]], max_new_tokens=4, stop_token_ids=iter([first]))[0], [first, 0, 0, 0])
    with pytest.raises(ValueError, match="Beam search must fit .* max_sequence_length=64"):
        generate(model, [[1, 2]], max_new_tokens=63, num_beams=2)
    with pytest.raises(ValueError, match="vocab_size=50"):
        generate(model, [[1, 50]])
    with pytest.raises(ValueError, match="`start_token_id` starts a T5's or Transformer's decoder; a GPT continues its prompt"):
        generate(model, [[1, 2]], start_token_id=1)  # Was ignored.
    with pytest.raises(ValueError, match="inputs"):
        generate(model, [1, 2, 3])
    # Ids are checked before any cast: floats are refused, not truncated,
    # and an int64 id past int32 does not wrap into the vocabulary.
    for floats in (np.array([[1.0, 2.0]]), [[1, 2.5]]):
        with pytest.raises(ValueError, match="`inputs` must be integer token ids, got dtype float64"):
            generate(model, floats)
    with pytest.raises(ValueError, match="vocab_size=50"):
        generate(model, np.array([[1, 2**32 + 3]], "int64"))
    with pytest.raises(ValueError, match="Each prompt in `inputs` needs at least one token"):
        generate(model, [[1], []])
    source_model = seq2seq(T5)
    with pytest.raises(ValueError, match="Each source in `inputs` needs at least one token"):
        generate(source_model, [[1], []])
    with pytest.raises(ValueError, match="`inputs` must be integer token ids"):
        generate(source_model, np.array([[1.5, 2.0]]))
    target_vocab = source_model.target_embedding.vocab_size
    with pytest.raises(ValueError, match=rf"`start_token_id` must be an int in \[0, {target_vocab}\) or None, got {target_vocab}."):
        generate(source_model, [[1, 2]], start_token_id=target_vocab)
    with pytest.raises(ValueError, match="model"):
        generate(keras.Sequential([keras.layers.Dense(2)]), [[1]])


def test_generation_follows_weight_updates_after_compiling():
    model = gpt()
    prompts = [[5, 6, 7]]
    generate(model, prompts, max_new_tokens=5)  # Compiles (or traces) with the first weights.
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sequences = np.random.default_rng(1).integers(1, VOCAB, (8, 9))
    model.fit(sequences[:, :-1], sequences[:, 1:], epochs=3, verbose=0)  # Changes every weight.
    out = generate(model, prompts, max_new_tokens=5)
    assert list(out[0]) == greedy_by_full_passes(model, prompts[0], 5)


# Beam search ----------------------------------------------------------------


def beam_search_by_full_passes(model, prompt, steps, num_beams, stop=(), length_penalty=1.0):
    """`transformers`' beam search (`early_stopping=False`) in numpy, over full forward passes (no cache).

    Each step keeps the best `max(2, 1 + len(stop)) * num_beams` continuations
    of the running beams; those among the best `num_beams` that end (a stop
    token, or the last step) become finished hypotheses scored
    `log-probability / new_length ** length_penalty`, the best `num_beams`
    that do not end run on. The search ends when the best running beam,
    scored at its length, cannot beat the worst of `num_beams` finished ones.
    """
    running = [(list(prompt), 0.0)]
    finished = []  # (length-penalized score, new tokens)
    keep = max(2, 1 + len(stop)) * num_beams
    for length in range(1, steps + 1):
        candidates = []
        for tokens, score in running:
            logits = last_logits_by_full_pass(model, tokens, len(prompt) + steps - 1).astype("float64")
            log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            candidates += [(tokens + [token], score + log_probs[token]) for token in range(len(log_probs))]
        candidates = sorted(candidates, key=lambda beam: -beam[1])[:keep]
        ends = [beam[0][-1] in stop or length == steps for beam in candidates]
        finished += [(score / length**length_penalty, tokens[len(prompt):]) for (tokens, score), end in zip(candidates[:num_beams], ends) if end]
        finished = sorted(finished, key=lambda hypothesis: -hypothesis[0])[:num_beams]
        running = [beam for beam, end in zip(candidates, ends) if not end][:num_beams]
        if len(finished) == num_beams and (not running or running[0][1] / length**length_penalty <= finished[-1][0]):
            break
    best = finished[0][1]
    return best + [0] * (steps - len(best))


def chaotic_hf(hf, std=0.3):
    """Large random weights: peaked, varied next-token distributions (no near-ties)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in hf.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    return hf


def ended_with_padding(ids, stop):
    """`ids` with 0 after each row's first stop token (`transformers` fills with the stop id when the pad id is 0)."""
    ids = np.array(ids, ndmin=2)
    for row in ids:
        ended = np.flatnonzero(np.isin(row, stop))
        if len(ended):
            row[ended[0] + 1 :] = 0
    return ids


@pytest.mark.parametrize("stops, length_penalty", [((), 1.0), (((1, 2),), 1.0), (((1, 2), (2, 2)), 0.0), (((1, 2),), 2.0)])
def test_gpt2_beam_search_equals_transformers_for_ragged_prompts(stops, length_penalty):
    import torch

    from kerasformer.convert import from_huggingface
    from tests.models.convert_test import tiny_gpt2

    hf = chaotic_hf(tiny_gpt2())
    model = from_huggingface(hf)
    prompts = [[5, 17, 33, 2, 80], [44, 9, 61], [12, 70]]
    free = generate(model, prompts, max_new_tokens=10, num_beams=4)
    # Stop tokens the beams reach: finished hypotheses leave the running beams, which go on.
    stop = [int(free[position]) for position in stops]
    ours = generate(model, prompts, max_new_tokens=10, num_beams=4, stop_token_ids=stop, length_penalty=length_penalty)
    for prompt, row in zip(prompts, ours):
        reference = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=4,
            do_sample=False, max_new_tokens=10, eos_token_id=stop or None, pad_token_id=0, length_penalty=length_penalty,
        )[0, len(prompt):].numpy()
        np.testing.assert_array_equal(row, np.pad(ended_with_padding(reference, stop)[0], (0, 10 - len(reference))))
    if stop:
        assert not np.array_equal(ours, free)  # The stop tokens changed the search.
    else:
        assert not np.array_equal(ours, generate(model, prompts, max_new_tokens=10))  # Beams change the result.


@pytest.mark.parametrize("stops", [0, 1])
def test_t5_beam_search_equals_transformers(stops):
    import torch

    from kerasformer.convert import from_huggingface
    from tests.models.convert_test import tiny_t5

    hf = chaotic_hf(tiny_t5())
    model = from_huggingface(hf)
    sources = np.random.default_rng(1).integers(2, 103, (3, 7)).astype("int32")
    free = generate(model, sources, max_new_tokens=8, num_beams=3)
    stop = [int(free[1, 2])][:stops]
    reference = hf.generate(
        torch.tensor(sources, dtype=torch.long), num_beams=3, do_sample=False, max_new_tokens=8,
        eos_token_id=stop or None, decoder_start_token_id=0, pad_token_id=0,
    )[:, 1:].numpy()
    reference = np.pad(ended_with_padding(reference, stop), [(0, 0), (0, 8 - reference.shape[1])])
    ours = generate(model, sources, max_new_tokens=8, num_beams=3, stop_token_ids=stop)
    np.testing.assert_array_equal(ours, reference)
    assert np.array_equal(ours, free) == (not stop)  # The stop token changed the search.


@pytest.mark.parametrize("length_penalty", [0.0, 2.0])
def test_beam_search_with_stop_tokens_equals_numpy_full_passes(length_penalty):
    model = gpt()
    kernel = model.token_embedding.embeddings
    kernel.assign(np.random.default_rng(0).normal(0, 0.5, kernel.shape).astype("float32"))  # Peaked.
    prompts = [[3, 4, 5], [6, 7]]
    free = generate(model, prompts, max_new_tokens=7, num_beams=3)
    stop = [int(free[0, 2]), int(free[1, 4])]  # Tokens the beams do reach.
    ours = generate(model, prompts, max_new_tokens=7, num_beams=3, stop_token_ids=stop, length_penalty=length_penalty)
    for prompt, row in zip(prompts, ours):
        assert list(row) == beam_search_by_full_passes(model, prompt, 7, 3, stop, length_penalty)
        ended = [i for i, t in enumerate(row) if t in stop]
        if ended:
            assert np.all(row[ended[0] + 1 :] == 0)  # Padding after the stop token.


def test_beam_search_pads_with_the_models_pad_id():
    model = seq2seq(Transformer, pad_token_id=3)
    sources = [[5, 6, 7, 8], [9, 10]]
    free = generate(model, sources, max_new_tokens=6, num_beams=2, start_token_id=1)
    stop = int(free[0, 1])
    ours = generate(model, sources, max_new_tokens=6, num_beams=2, start_token_id=1, stop_token_ids=stop)
    ended = int(np.flatnonzero(ours[0] == stop)[0])
    assert ended <= 1 and np.all(ours[0, ended + 1 :] == 3)


def test_beam_search_compiles_once_and_rejects_sampling_options():
    model = gpt()
    generator = Generator(model)
    generator([[1, 2, 3]], max_new_tokens=4, num_beams=2)
    generator([[4, 5, 6]], max_new_tokens=4, num_beams=2)
    if BACKEND != "torch":
        assert generator.trace_count == 1
    with pytest.raises(ValueError, match="num_beams"):
        generate(model, [[1, 2]], num_beams=0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, [[1, 2]], num_beams=2, temperature=0.8)

"""Each builder builds, trains, saves and loads, and ignores padding, on every backend."""

import keras
import numpy as np
import pytest

from kerasformer.models import (
    BERT,
    GPT,
    T5,
    BERTClassifier,
    BERTMaskedLM,
    Transformer,
    from_preset,
    preset_names,
)
from tests.conftest import save_and_reload, to_numpy

VOCAB = 64


def lm_batch(length=12, batch=16, seed=0):
    """Sequences a, a+d, a+2d, ... modulo VOCAB (never 0, the pad id)."""
    rng = np.random.default_rng(seed)
    start = rng.integers(1, VOCAB, (batch, 1))
    step = rng.integers(1, 4, (batch, 1))
    return (1 + (start + step * np.arange(length + 1)) % (VOCAB - 1)).astype("int32")


def tiny(name, **overrides):
    return from_preset(name, vocab_size=VOCAB, **overrides)


def gpt_data():
    seq = lm_batch()
    return tiny("gpt2-tiny"), seq[:, :-1], seq[:, 1:]


def bert_data():
    seq = lm_batch()[:, :-1]
    inputs = {"token_ids": seq, "segment_ids": np.zeros_like(seq)}
    labels = (seq[:, 0] % 3).astype("int32")
    return BERTClassifier(tiny("bert-tiny"), num_classes=3, dropout=0.0), inputs, labels


def seq2seq_data(name):
    source = lm_batch(seed=1)[:, :-1]
    target = source[:, ::-1]  # Reverse the sequence.
    decoder_inputs = np.concatenate([np.zeros_like(target[:, :1]), target[:, :-1]], axis=1)
    inputs = {"encoder_token_ids": source, "decoder_token_ids": decoder_inputs}
    return tiny(name), inputs, target


def task(name):
    if name == "gpt":
        return gpt_data()
    if name == "bert":
        return bert_data()
    return seq2seq_data({"t5": "t5-tiny", "transformer": "transformer-tiny"}[name])


FAMILIES = ["gpt", "bert", "t5", "transformer"]


@pytest.mark.parametrize("family", FAMILIES)
def test_fit_lowers_the_loss(family):
    model, inputs, labels = task(family)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = model.evaluate(inputs, labels, verbose=0)
    model.fit(inputs, labels, epochs=8, batch_size=8, verbose=0)
    after = model.evaluate(inputs, labels, verbose=0)
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("family", FAMILIES)
def test_keras_file_round_trip_gives_identical_outputs(family, tmp_path):
    model, inputs, _ = task(family)
    restored = save_and_reload(model, tmp_path)
    assert type(restored) is type(model)
    np.testing.assert_array_equal(to_numpy(restored(inputs)), to_numpy(model(inputs)))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_loads_under_the_dtype_policy_it_was_built_under(family, tmp_path):
    # Sublayers take the global policy when built: a model of a bf16 run
    # loaded as float32 before, and generated and exported in float32.
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model, inputs, _ = task(family)
    finally:
        keras.config.set_dtype_policy("float32")
    restored = save_and_reload(model, tmp_path)
    policies = {layer.dtype_policy.name for layer in restored._flatten_layers() if layer.weights}
    assert policies == {"mixed_bfloat16"}
    assert {v.dtype for v in restored.weights} == {"float32"}
    np.testing.assert_array_equal(to_numpy(restored(inputs)), to_numpy(model(inputs)))
    float32_model = task(family)[0]
    (tmp_path / "float32").mkdir()
    keras.config.set_dtype_policy("mixed_bfloat16")  # And a float32 model loads as float32 under another global policy.
    try:
        restored = save_and_reload(float32_model, tmp_path / "float32")
    finally:
        keras.config.set_dtype_policy("float32")
    assert {layer.dtype_policy.name for layer in restored._flatten_layers() if layer.weights} == {"float32"}



@pytest.mark.parametrize("family", FAMILIES)
def test_a_quantized_model_predicts_near_its_float_self_and_reloads(family, tmp_path):
    # `model.quantize("int8")` keeps int8 kernels and their scales apart. The
    # attention projections, which read the kernels themselves, had used the
    # raw integers (GPT logits off by ~0.7 on JAX and torch; TF refused the
    # int8 matmul), and a quantized `.keras` file did not load.
    model, inputs, _ = task(family)
    before = to_numpy(model.predict(inputs, verbose=0))
    model.quantize("int8")
    quantized = [layer.path for layer in model._flatten_layers() if layer.quantization_mode == "int8"]
    assert any("attention/query" in path for path in quantized), quantized
    after = to_numpy(model.predict(inputs, verbose=0))
    scale = np.abs(before).max()
    assert np.abs(after - before).max() < 0.05 * scale, (np.abs(after - before).max(), scale)
    assert np.abs(after - before).max() > 0  # The kernels are int8 now.
    restored = save_and_reload(model, tmp_path)
    assert [layer.path for layer in restored._flatten_layers() if layer.quantization_mode == "int8"] == quantized
    np.testing.assert_array_equal(to_numpy(restored.predict(inputs, verbose=0)), after)

def test_bert_masked_lm_round_trip_and_tied_head(tmp_path):
    model = BERTMaskedLM(tiny("bert-tiny"))
    ids = lm_batch(8, 2)
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids)}
    restored = save_and_reload(model, tmp_path)
    np.testing.assert_array_equal(to_numpy(restored(inputs)), to_numpy(model(inputs)))
    # The MLM head reuses the token embedding: no second vocab x width matrix.
    backbone_params = model.backbone.count_params()
    head = model.mlm_head
    assert model.count_params() == backbone_params + head.dense.count_params() + head.norm.count_params() + VOCAB


@pytest.mark.parametrize("family", ["bert", "t5", "transformer"])
def test_padding_does_not_change_outputs_at_real_tokens(family):
    model, inputs, _ = task(family)
    key = "token_ids" if family == "bert" else "encoder_token_ids"
    padded = {k: np.concatenate([v, np.zeros((v.shape[0], 5), v.dtype)], axis=1) if k in (key, "segment_ids") else v for k, v in inputs.items()}
    # Classifier logits (BERT) or decoder logits (seq2seq) see only real tokens.
    np.testing.assert_allclose(to_numpy(model(padded)), to_numpy(model(inputs)), atol=1e-5)


def test_gpt_right_padding_does_not_change_real_positions():
    model, ids, _ = gpt_data()
    padded = np.concatenate([ids, np.zeros((ids.shape[0], 4), ids.dtype)], axis=1)
    np.testing.assert_allclose(to_numpy(model(padded))[:, : ids.shape[1]], to_numpy(model(ids)), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES + ["llama-style-gpt"])
def test_torch_compile_traces_forward_and_loss_as_one_graph(family):
    # `compile(jit_compile=True)` on torch is `torch.compile`. Graph breaks in
    # our layers (oneDNN's availability check in every projection, Keras's
    # flash-attention check, the cross-entropy's autograd.Function factory)
    # cut a GPT into ~50 graphs, and in a 12-block model Dynamo's recompile
    # limit then left the layers eager. `fullgraph=True` raises at any break.
    if keras.backend.backend() != "torch":
        pytest.skip("torch.compile is torch's; TF and JAX compile the same step with XLA (their tests' default)")
    import torch

    from kerasformer.losses import TokenCrossEntropy

    if family == "llama-style-gpt":  # Rotary positions, RMSNorm, SwiGLU, grouped-query attention.
        _, inputs, labels = gpt_data()
        model = GPT(
            VOCAB, 2, 4, 32, position_type="rotary", norm_type="rms_norm", activation="swiglu",
            num_key_value_heads=2, use_bias=False,
        )
    else:
        model, inputs, labels = task(family)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if family == "bert" else TokenCrossEntropy()
    to_tensor = lambda a: torch.as_tensor(np.ascontiguousarray(a))  # noqa: E731
    inputs = {k: to_tensor(v) for k, v in inputs.items()} if isinstance(inputs, dict) else to_tensor(inputs)
    labels = to_tensor(labels)
    variables = [v.value for v in model.trainable_variables]

    def loss_of(inputs, labels):
        return loss(labels, model(inputs, training=True))

    eager = loss_of(inputs, labels)
    eager_gradients = torch.autograd.grad(eager, variables)
    torch._dynamo.reset()
    compiled = torch.compile(loss_of, backend="aot_eager", fullgraph=True)(inputs, labels)
    gradients = torch.autograd.grad(compiled, variables)
    np.testing.assert_allclose(to_numpy(compiled), to_numpy(eager), rtol=1e-6)
    for gradient, eager_gradient in zip(gradients, eager_gradients):
        np.testing.assert_allclose(to_numpy(gradient), to_numpy(eager_gradient), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_variable_sequence_length_without_rebuilding(family):
    model, inputs, _ = task(family)
    weights = len(model.weights)
    for length in (3, 7, 12):
        cut = {k: v[:, :length] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[:, :length]
        out = to_numpy(model(cut))
        assert np.all(np.isfinite(out))
        if family != "bert":
            assert out.shape[1] == length
    assert len(model.weights) == weights


@pytest.mark.parametrize("builder,kwargs", [
    (GPT, dict(position_type="rotary", norm_type="rms_norm", activation="swiglu", use_bias=False, tie_embeddings=False, num_key_value_heads=2)),
    (GPT, dict(position_type="sinusoidal", norm_first=False)),
    (BERT, dict(position_type="rotary", norm_first=True)),
    (Transformer, dict(norm_first=True, share_embeddings=False, tie_embeddings=False, target_vocab_size=50)),
    (T5, dict(activation="geglu_tanh", tie_embeddings=False, num_decoder_layers=3)),
], ids=["gpt_llama_style", "gpt_post_norm", "bert_rotary", "transformer_separate_vocab", "t5_v1_1"])
def test_options_build_and_round_trip(builder, kwargs, tmp_path):
    sizes = dict(vocab_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=32)
    if builder in (T5, Transformer):
        sizes["intermediate_dim"] = 64
    model = builder(**sizes, **kwargs)
    assert builder.from_config(model.get_config()).count_params() == model.count_params()
    ids = lm_batch(6, 2)
    if builder is GPT:
        inputs = ids
    elif builder is BERT:
        inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids)}
    else:
        inputs = {"encoder_token_ids": ids, "decoder_token_ids": ids[:, :4] % 50}
    expected, restored = model(inputs), save_and_reload(model, tmp_path)(inputs)
    if builder is BERT:
        expected, restored = expected["sequence_output"], restored["sequence_output"]
    np.testing.assert_array_equal(to_numpy(restored), to_numpy(expected))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="position_type"):
        GPT(VOCAB, 1, 2, 32, position_type="alibi")
    with pytest.raises(ValueError, match="num_heads"):
        GPT(VOCAB, 1, 3, 32)
    with pytest.raises(ValueError, match="sequence_length=128"):
        tiny("gpt2-tiny")(np.ones((1, 129), "int32"))
    with pytest.raises(ValueError, match="vocab_size=64"):
        tiny("gpt2-tiny")(np.array([[1, 64]]))
    # Keras's Embedding, which holds the segments, clamped such ids on JAX.
    bert, ids = tiny("bert-tiny"), np.array([[1, 2, 3]])
    for model in (bert, BERTMaskedLM(bert)):
        with pytest.raises(ValueError, match=r"`segment_ids` must lie in \[0, 2\) \(num_segments=2\), got values from 0 to 2"):
            model({"token_ids": ids, "segment_ids": np.array([[0, 1, 2]])})
    with pytest.raises(ValueError, match="preset"):
        from_preset("gpt5")
    with pytest.raises(ValueError, match="target_vocab_size"):
        Transformer(VOCAB, 1, 2, 32, 64, target_vocab_size=10)
    assert "gpt2-small" in preset_names()


@pytest.mark.parametrize("family", FAMILIES)
def test_float_token_ids_are_refused_by_name(family):
    # A functional model casts its inputs to int32: ids of 1.7 ran as 1.
    model, inputs, labels = task(family)
    key = {"gpt": None, "bert": "segment_ids", "t5": "decoder_token_ids", "transformer": "encoder_token_ids"}[family]
    name = key or "token_ids"
    floats = inputs + 0.7 if key is None else {**inputs, key: inputs[key] + 0.7}
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    message = f"`{name}` must be integer token ids, got dtype float"
    with pytest.raises(ValueError, match=message):
        model(floats)
    with pytest.raises(ValueError, match=message):
        model.predict(floats, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.fit(floats, labels, epochs=1, verbose=0)
    # Integer ids of any width still run, and alike.
    int64 = {k: v.astype("int64") for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.astype("int64")
    np.testing.assert_array_equal(to_numpy(model(int64)), to_numpy(model(inputs)))


@pytest.mark.parametrize("family", ["bert", "t5", "transformer"])
def test_inputs_of_different_batch_sizes_are_refused_by_name(family):
    # One decoder (or segment) row against two source rows had been broadcast,
    # on every backend, into two rows of output, as if both had that row.
    model, inputs, _ = task(family)
    first, second = inputs
    uneven = {first: inputs[first][:2], second: inputs[second][:1]}
    with pytest.raises(ValueError, match=r"must have the same batch size \(one row per example\), got \{") as error:
        model(uneven)
    assert f"`{first}`" in str(error.value) and f"`{second}`" in str(error.value)


def test_a_failed_fit_evaluate_or_predict_leaves_the_model_as_it_was():
    # On JAX a step that failed to trace, or a Ctrl-C during evaluate /
    # predict, left every variable None (Keras detaches them while its loop
    # holds their values); on TF a first fit that
    # failed made every later fit raise "Creating variables on a non-first call".
    model, ids, labels = gpt_data()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    wrong_labels = np.concatenate([labels, labels[:, :1]], axis=1)  # One position too many.
    with pytest.raises(Exception):
        model.fit(ids, wrong_labels, epochs=1, verbose=0)  # The first fit of a fresh model.
    model.fit(ids, labels, epochs=1, verbose=0)
    trained = to_numpy(model(ids))

    class Interrupt(keras.callbacks.Callback):  # A Ctrl-C after the first batch.
        def on_predict_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

        def on_test_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

    for failing in (
        lambda: model.predict(ids + 0.5, verbose=0),
        lambda: model.evaluate(ids, wrong_labels, verbose=0),
        lambda: model.fit(ids, wrong_labels, epochs=1, verbose=0),
        lambda: model.predict(ids, batch_size=4, callbacks=[Interrupt()], verbose=0),
        lambda: model.evaluate(ids, labels, batch_size=4, callbacks=[Interrupt()], verbose=0),
    ):
        with pytest.raises((Exception, KeyboardInterrupt)):
            failing()
        np.testing.assert_array_equal(to_numpy(model(ids)), trained)
    before = model.evaluate(ids, labels, verbose=0)
    model.fit(ids, labels, epochs=3, verbose=0)
    assert model.evaluate(ids, labels, verbose=0) < before


def test_sequences_past_the_position_table_are_refused_before_any_step():
    # Under XLA on TF, once Keras had relaxed the traced length, fit and
    # predict ran a longer sequence on clamped positions without a word.
    model, ids, labels = gpt_data()  # A table of 128 positions.
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for length in (8, 12, 10):
        model.predict(ids[:, :length], verbose=0)
        model.fit(ids[:, :length], labels[:, :length], verbose=0)
    long_ids = np.ones((2, 129), "int32")
    message = r"`token_ids` holds sequences of 129 tokens, longer than the learned position table \(`max_sequence_length=128`\)"
    for call in (
        lambda: model.predict(long_ids, verbose=0),
        lambda: model.evaluate(long_ids, long_ids, verbose=0),
        lambda: model.fit(long_ids, long_ids, verbose=0),
        lambda: model.fit(ids, labels, validation_data=(long_ids, long_ids), verbose=0),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((long_ids, long_ids)).batch(2)
    with pytest.raises(ValueError, match=message):
        model.fit(dataset, verbose=0)
    bert = BERTClassifier(tiny("bert-tiny", max_sequence_length=16), num_classes=2)
    with pytest.raises(ValueError, match="`segment_ids` holds sequences of 17 tokens"):
        bert.predict({"token_ids": np.ones((1, 16), "int32"), "segment_ids": np.zeros((1, 17), "int32")}, verbose=0)


def test_ids_and_labels_outside_the_model_are_refused_before_any_step():
    # A compiled step cannot check values: on JAX and under XLA on TF the
    # gathers clamped such ids, and fit trained on them without a word.
    model, ids, labels = gpt_data()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    past = np.where(ids == ids.max(), VOCAB, ids)
    with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 64\) \(vocab_size=64\), got values from 1 to 64"):
        model.fit(keras.ops.convert_to_tensor(past), labels, verbose=0)
    with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 64\)"):
        model.predict(past, verbose=0)
    for bad in (VOCAB, -100):
        with pytest.raises(ValueError, match=rf"Labels `y` must be ids in \[0, 64\) for the model's 64 logits, got values from {min(1, bad)}"):
            model.fit(ids, np.where(labels == labels.max(), bad, labels), verbose=0)
    with pytest.raises(ValueError, match="Labels `y` must be ids"):
        model.fit(ids, labels, validation_data=(ids, labels + VOCAB), verbose=0)
    model.fit(ids, labels.astype("float32"), verbose=0)  # Float labels of ids still train, as Keras's losses take them.
    transformer = Transformer(VOCAB, 1, 2, 32, 64, share_embeddings=False, tie_embeddings=False, target_vocab_size=20)
    transformer.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    inputs = {"encoder_token_ids": ids, "decoder_token_ids": ids % 30}
    with pytest.raises(ValueError, match=r"`decoder_token_ids` must lie in \[0, 20\) \(target_vocab_size=20\)"):
        transformer.evaluate(inputs, labels % 20, verbose=0)
    classifier, inputs, classes = bert_data()
    classifier.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"`segment_ids` must lie in \[0, 2\) \(num_segments=2\)"):
        classifier.fit({**inputs, "segment_ids": inputs["segment_ids"] + 2}, classes, verbose=0)
    with pytest.raises(ValueError, match=r"Labels `y` must be ids in \[0, 3\) for the model's 3 logits, got values from 0 to 3"):
        classifier.fit(inputs, np.where(classes == 2, 3, classes), verbose=0)


def test_data_of_no_examples_is_refused_by_name():
    # Keras's predict had failed on it with an UnboundLocalError from its loop.
    model, ids, labels = gpt_data()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    message = r"`token_ids` holds no examples \(0 rows\)"
    for call in (lambda: model.predict(ids[:0], verbose=0), lambda: model.evaluate(ids[:0], labels[:0], verbose=0),
                 lambda: model.fit(keras.ops.convert_to_tensor(ids[:0]), labels[:0], verbose=0)):
        with pytest.raises(ValueError, match=message):
            call()
    classifier, inputs, classes = bert_data()
    with pytest.raises(ValueError, match=r"`segment_ids` holds no examples"):
        classifier.predict({**inputs, "segment_ids": inputs["segment_ids"][:0]}, verbose=0)


def test_bert_takes_token_ids_alone_as_one_segment():
    # As transformers defaults `token_type_ids`; Keras had refused a missing input (on JAX, naming `pooled_output`).
    classifier, inputs, classes = bert_data()
    classifier.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = inputs["token_ids"]
    assert not inputs["segment_ids"].any()
    expected = to_numpy(classifier(inputs))
    for given in ({"token_ids": ids}, ids, {"token_ids": ids, "segment_ids": None}):
        np.testing.assert_allclose(to_numpy(classifier(given)), expected, atol=1e-6)
        np.testing.assert_allclose(classifier.predict(given, verbose=0), expected, atol=1e-5)
    assert np.isfinite(classifier.evaluate({"token_ids": ids}, classes, verbose=0))
    validation = ({"token_ids": ids, "segment_ids": None}, classes)
    history = classifier.fit(ids, classes, epochs=2, batch_size=8, validation_data=validation, verbose=0).history
    assert np.isfinite(history["loss"]).all() and np.isfinite(history["val_loss"]).all()
    # Token ids alone are checked as token ids, not as the segments.
    with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 64\) \(vocab_size=64\)"):
        classifier.predict(np.where(ids == ids[0, 0], VOCAB, ids), verbose=0)
    # Other segments still count.
    segments = {"token_ids": ids, "segment_ids": np.ones_like(ids)}
    assert np.abs(to_numpy(classifier(segments)) - expected).max() > 1e-4


@pytest.mark.parametrize("builder, arguments, name, value", [
    (GPT, {}, "vocab_size", 0),
    (GPT, {}, "num_layers", -1),  # Keras would build a model with no blocks.
    (GPT, {}, "hidden_dim", "32"),
    (GPT, {}, "intermediate_dim", 0),  # Keras would build a feed-forward of width 0.
    (GPT, {}, "max_sequence_length", 12.5),
    (BERT, {}, "num_segments", 0),
    (T5, {"intermediate_dim": 64}, "num_decoder_layers", 0),
    (T5, {"intermediate_dim": 64}, "relative_attention_num_buckets", True),
    (Transformer, {"intermediate_dim": 64}, "target_vocab_size", -5),
])
def test_sizes_must_be_positive_ints(builder, arguments, name, value):
    base = dict(vocab_size=VOCAB, num_layers=1, num_heads=2, hidden_dim=32, **arguments)
    with pytest.raises(ValueError, match=f"{builder.__name__}'s `{name}` must be a positive int, got {value!r}"):
        builder(**{**base, name: value})


@pytest.mark.parametrize("name, value, message", [
    # Positive, but too few for T5's bucketing: it had failed in a division by zero.
    ("relative_attention_num_buckets", 2, "T5's `relative_attention_num_buckets` must be an int >= 4, got 2"),
    ("relative_attention_max_distance", 8, "T5's `relative_attention_max_distance` must be an int >= 9, got 8"),
])
def test_t5_relative_buckets_must_fit_its_bucketing(name, value, message):
    with pytest.raises(ValueError, match=message):
        T5(VOCAB, num_layers=1, num_heads=2, hidden_dim=32, **{name: value})


@pytest.mark.parametrize("builder", [GPT, BERT, T5, Transformer])
def test_feed_forward_width_defaults_to_four_times_the_model_width(builder):
    """As in GPT-2, BERT, t5-small/base and both of the paper's Transformers; also at other widths."""
    from kerasformer.layers import FeedForward

    model = builder(VOCAB, num_layers=1, num_heads=2, hidden_dim=24)
    feedforwards = [layer for layer in model._flatten_layers() if isinstance(layer, FeedForward)]
    assert len(feedforwards) == (1 if builder in (GPT, BERT) else 2)
    for feedforward in feedforwards:
        assert tuple(feedforward.intermediate_dense.kernel.shape) == (24, 96)
        assert tuple(feedforward.output_dense.kernel.shape) == (96, 24)


def test_pad_token_id_must_be_in_the_vocabulary():
    with pytest.raises(ValueError, match=f"BERT's `pad_token_id` must be a token id in \\[0, {VOCAB}\\), got {VOCAB}"):
        BERT(VOCAB, 1, 2, 32, pad_token_id=VOCAB)
    with pytest.raises(ValueError, match="T5's `pad_token_id` must be a token id"):
        T5(VOCAB, 1, 2, 32, 64, pad_token_id=-1)


@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
def test_t5_initializes_as_transformers_does(version):
    """Each T5 weight role starts with the spread of `transformers`' own init.

    T5 does not scale attention scores by 1/sqrt(d_kv); its query init does.
    The reference is a randomly initialized `T5ForConditionalGeneration`.
    """
    transformers = pytest.importorskip("transformers")
    gated = version == "v1.1"
    config = transformers.T5Config(
        vocab_size=512, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
    )
    reference = transformers.T5ForConditionalGeneration(config)
    hf_roles = {"shared": "embedding", "lm_head": "head", "relative_attention_bias": "position_bias",
                "SelfAttention.q": "query", "EncDecAttention.q": "query", "SelfAttention.k": "key",
                "EncDecAttention.k": "key", "SelfAttention.v": "value", "EncDecAttention.v": "value",
                "SelfAttention.o": "attention_output", "EncDecAttention.o": "attention_output",
                "wi": "ffn_input", "wi_0": "ffn_input", "wi_1": "ffn_input", "wo": "ffn_output"}

    def hf_role(name):
        parts = name.removesuffix(".weight").split(".")
        return hf_roles.get(".".join(parts[-2:])) or hf_roles.get(parts[-1])

    ours = T5(vocab_size=512, num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=256, head_dim=32,
              activation="geglu_tanh" if gated else "relu", tie_embeddings=not gated)
    our_roles = {"token_embedding/embeddings": "embedding", "lm_head/kernel": "head", "position_bias/embeddings": "position_bias",
                 "attention/query/kernel": "query", "attention/key/kernel": "key", "attention/value/kernel": "value",
                 "attention/output/kernel": "attention_output", "feedforward/intermediate/kernel": "ffn_input",
                 "feedforward/gate/kernel": "ffn_input", "feedforward/output/kernel": "ffn_output"}

    def our_role(path):
        return next((role for suffix, role in our_roles.items() if path.endswith(suffix)), None)

    def spreads(named_values, role_of):
        pooled = {}
        for name, value in named_values:
            role = role_of(name)
            if role is not None:
                pooled.setdefault(role, []).append(np.asarray(value, "float64").ravel())
        return {role: np.concatenate(values).std() for role, values in pooled.items()}

    expected = spreads(((n, p.detach().numpy()) for n, p in reference.named_parameters()), hf_role)
    got = spreads(((w.path, to_numpy(w)) for w in ours.weights), our_role)
    if gated:  # transformers 5's T5Config always ties; its init gives an untied lm_head N(0, 1).
        expected.setdefault("head", 1.0)
    assert set(got) == set(expected) == set(our_roles.values()) - ({"head"} if not gated else set())
    for role, std in expected.items():
        tolerance = 0.2 if role == "position_bias" else 0.05  # (32, 4) tables: few samples.
        assert got[role] == pytest.approx(std, rel=tolerance), role

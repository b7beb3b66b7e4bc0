"""SavedModels exported from every backend give the in-memory model's outputs."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from kerasformer import data
from kerasformer.export import export
from kerasformer.generate import generate
from kerasformer.layers import DecoderBlock, PositionEmbedding
from kerasformer.models import GPT, BERTClassifier, BERTMaskedLM, Transformer, from_preset
from tests.conftest import to_numpy
from tests.generate_test import greedy_in_windows_by_full_passes, seq2seq, seq2seq_greedy_by_full_passes

VOCAB = 64
# Runs in a fresh process that imports TensorFlow only (not keras, not kerasformer).
LOADER = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # The WordPiece / SentencePiece ops of text signatures, as `kerasformer serve` loads them.
assert "kerasformer" not in sys.modules and "keras_hub" not in sys.modules
path, request = sys.argv[1], json.loads(sys.argv[2])
module = tf.saved_model.load(path)
results = {"signatures": sorted(module.signatures)}
for key, inputs in request.items():  # "NAME" or "NAME#call": several calls of one signature.
    name = key.split("#")[0]
    try:
        if name == "serve":  # Keras's endpoint: the model's inputs as the model takes them, ids or a dict of ids.
            ids = lambda v: tf.constant(v, tf.int32)
            outputs = module.serve({k: ids(v) for k, v in inputs.items()} if isinstance(inputs, dict) else ids(inputs))
            outputs = outputs if isinstance(outputs, dict) else {"output": outputs}
        else:
            function = module.signatures[name]
            specs = function.structured_input_signature[1]
            outputs = function(**{k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()})
    except tf.errors.InvalidArgumentError as error:  # A request the graph's checks refuse: "assertion failed: [text] ...".
        results[key] = {"error": error.message.split("assertion failed: [", 1)[-1].split("] [", 1)[0]}
        continue
    results[key] = {k: [x.decode() if isinstance(x, bytes) else x for x in v.numpy().tolist()] for k, v in outputs.items()}
print(json.dumps(results))
"""


def run_saved_model(path, request):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_BACKEND", None)
    result = subprocess.run([sys.executable, "-c", LOADER, str(path), json.dumps(request)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def train_briefly(model, inputs, labels):
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(inputs, labels, epochs=1, batch_size=4, verbose=0)


def token_ids(shape, seed=0):
    return np.random.default_rng(seed).integers(3, VOCAB, shape).astype("int32")


GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "stop_token_ids": []}


def test_gpt_export_matches_logits_and_greedy_generation(tmp_path):
    model = from_preset("gpt2-tiny", vocab_size=VOCAB)
    sequences = token_ids((8, 13))
    train_briefly(model, sequences[:, :-1], sequences[:, 1:])
    path = export(model, tmp_path / "gpt")
    ids = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], "int32")
    mask = (ids != 0).astype("int32")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    greedy = generate(model, prompts, max_new_tokens=6)
    stop = int(greedy[0, 2])  # The first row stops after its third token.
    prompt = {"token_ids": ids.tolist(), "padding_mask": mask.tolist(), "max_new_tokens": 6}
    results = run_saved_model(path, {
        "serving_default": {"token_ids": ids.tolist(), "padding_mask": mask.tolist()},
        "generate": {**prompt, **GREEDY},
        "generate#stop": {**prompt, **GREEDY, "stop_token_ids": [stop]},
        # Sampling at temperature 1 that only the argmax survives: top-k 1, and a top-p below any token's probability.
        "generate#top_k": {**prompt, **GREEDY, "temperature": 1.0, "top_k": 1, "seed": 3},
        "generate#top_p": {**prompt, **GREEDY, "temperature": 1.0, "top_p": 1e-6, "seed": 3},
        "generate#sampled": {**prompt, **GREEDY, "temperature": 1.0, "seed": 3},
    })
    assert {"serving_default", "generate"} <= set(results["signatures"])
    logits = np.array(results["serving_default"]["logits"])
    expected = to_numpy(model(ids))
    np.testing.assert_allclose(logits[0], expected[0], atol=1e-4)
    np.testing.assert_allclose(logits[1, :3], expected[1, :3], atol=1e-4)
    generated = {key: np.array(value["generated_ids"]) for key, value in results.items() if key.startswith("generate")}
    np.testing.assert_array_equal(generated["generate"], greedy)
    np.testing.assert_array_equal(generated["generate#stop"], generate(model, prompts, max_new_tokens=6, stop_token_ids=[stop]))
    assert generated["generate#stop"][0, 3:].tolist() == [0, 0, 0]
    np.testing.assert_array_equal(generated["generate#top_k"], greedy)
    np.testing.assert_array_equal(generated["generate#top_p"], greedy)
    assert not np.array_equal(generated["generate#sampled"], greedy)  # The same seed, unfiltered: a sample.


@pytest.mark.parametrize("position_type", ["learned", "rotary"])
def test_exported_gpt_generates_past_its_context_in_windows(position_type, tmp_path):
    model = GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=12, position_type=position_type)
    path = export(model, tmp_path / "gpt")
    # The last prompt is longer than the context: its last 11 tokens count.
    prompts = [[5, 6, 7], [8, 9], list(range(1, 16))]
    ids = data.pad_batch(prompts)
    expected = [greedy_in_windows_by_full_passes(model, prompt, 20, window=12) for prompt in prompts]
    stop = expected[0][14]
    request = {"token_ids": ids.tolist(), "padding_mask": (ids != 0).astype("int32").tolist(), "max_new_tokens": 20, **GREEDY}
    sampled = {**request, "temperature": 1.0, "seed": 3}
    # The same prompts padded on the left, as Hugging Face pads for generation.
    left = np.stack([np.roll(row, (row == 0).sum()) for row in ids])
    left_padded = {**request, "token_ids": left.tolist(), "padding_mask": (left != 0).astype("int32").tolist()}
    results = run_saved_model(path, {
        "generate": request, "generate#stop": {**request, "stop_token_ids": [stop]}, "generate#left": left_padded,
        "generate#sampled": sampled, "generate#again": sampled, "generate#other_seed": {**sampled, "seed": 4},
    })
    np.testing.assert_array_equal(results["generate"]["generated_ids"], expected)
    np.testing.assert_array_equal(results["generate#left"]["generated_ids"], expected)
    # A seed repeats its samples in every window, and another seed changes them.
    assert results["generate#sampled"] == results["generate#again"] != results["generate#other_seed"]
    # New tokens 10 on come from later windows in every row (the first holds 9, 10 and 1 new tokens).
    later = [np.array(results[key]["generated_ids"])[:, 10:] for key in ("generate#sampled", "generate#other_seed")]
    assert not np.array_equal(*later)
    # A stop token ends its row in any window; the other rows go on.
    stopped = np.array(results["generate#stop"]["generated_ids"])
    first = expected[0].index(stop)
    assert stopped[0].tolist() == expected[0][: first + 1] + [0] * (19 - first)
    np.testing.assert_array_equal(stopped, generate(model, prompts, max_new_tokens=20, stop_token_ids=[stop]))


def test_exported_transformer_keeps_to_its_learned_positions(tmp_path):
    model = seq2seq(Transformer, position_type="learned", max_sequence_length=8)
    words = [f"w{i}" for i in range(43)]
    tokenizer = data.word_tokenizer(words)  # As many ids as the model's vocabulary (with the 7 special tokens).
    path = export(model, tmp_path / "transformer", tokenizer=tokenizer)
    source = token_ids((2, 8)) % 40 + 3  # The vocabulary of `seq2seq`'s model is smaller.
    mask = np.ones_like(source).tolist()
    request = {"encoder_token_ids": source.tolist(), "encoder_padding_mask": mask, "max_new_tokens": 8, **GREEDY, "start_token_id": 1}
    long_source = [[5] * 9]
    texts = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9 w10 w11"]
    text_greedy = {k: v for k, v in GREEDY.items() if k != "stop_token_ids"}
    results = run_saved_model(path, {
        "generate": request,  # The decoder reads positions 0-7: its start token and 7 new tokens.
        "generate#too_many": {**request, "max_new_tokens": 9},
        "generate#long_source": {**request, "encoder_token_ids": long_source, "encoder_padding_mask": [[1] * 9]},
        "serving_default": {"encoder_token_ids": source.tolist(), "encoder_padding_mask": mask, "decoder_token_ids": [[1] * 9] * 2},
        # Text asks for more than the table holds, as `kerasformer generate`'s
        # default may: it ends by the table's end, with the tokens of 8.
        "generate_text": {"text": texts, "max_new_tokens": 20, **text_greedy},
        "generate_text#table": {"text": texts, "max_new_tokens": 8, **text_greedy},
        "generate_text#long": {"text": [" ".join(words[:9])], "max_new_tokens": 4, **text_greedy},
    })
    expected = [seq2seq_greedy_by_full_passes(model, list(row), 8, start=1) for row in source]
    np.testing.assert_array_equal(results["generate"]["generated_ids"], expected)
    message = "{} must fit the learned positions: at most 8 tokens (max_sequence_length=8)."
    assert results["generate#too_many"] == {"error": message.format("`max_new_tokens`")}
    assert results["generate#long_source"] == {"error": message.format("`encoder_token_ids`")}
    assert results["serving_default"] == {"error": message.format("`decoder_token_ids`")}
    assert results["generate_text"] == results["generate_text#table"]
    end = data.SPECIAL_TOKENS.index(data.END)
    sources = data.pad_batch([data.encode(tokenizer, t) for t in texts])
    new = generate(model, sources, max_new_tokens=8, stop_token_ids=[end], start_token_id=data.SPECIAL_TOKENS.index(data.START))
    control = [data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK, data.START)]
    # The text ends at an end or pad id and leaves out control tokens (this untrained model writes [SEP]s).
    expected = [data.decode(tokenizer, [t for t in _until(row, (0, end)) if t not in control]) for row in new]
    assert results["generate_text"]["text"] == expected
    assert results["generate_text#long"] == {"error": message.format("Each `text`")}


def _until(ids, stops):
    return [int(t) for t in ids[: next((i for i, t in enumerate(ids) if t in stops), len(ids))]]


def test_bert_export_matches_and_has_fill_mask_and_embed(tmp_path):
    model = BERTMaskedLM(from_preset("bert-tiny", vocab_size=VOCAB))
    ids = token_ids((8, 10))
    train_briefly(model, {"token_ids": ids, "segment_ids": np.zeros_like(ids)}, ids)
    path = export(model, tmp_path / "bert")
    query = np.array([[2, 5, 4, 7, 3, 0]], "int32")
    mask = (query != 0).astype("int32")
    inputs = {"token_ids": query.tolist(), "padding_mask": mask.tolist(), "segment_ids": np.zeros_like(query).tolist()}
    # Segment ids past BERT's 2 segments: refused by name in the graph (a CPU gather took -1 silently).
    refused = {f"embed#{i}": {**inputs, "segment_ids": [[0, 0, value, 0, 0, 0]]} for i, value in enumerate((2, -1))}
    results = run_saved_model(path, {"serving_default": inputs, "fill_mask": inputs, "embed": inputs, **refused})
    for key in refused:
        assert results[key] == {"error": "`segment_ids` must lie in [0, 2) (num_segments=2)."}
    assert {"serving_default", "fill_mask", "embed"} <= set(results["signatures"])
    expected = to_numpy(model({"token_ids": query, "segment_ids": np.zeros_like(query)}))
    np.testing.assert_allclose(np.array(results["serving_default"]["logits"])[0, :5], expected[0, :5], atol=1e-4)
    np.testing.assert_array_equal(np.array(results["fill_mask"]["predicted_ids"])[0, :5], expected[0, :5].argmax(-1))
    assert np.array(results["embed"]["pooled_output"]).shape == (1, model.backbone.hidden_dim)


def test_t5_export_matches_logits_and_greedy_generation(tmp_path):
    model = from_preset("t5-tiny", vocab_size=VOCAB)
    source, target = token_ids((8, 9)), token_ids((8, 6), seed=1)
    train_briefly(model, {"encoder_token_ids": source, "decoder_token_ids": target}, target)
    path = export(model, tmp_path / "t5")
    encoder = np.array([[5, 6, 7, 8], [9, 10, 0, 0]], "int32")
    mask = (encoder != 0).astype("int32")
    decoder = np.array([[1, 5, 6], [1, 7, 8]], "int32")
    results = run_saved_model(path, {
        "serving_default": {"encoder_token_ids": encoder.tolist(), "encoder_padding_mask": mask.tolist(), "decoder_token_ids": decoder.tolist()},
        "generate": {"encoder_token_ids": encoder.tolist(), "encoder_padding_mask": mask.tolist(), "max_new_tokens": 5,
                     **GREEDY, "start_token_id": 1},
    })
    expected = to_numpy(model({"encoder_token_ids": encoder, "decoder_token_ids": decoder}))
    np.testing.assert_allclose(np.array(results["serving_default"]["logits"]), expected, atol=1e-4)
    np.testing.assert_array_equal(np.array(results["generate"]["generated_ids"]), generate(model, encoder, max_new_tokens=5, start_token_id=1))


def test_exported_gpt2_beam_search_equals_transformers(tmp_path):
    import torch

    from kerasformer.convert import from_huggingface
    from tests.generate_test import chaotic_hf, ended_with_padding
    from tests.models.convert_test import tiny_gpt2

    hf = chaotic_hf(tiny_gpt2())  # 32 positions
    model = from_huggingface(hf)
    path = export(model, tmp_path / "gpt2")
    prompts = [[5, 17, 33, 2, 80], [44, 9, 61], [12, 70]]
    stop = [int(generate(model, prompts, max_new_tokens=10, num_beams=4)[1, 2])]  # A token the beams reach.
    ids = data.pad_batch(prompts)
    left = np.stack([np.roll(row, (row == 0).sum()) for row in ids])  # Padded on the left, as Hugging Face pads.
    request = {"token_ids": ids.tolist(), "padding_mask": (ids != 0).astype("int32").tolist(), "max_new_tokens": 10,
               "num_beams": 4, "length_penalty": 2.0, "stop_token_ids": stop}
    results = run_saved_model(path, {
        "beam_search": request,
        "beam_search#left": {**request, "token_ids": left.tolist(), "padding_mask": (left != 0).astype("int32").tolist()},
        "beam_search#no_stop": {**request, "stop_token_ids": [], "length_penalty": 1.0},
        "beam_search#one_beam": {**request, "num_beams": 1},
        "beam_search#no_beams": {**request, "num_beams": 0},
        "beam_search#past_context": {**request, "max_new_tokens": 28},
    })
    for key, stops, penalty in [("beam_search", stop, 2.0), ("beam_search#left", stop, 2.0), ("beam_search#no_stop", [], 1.0)]:
        for prompt, row in zip(prompts, results[key]["generated_ids"]):
            reference = hf.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=4,
                do_sample=False, max_new_tokens=10, eos_token_id=stops or None, pad_token_id=0, length_penalty=penalty,
            )[0, len(prompt):].numpy()
            np.testing.assert_array_equal(row, np.pad(ended_with_padding(reference, stops)[0], (0, 10 - len(reference))), key)
    # One beam is greedy decoding, as `generate(num_beams=1)`.
    np.testing.assert_array_equal(results["beam_search#one_beam"]["generated_ids"],
                                  generate(model, prompts, max_new_tokens=10, stop_token_ids=stop))
    assert results["beam_search#no_beams"] == {"error": "`num_beams` must be at least 1."}
    assert results["beam_search#past_context"] == {"error": "Beam search must fit the context: the longest prompt + "
                                                             "`max_new_tokens` must be at most max_sequence_length=32."}


def test_exported_t5_beam_search_equals_transformers(tmp_path):
    import torch

    from kerasformer.convert import from_huggingface
    from tests.generate_test import chaotic_hf, ended_with_padding
    from tests.models.convert_test import tiny_t5

    hf = chaotic_hf(tiny_t5())
    model = from_huggingface(hf)
    path = export(model, tmp_path / "t5")
    sources = np.random.default_rng(1).integers(2, 103, (3, 7)).astype("int32")
    sources[2, 4:] = 0  # A shorter source, padded.
    stop = [int(generate(model, sources, max_new_tokens=8, num_beams=3)[1, 2])]  # A token the beams reach.
    request = {"encoder_token_ids": sources.tolist(), "encoder_padding_mask": (sources != 0).astype("int32").tolist(),
               "max_new_tokens": 8, "num_beams": 3, "length_penalty": 1.0, "stop_token_ids": [], "start_token_id": 0}
    results = run_saved_model(path, {"beam_search": request, "beam_search#stop": {**request, "stop_token_ids": stop}})
    for key, stops in (("beam_search", []), ("beam_search#stop", stop)):
        reference = hf.generate(
            torch.tensor(sources, dtype=torch.long), attention_mask=torch.tensor(sources != 0, dtype=torch.long), num_beams=3,
            do_sample=False, max_new_tokens=8, eos_token_id=stops or None, decoder_start_token_id=0, pad_token_id=0,
        )[:, 1:].numpy()
        reference = np.pad(ended_with_padding(reference, stops), [(0, 0), (0, 8 - reference.shape[1])])
        np.testing.assert_array_equal(results[key]["generated_ids"], reference, key)


def test_exported_seq2seq_generation_pads_with_the_models_pad_id(tmp_path):
    # The buffer had been zeros: a row that stopped before the loop ended read 0s, where `generate` gives pad ids.
    model = seq2seq(Transformer, pad_token_id=3)
    path = export(model, tmp_path / "transformer")
    sources = np.array([[5, 6, 7, 8], [9, 10, 3, 3]], "int32")
    free = generate(model, sources, max_new_tokens=6, start_token_id=1)
    stop = [int(free[0, 1]), int(free[1, 1])]  # Both rows stop by their second token, and the loop ends there.
    request = {"encoder_token_ids": sources.tolist(), "encoder_padding_mask": (sources != 3).astype("int32").tolist(),
               "max_new_tokens": 6, "stop_token_ids": stop, "start_token_id": 1}
    results = run_saved_model(path, {
        "generate": {**request, **{k: v for k, v in GREEDY.items() if k != "stop_token_ids"}},
        "beam_search": {**request, "num_beams": 2, "length_penalty": 1.0},
    })
    expected = generate(model, sources, max_new_tokens=6, start_token_id=1, stop_token_ids=stop)
    assert np.all(expected[:, 2:] == 3)
    np.testing.assert_array_equal(results["generate"]["generated_ids"], expected)
    np.testing.assert_array_equal(results["beam_search"]["generated_ids"],
                                  generate(model, sources, max_new_tokens=6, start_token_id=1, stop_token_ids=stop, num_beams=2))


@pytest.mark.parametrize("family", ["gpt", "bert", "bert_classifier", "t5"])
def test_keras_export_writes_a_saved_model_with_keras_serve_endpoint_on_every_backend(family, tmp_path):
    # Keras's own export had failed: on torch for every model, on JAX for BERT (token and segment ids of one length).
    ids = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 2, 0]], "int32")
    if family == "gpt":
        model = GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=8)
        inputs = ids
    elif family == "t5":
        model = from_preset("t5-tiny", vocab_size=VOCAB)
        inputs = {"encoder_token_ids": ids, "decoder_token_ids": ids[:, :3]}
    else:
        model = from_preset("bert-tiny", vocab_size=VOCAB, max_sequence_length=8)
        model = model if family == "bert" else BERTClassifier(model, num_classes=3)
        inputs = {"token_ids": ids, "segment_ids": (np.arange(5) > 2).astype("int32")[None].repeat(2, 0)}
    path = model.export(tmp_path / family, verbose=False)
    too_long = {k: np.tile(v, 2) for k, v in inputs.items()} if isinstance(inputs, dict) else np.tile(inputs, 2)
    lists = lambda x: {k: v.tolist() for k, v in x.items()} if isinstance(x, dict) else x.tolist()  # noqa: E731
    results = run_saved_model(path, {"serve": lists(inputs), "serve#too_long": lists(too_long)})
    outputs = model(inputs)
    expected = {k: to_numpy(v) for k, v in outputs.items()} if isinstance(outputs, dict) else {"output": to_numpy(outputs)}
    assert set(results["serve"]) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(np.array(results["serve"][key]), value, atol=1e-4)
    # Keras's endpoint sits beside kerasformer's signatures, and keeps their checks.
    assert "serving_default" in results["signatures"]
    assert ("generate" in results["signatures"]) == (family in ("gpt", "t5"))
    if family != "t5":  # T5's relative positions have no table to pass.
        assert results["serve#too_long"]["error"] == "`token_ids` must fit the learned positions: at most 8 tokens (max_sequence_length=8)."


def assembled_model(extra_layer=None):
    """A language model built from kerasformer's layers, not one of its builders (README: "Or assembled from the layers")."""
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(tokens)
    x = x + PositionEmbedding(sequence_length=8)(x)
    x = DecoderBlock(num_heads=2, norm_first=True, activation="gelu")(x)
    x = extra_layer(x) if extra_layer is not None else x
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(keras.layers.LayerNormalization()(x)))


def test_a_model_assembled_from_layers_exports_from_every_backend(tmp_path):
    # Keras's own export fails on torch; `export` had refused any model but kerasformer's builders.
    from tests.serving.custom_layers import Scale  # A user's registered layer: the TF process must import its module.

    model = assembled_model(Scale())
    path = export(model, tmp_path / "assembled")
    ids = np.array([[5, 6, 7, 0], [8, 9, 10, 11]], "int32")
    results = run_saved_model(path, {"serve": ids.tolist(), "serving_default": {"token_ids": ids.tolist()},
                                     "serve#too_long": [[5] * 9]})
    expected = to_numpy(model(ids))
    np.testing.assert_allclose(np.array(results["serve"]["output"]), expected, atol=1e-4)
    np.testing.assert_allclose(np.array(results["serving_default"]["output_0"]), expected, atol=1e-4)
    # Past the learned table: the layer's check in the graph names it (the gather said "indices[8] = 8 is not in [0, 8)").
    assert results["serve#too_long"]["error"] == "The sequence does not fit the learned position table of `sequence_length=8`."
    with pytest.raises(ValueError, match="`tokenizer` needs a kerasformer model"):
        export(model, tmp_path / "with_tokenizer", tokenizer=data.train_tokenizer("char", ["abc"]))
    with pytest.raises(ValueError, match="`model` must be a keras.Model, got a DecoderBlock"):
        export(DecoderBlock(num_heads=2), tmp_path / "layer")


def test_a_model_with_a_class_of_the_script_itself_is_refused_by_name_off_tensorflow(tmp_path):
    shift = type("Shift", (keras.layers.Layer,), {"call": lambda self, x: x + 1.0, "__module__": "__main__"})
    model = assembled_model(shift())
    if keras.backend.backend() == "tensorflow":  # Exported in this process, from the live model.
        assert os.path.isfile(os.path.join(export(model, tmp_path / "shifted"), "saved_model.pb"))
        return
    with pytest.raises(ValueError, match=r"classes defined in the script itself \(Shift\).*Define them in a module"):
        export(model, tmp_path / "shifted")
    assert not os.path.exists(tmp_path / "shifted")


def test_seq2seq_generate_text_stops_at_the_end_token_and_leaves_out_control_tokens(tmp_path):
    # As `kerasformer generate` reads a seq2seq run: decoding starts at [START], the text ends at [END]
    # and control tokens the model writes ([CLS], [SEP], [MASK], [START]) are not words of it.
    words = "one two three four five six".split()
    tokenizer = data.word_tokenizer(words)
    model = from_preset("t5-tiny", vocab_size=int(tokenizer.vocabulary_size()))
    cls, start, end = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.START, data.END))
    five, four = (int(data.encode(tokenizer, w)[0]) for w in ["five", "four"])
    sources = [data.encode(tokenizer, text) for text in ["one two", "three four five", "six", "two one"] * 4]
    inputs, labels, weights = data.seq2seq_arrays(sources, [[five, cls, four, start]] * 16, start, end)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(inputs, labels, sample_weight=weights, epochs=40, batch_size=16, verbose=0)  # Learns "five [CLS] four [START] [END]".
    path = export(model, tmp_path / "t5_text", tokenizer=tokenizer)
    texts = ["one two", "six"]
    new = generate(model, data.pad_batch([data.encode(tokenizer, t) for t in texts]), max_new_tokens=8,
                   stop_token_ids=[end], start_token_id=start)
    np.testing.assert_array_equal(new[:, :5], [[five, cls, four, start, end]] * 2)  # Then padding.
    results = run_saved_model(path, {"generate_text": {"text": texts, "max_new_tokens": 8, **{k: v for k, v in GREEDY.items() if k != "stop_token_ids"}}})
    assert results["generate_text"]["text"] == ["five four", "five four"]
    assert [data.decode_target(tokenizer, row) for row in new] == ["five four", "five four"]


def test_fill_mask_text_fills_each_mask_of_a_bert_row(tmp_path):
    words = "the cat sat on a mat dog ran".split()
    tokenizer = data.word_tokenizer(words)
    model = BERTMaskedLM(from_preset("bert-tiny", vocab_size=int(tokenizer.vocabulary_size())))
    ids = np.random.default_rng(0).integers(len(data.SPECIAL_TOKENS), len(data.SPECIAL_TOKENS) + len(words), (8, 10)).astype("int32")
    train_briefly(model, {"token_ids": ids, "segment_ids": np.zeros_like(ids)}, ids)
    path = export(model, tmp_path / "bert_text", tokenizer=tokenizer)
    texts = ["the cat [MASK] on a mat", "[MASK] dog ran [MASK]"]
    results = run_saved_model(path, {"fill_mask_text": {"text": texts}})
    cls, sep, mask = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))
    for text, filled in zip(texts, results["fill_mask_text"]["text"]):
        # As `kerasformer train bert` writes rows: [CLS] words [SEP], a [MASK] id per mask.
        row = [cls] + [mask if w == data.MASK else int(data.encode(tokenizer, w)[0]) for w in text.split()] + [sep]
        logits = to_numpy(model({"token_ids": np.array([row]), "segment_ids": np.zeros((1, len(row)), "int32")}))[0]
        expected = [tokenizer.id_to_token(int(logits[i].argmax())) if t == mask else w
                    for i, (t, w) in enumerate(zip(row[1:-1], text.split()), start=1)]
        assert filled == " ".join(expected)


def test_classify_text_reads_a_bert_row(tmp_path):
    tokenizer = data.word_tokenizer("the cat sat on a mat".split())
    model = BERTClassifier(from_preset("bert-tiny", vocab_size=int(tokenizer.vocabulary_size())), num_classes=3)
    path = export(model, tmp_path / "classifier_text", tokenizer=tokenizer)
    results = run_saved_model(path, {"classify_text": {"text": ["the cat sat", "a mat"]}})
    cls, sep = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP))
    for text, probabilities in zip(["the cat sat", "a mat"], results["classify_text"]["probabilities"]):
        row = np.array([[cls, *data.encode(tokenizer, text), sep]])
        logits = to_numpy(model({"token_ids": row, "segment_ids": np.zeros_like(row)}))[0]
        np.testing.assert_allclose(probabilities, np.exp(logits) / np.exp(logits).sum(), atol=1e-5)


@pytest.mark.parametrize("kind", ["char", "words", "bpe"])
def test_text_signature_carries_the_tokenizer(kind, tmp_path):
    if kind == "char":
        tokenizer, prompt = data.train_tokenizer("char", ["abcdefghij"]), "abc"
    elif kind == "bpe":  # SentencePiece without normalization: the graph's tokenizer keeps newlines and spaces too.
        lines = ["the cat sat", "  on the mat", "", "a dog ran"] * 30
        tokenizer, prompt = data.train_tokenizer("bpe", lines, vocabulary_size=30), "the cat\n  on"
    else:
        tokenizer, prompt = data.word_tokenizer("the cat sat on a mat".split()), "the cat"
    model = from_preset("gpt2-tiny", vocab_size=int(tokenizer.vocabulary_size()))
    path = export(model, tmp_path / "gpt_text", tokenizer=tokenizer)
    options = {k: v for k, v in GREEDY.items() if k != "stop_token_ids"}
    results = run_saved_model(path, {"generate_text": {"text": [prompt], "max_new_tokens": 4, **options}})
    new = [int(i) for i in generate(model, [data.encode(tokenizer, prompt)], max_new_tokens=4)[0]]
    new = new[: new.index(0)] if 0 in new else new  # Text ends at a padding id.
    if kind == "char":
        expected = prompt + "".join(chr(i) for i in new)
    elif kind == "bpe":  # The prompt as written, then the new pieces as SentencePiece's own library decodes them.
        import sentencepiece  # A requirement of KerasHub.

        processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)
        prompt_ids = [int(i) for i in data.encode(tokenizer, prompt)]
        expected = prompt + processor.decode(prompt_ids + new)[len(processor.decode(prompt_ids)):]
    else:  # Words joined by spaces, the first one too.
        expected = prompt + "".join(" " + tokenizer.id_to_token(i) for i in new)
    assert results["generate_text"]["text"][0] == expected


def test_saved_model_cli_lists_the_signatures_and_export_is_atomic(tmp_path):
    model = from_preset("gpt2-tiny", vocab_size=VOCAB)
    target = tmp_path / "saved_models" / "gpt"
    target.mkdir(parents=True)  # An empty folder is a target too.
    export(model, target)
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = subprocess.run([cli, "show", "--dir", str(target), "--all"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for name in ("serving_default", "generate"):
        assert f"signature_def['{name}']" in shown.stdout
    # A failing export leaves the previous export in place and nothing half-written.
    before = sorted(os.listdir(target))
    from tests.serving.custom_layers import EagerOnly

    untraceable = keras.Sequential([keras.Input((3,)), EagerOnly()])
    untraceable(np.ones((1, 3), "float32"))  # It runs; only its export fails, under TensorFlow's tracing.
    with pytest.raises(Exception, match="convert|numpy|symbolic|Export under the TensorFlow backend failed"):
        export(untraceable, target)
    assert sorted(os.listdir(target)) == before
    assert [p for p in os.listdir(target.parent) if p.startswith(".export")] == []
    # An export replaces a SavedModel or an empty folder, never a file or a folder of other things.
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data.csv").write_text("keep me too")
    for other, kind in ((tmp_path / "notes.txt", "a file"), (tmp_path / "work", "a folder that is not a SavedModel")):
        with pytest.raises(ValueError, match=rf"`path` '.*{other.name}' is {kind}; export to a new folder"):
            export(model, other)
    assert (tmp_path / "notes.txt").read_text() == "keep me" and os.listdir(tmp_path / "work") == ["data.csv"]


@pytest.mark.parametrize("family", ["gpt", "t5", "bert"])
def test_a_bf16_model_serves_float32_outputs_close_to_its_own(family, tmp_path):
    import tensorflow as tf

    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        if family == "bert":
            model = BERTClassifier(from_preset("bert-tiny", vocab_size=VOCAB), num_classes=3)
        else:
            model = from_preset(f"{family}2-tiny" if family == "gpt" else "t5-tiny", vocab_size=VOCAB)
    finally:
        keras.config.set_dtype_policy("float32")
    ids = token_ids((2, 6))
    ones = np.ones_like(ids)
    inputs = {
        "gpt": ({"token_ids": ids}, {"token_ids": ids, "padding_mask": ones}),
        "t5": ({"encoder_token_ids": ids, "decoder_token_ids": ids},
               {"encoder_token_ids": ids, "encoder_padding_mask": ones, "decoder_token_ids": ids}),
        "bert": ({"token_ids": ids, "segment_ids": 0 * ids}, {"token_ids": ids, "padding_mask": ones, "segment_ids": 0 * ids}),
    }[family]
    expected = to_numpy(model(inputs[0] if family != "gpt" else ids)).astype("float32")
    path = export(model, tmp_path / family)
    signatures = tf.saved_model.load(str(path)).signatures
    for name, function in signatures.items():  # bfloat16 outputs would reach JSON clients and softmax as such.
        assert {spec.dtype for spec in function.structured_outputs.values()} <= {tf.float32, tf.int32}, name
    served = run_saved_model(path, {"serving_default": {k: v.tolist() for k, v in inputs[1].items()}})["serving_default"]
    np.testing.assert_allclose(np.array(served["logits"]), expected, atol=0.05 * np.abs(expected).max())


def test_a_quantized_gpt_exports_its_int8_logits_and_greedy_tokens(tmp_path):
    model = GPT(VOCAB, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=16)
    model.quantize("int8")
    ids = token_ids((2, 5))
    path = export(model, tmp_path / "gpt_int8")
    results = run_saved_model(path, {
        "serving_default": {"token_ids": ids.tolist(), "padding_mask": np.ones_like(ids).tolist()},
        "generate": {"token_ids": ids.tolist(), "padding_mask": np.ones_like(ids).tolist(), "max_new_tokens": 4, **GREEDY},
    })
    np.testing.assert_allclose(results["serving_default"]["logits"], to_numpy(model(ids)), atol=1e-3)
    assert results["generate"]["generated_ids"] == generate(model, ids, max_new_tokens=4).tolist()

"""TensorFlow SavedModel export, from whichever backend trained the model.

    kerasformer.export(model, "saved_models/gpt", tokenizer=tokenizer)

Weights do not depend on the backend, so the model is saved as a `.keras`
file and rebuilt under the TensorFlow backend (in a subprocess when the
current backend is another), where the signatures of a kerasformer model
are traced (any other Keras model gets Keras's own `serve` and
`serving_default` there):

- `serving_default`: token ids (+ padding mask, segment ids, decoder ids)
  -> logits, for every model;
- `generate` (GPT, T5, Transformer): prompt ids + padding mask, max new
  tokens, temperature, top-k, top-p, seed, stop token ids -> generated ids,
  the KV-cached loop running inside the graph (a GPT past its context in
  the windows of `kerasformer.generate`);
- `beam_search` (GPT, T5, Transformer): prompt ids + padding mask, max new
  tokens, number of beams, length penalty, stop token ids -> the ids of
  `generate(num_beams=...)`, `transformers`' beam search (one beam: greedy);
- `fill_mask`, `embed` (BERT masked LM), `classify`, `embed` (BERT
  classifier);
- `serve`, the endpoint of Keras's `model.export` (not a signature): the
  model's inputs as it takes them -> its outputs, so that
  `tf.saved_model.load(path).serve(inputs)` works as for any Keras export;
  our models' `model.export(path)` writes this SavedModel on every backend;
- with a KerasHub tokenizer: `generate_text` and `beam_search_text` (GPT, T5, Transformer) and
  `fill_mask_text` (each "[MASK]" of the text filled with the predicted
  token) / `classify_text` (BERT; rows read as `[CLS] text [SEP]`, as
  `kerasformer train bert` writes them), strings in and out, the tokenizer
  inside the graph.

The SavedModel is written to a temporary folder beside the target and moved
into place at the end, so a failed export never leaves a half-written folder.
Batch and sequence dimensions are dynamic. A signature takes every input
(TF Serving has no optional inputs); `kerasformer.json` beside it records the
values `kerasformer serve` fills in for the generation options a request
leaves out (`DEFAULTS`: greedy, all tokens, no stop token, 32 new tokens;
4 beams and a length penalty of 1 for `beam_search`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras

# What `kerasformer serve` uses for an option a request leaves out: greedy
# decoding of 32 tokens (as `generate`), no top-k / top-p filter, no stop token.
# `beam_search`: 4 beams, as transformers' translation configs, ranked by log-probability / length.
DEFAULTS = {"max_new_tokens": 32, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "stop_token_ids": [],
            "num_beams": 4, "length_penalty": 1.0}


def export(model, path, tokenizer=None):
    """Writes `model` (and its tokenizer) as a TensorFlow SavedModel at `path`.

    A kerasformer model (GPT, BERT and its task models, T5, Transformer) gets
    the signatures above. Any other `keras.Model`, one assembled from
    kerasformer's layers say, gets Keras's own SavedModel (`serve`,
    `serving_default`), written under TensorFlow too: Keras's export fails on
    torch. Its custom layers must then be importable from a module, as the
    TensorFlow process rebuilds the model from its `.keras` file.
    """
    ours = _is_kerasformer_model(model)
    if not ours:
        if not isinstance(model, keras.Model):
            raise ValueError(f"`model` must be a keras.Model, got a {type(model).__name__}.")
        if tokenizer is not None:
            raise ValueError("`tokenizer` needs a kerasformer model (GPT, BERT, T5, Transformer), whose text signatures "
                             f"it feeds; got a {type(model).__name__}.")
    path = os.path.abspath(path)
    _check_replaceable(path)
    modules = [] if ours or keras.backend.backend() == "tensorflow" else _modules_to_import(model)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".export-") as staging:
        output = os.path.join(staging, "saved_model")
        if not ours and keras.backend.backend() == "tensorflow":
            model.export(output, format="tf_saved_model", verbose=False)
            _move_into_place(output, path)
            return path
        keras_path = os.path.join(staging, "model.keras")
        model.save(keras_path)
        tokenizer_dir = None
        if tokenizer is not None:
            from kerasformer.data import save_tokenizer

            tokenizer_dir = os.path.join(staging, "tokenizer")
            save_tokenizer(tokenizer, tokenizer_dir)
        if keras.backend.backend() == "tensorflow":
            _export_with_tensorflow(keras_path, tokenizer_dir, output)
        else:
            env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
            command = [sys.executable, "-m", "kerasformer.export", keras_path, output]
            if tokenizer_dir:
                command += ["--tokenizer", tokenizer_dir]
            if modules:  # The user's layers: importable from where this process imported them.
                command += [arg for module in modules for arg in ("--import", module)]
                env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
            result = subprocess.run(command, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"Export under the TensorFlow backend failed:\n{result.stderr[-4000:]}")
        _move_into_place(output, path)
    return path


def _is_kerasformer_model(model):
    from kerasformer.models import BERT, GPT, BERTClassifier, BERTMaskedLM
    from kerasformer.models.seq2seq import EncoderDecoderModel

    return isinstance(model, (GPT, BERT, BERTMaskedLM, BERTClassifier, EncoderDecoderModel))


def _modules_to_import(model):
    """The modules of `model`'s own classes, which Keras does not import when it loads a `.keras` file."""
    objects = [model, *model._flatten_layers(include_self=False, recursive=True)]
    modules = sorted({type(o).__module__ for o in objects} - {"builtins"})
    modules = [m for m in modules if m.split(".")[0] not in ("keras", "kerasformer", "keras_hub")]
    if "__main__" in modules:
        names = sorted({type(o).__name__ for o in objects if type(o).__module__ == "__main__"})
        raise ValueError(f"Cannot export from the {keras.backend.backend()} backend a model with classes defined in the "
                         f"script itself ({', '.join(names)}): the model is rebuilt under TensorFlow in another process, "
                         "which cannot import them. Define them in a module, or export under the TensorFlow backend.")
    return modules


def export_run(run_dir, path):
    """Exports a training run folder (its model and tokenizer)."""
    from kerasformer.train import load_run

    model, tokenizer, _ = load_run(run_dir)
    return export(model, path, tokenizer)


def _check_replaceable(path):
    """Refuses a target that is neither new, an empty folder, nor a SavedModel (which an export replaces).

    The export replaces its target whole: a file or a folder of other things
    (`kerasformer export run ~/models`) would be deleted.
    """
    if not os.path.exists(path) or (os.path.isdir(path) and (not os.listdir(path) or os.path.isfile(os.path.join(path, "saved_model.pb")))):
        return
    kind = "a folder that is not a SavedModel" if os.path.isdir(path) else "a file"
    raise ValueError(f"`path` {path!r} is {kind}; export to a new folder, or to a SavedModel's folder to replace it.")


def _move_into_place(source, target):
    """Replaces `target` by `source` with renames only (no partial copies)."""
    old = None
    if os.path.exists(target):
        old = f"{target}.old-{os.getpid()}"
        os.rename(target, old)
    os.rename(source, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# Under the TensorFlow backend ----------------------------------------------


def _export_with_tensorflow(keras_path, tokenizer_dir, output):
    import tensorflow as tf

    import kerasformer.models  # noqa: F401 - registers the classes for loading.
    from kerasformer import data
    from kerasformer.models.seq2seq import EncoderDecoderModel

    model = keras.saving.load_model(keras_path)
    if not _is_kerasformer_model(model):
        model.export(output, format="tf_saved_model", verbose=False)
        return
    tokenizer = None
    if tokenizer_dir:
        tokenizer = data.load_tokenizer(tokenizer_dir)
    module = tf.Module()
    module.variables_ = [v.value for v in model.variables]  # Tracked for saving.
    if tokenizer is not None:
        module.tokenizer = tokenizer
    signatures = build_signatures(model, tokenizer)
    for name, function in signatures.items():
        setattr(module, name, function)
    module.serve = keras_serve_endpoint(model, signatures)
    tf.saved_model.save(module, output, signatures=signatures)
    defaults = dict(DEFAULTS)
    if isinstance(model, EncoderDecoderModel):
        # A run of `kerasformer train` starts decoding at its start token; a bare model at the pad id, as `generate`.
        defaults["start_token_id"] = data.SPECIAL_TOKENS.index(data.START) if tokenizer is not None else model.pad_token_id
    info = {"model": type(model).__name__, "config": model.get_config(), "signatures": sorted(signatures), "defaults": defaults}
    with open(os.path.join(output, "kerasformer.json"), "w") as f:
        json.dump(info, f, indent=2, default=str)


def build_signatures(model, tokenizer=None):
    """`{name: tf.function}` of the signatures of `model`.

    They are traced without AutoGraph: the loops are `tf.while_loop`s and the
    layers backend-neutral ops, so its source rewrite of every function
    called bought nothing (a GPT's export took 12.2 s with it, 9.5 s without).
    """
    import tensorflow as tf

    from kerasformer.models import BERT, GPT, BERTClassifier, BERTMaskedLM
    from kerasformer.models.seq2seq import EncoderDecoderModel

    ids = lambda name: tf.TensorSpec([None, None], tf.int32, name=name)  # noqa: E731
    scalar = lambda dtype, name: tf.TensorSpec([], dtype, name=name)  # noqa: E731
    sampling_spec = _option_specs(stop_token_ids=True)
    beam_spec = _beam_option_specs(stop_token_ids=True)
    signatures = {}

    if isinstance(model, GPT):

        @tf.function(autograph=False, input_signature=[ids("token_ids"), ids("padding_mask")])
        def serving_default(token_ids, padding_mask):
            token_ids, padding_mask = _after(_fits_positions(model, tf.shape(token_ids)[1], "`token_ids`"), token_ids, padding_mask)
            logits, _, _ = model.compute_logits(token_ids, padding_mask=tf.cast(padding_mask, tf.bool))
            return {"logits": _float32(logits)}

        @tf.function(autograph=False, input_signature=[ids("token_ids"), ids("padding_mask"), *sampling_spec])
        def generate(token_ids, padding_mask, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids):
            options = _checked_options(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids)
            return {"generated_ids": _generate_in_graph(model, token_ids, padding_mask, *options)}

        @tf.function(autograph=False, input_signature=[ids("token_ids"), ids("padding_mask"), *beam_spec])
        def beam_search(token_ids, padding_mask, max_new_tokens, num_beams, length_penalty, stop_token_ids):
            options = _checked_beam_options(max_new_tokens, num_beams, length_penalty)
            return {"generated_ids": _beam_search_in_graph(model, token_ids, padding_mask, *options, stop_token_ids)}

        signatures.update(serving_default=serving_default, generate=generate, beam_search=beam_search)

    elif isinstance(model, EncoderDecoderModel):
        pad = model.pad_token_id

        @tf.function(autograph=False, input_signature=[ids("encoder_token_ids"), ids("encoder_padding_mask"), ids("decoder_token_ids")])
        def serving_default(encoder_token_ids, encoder_padding_mask, decoder_token_ids):
            checks = _fits_positions(model, tf.shape(encoder_token_ids)[1], "`encoder_token_ids`")
            checks += _fits_positions(model, tf.shape(decoder_token_ids)[1], "`decoder_token_ids`")
            encoder_token_ids, encoder_padding_mask, decoder_token_ids = _after(
                checks, encoder_token_ids, encoder_padding_mask, decoder_token_ids)
            encoder_token_ids = tf.where(encoder_padding_mask > 0, encoder_token_ids, pad)
            logits = model({"encoder_token_ids": encoder_token_ids, "decoder_token_ids": decoder_token_ids})
            return {"logits": _float32(logits)}

        def source(encoder_token_ids, encoder_padding_mask, max_new_tokens):  # Checked, its padding the pad id.
            # As `generate`: the decoder reads its start token and every new token but the last.
            checks = _fits_positions(model, tf.shape(encoder_token_ids)[1], "`encoder_token_ids`")
            checks += _fits_positions(model, max_new_tokens, "`max_new_tokens`")
            encoder_token_ids, encoder_padding_mask = _after(checks, encoder_token_ids, encoder_padding_mask)
            return tf.where(encoder_padding_mask > 0, encoder_token_ids, pad)

        @tf.function(autograph=False, input_signature=[ids("encoder_token_ids"), ids("encoder_padding_mask"), *sampling_spec,
                                      scalar(tf.int32, "start_token_id")])
        def generate(encoder_token_ids, encoder_padding_mask, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                     start_token_id):
            encoder_token_ids = source(encoder_token_ids, encoder_padding_mask, max_new_tokens)
            options = _checked_options(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids)
            return {"generated_ids": _seq2seq_generate_in_graph(model, encoder_token_ids, *options, start_token_id)}

        @tf.function(autograph=False, input_signature=[ids("encoder_token_ids"), ids("encoder_padding_mask"), *beam_spec,
                                      scalar(tf.int32, "start_token_id")])
        def beam_search(encoder_token_ids, encoder_padding_mask, max_new_tokens, num_beams, length_penalty, stop_token_ids,
                        start_token_id):
            encoder_token_ids = source(encoder_token_ids, encoder_padding_mask, max_new_tokens)
            options = _checked_beam_options(max_new_tokens, num_beams, length_penalty)
            return {"generated_ids": _seq2seq_beam_search_in_graph(model, encoder_token_ids, *options, stop_token_ids, start_token_id)}

        signatures.update(serving_default=serving_default, generate=generate, beam_search=beam_search)

    elif isinstance(model, (BERT, BERTMaskedLM, BERTClassifier)):
        backbone = getattr(model, "backbone", model)
        pad = backbone.pad_token_id

        def inputs(token_ids, padding_mask, segment_ids):
            checks = _fits_positions(backbone, tf.shape(token_ids)[1], "`token_ids`")
            if backbone.segment_embedding is not None:  # A gather past the table fails opaquely, or not at all.
                segments = backbone.segment_embedding.input_dim
                message = f"`segment_ids` must lie in [0, {segments}) (num_segments={segments})."
                checks += [tf.debugging.assert_greater_equal(segment_ids, 0, message=message),
                           tf.debugging.assert_less(segment_ids, segments, message=message)]
            token_ids, padding_mask, segment_ids = _after(checks, token_ids, padding_mask, segment_ids)
            return {"token_ids": tf.where(padding_mask > 0, token_ids, pad), "segment_ids": segment_ids}

        bert_spec = [ids("token_ids"), ids("padding_mask"), ids("segment_ids")]

        @tf.function(autograph=False, input_signature=bert_spec)
        def embed(token_ids, padding_mask, segment_ids):
            outputs = backbone(inputs(token_ids, padding_mask, segment_ids))
            return {"sequence_output": _float32(outputs["sequence_output"]), "pooled_output": _float32(outputs["pooled_output"])}

        signatures["embed"] = embed
        if isinstance(model, BERT):
            signatures["serving_default"] = embed
        else:

            @tf.function(autograph=False, input_signature=bert_spec)
            def serving_default(token_ids, padding_mask, segment_ids):
                return {"logits": _float32(model(inputs(token_ids, padding_mask, segment_ids)))}

            signatures["serving_default"] = serving_default
        if isinstance(model, BERTMaskedLM):

            @tf.function(autograph=False, input_signature=bert_spec)
            def fill_mask(token_ids, padding_mask, segment_ids):
                probabilities = tf.nn.softmax(_float32(model(inputs(token_ids, padding_mask, segment_ids))), axis=-1)
                return {
                    "predicted_ids": tf.argmax(probabilities, axis=-1, output_type=tf.int32),
                    "probabilities": tf.reduce_max(probabilities, axis=-1),
                }

            signatures["fill_mask"] = fill_mask
        if isinstance(model, BERTClassifier):

            @tf.function(autograph=False, input_signature=bert_spec)
            def classify(token_ids, padding_mask, segment_ids):
                probabilities = tf.nn.softmax(_float32(model(inputs(token_ids, padding_mask, segment_ids))), axis=-1)
                return {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1, output_type=tf.int32)}

            signatures["classify"] = classify
    else:
        raise ValueError(f"Cannot export a {type(model).__name__}; expected a kerasformer model.")

    if tokenizer is not None:
        signatures.update(_text_signatures(model, tokenizer, signatures))
    return signatures


def keras_serve_endpoint(model, signatures):
    """`serve`, the endpoint that Keras's `model.export` writes: the model's inputs as it takes them (token ids,
    or a dict of them) -> its outputs, as float32; computed by `serving_default`, with its checks."""
    import tensorflow as tf

    from kerasformer.models import GPT, BERT
    from kerasformer.models.seq2seq import EncoderDecoderModel

    serving_default = signatures["serving_default"]
    ids = lambda name: tf.TensorSpec([None, None], tf.int32, name=name)  # noqa: E731
    if isinstance(model, GPT):

        @tf.function(autograph=False, input_signature=[ids("token_ids")])
        def serve(token_ids):  # (B, T) -> (B, T, V)
            return serving_default(token_ids=token_ids, padding_mask=tf.ones_like(token_ids))["logits"]

        return serve

    names = ["encoder_token_ids", "decoder_token_ids"] if isinstance(model, EncoderDecoderModel) else ["token_ids", "segment_ids"]

    @tf.function(autograph=False, input_signature=[{name: ids(name) for name in names}])
    def serve(inputs):
        if isinstance(model, EncoderDecoderModel):  # The model masks pad ids of the source itself.
            source = inputs["encoder_token_ids"]
            return serving_default(encoder_token_ids=source, encoder_padding_mask=tf.ones_like(source),
                                   decoder_token_ids=inputs["decoder_token_ids"])["logits"]
        token_ids = inputs["token_ids"]
        outputs = serving_default(token_ids=token_ids, padding_mask=tf.ones_like(token_ids), segment_ids=inputs["segment_ids"])
        return outputs if isinstance(model, BERT) else outputs["logits"]  # A backbone's dict; a task model's logits.

    return serve


def _option_specs(stop_token_ids):
    """The specs of `generate`'s options, in the order they follow the prompt; `DEFAULTS` has their defaults."""
    import tensorflow as tf

    specs = [tf.TensorSpec([], dtype, name) for name, dtype in
             [("max_new_tokens", tf.int32), ("temperature", tf.float32), ("top_k", tf.int32), ("top_p", tf.float32), ("seed", tf.int32)]]
    return specs + [tf.TensorSpec([None], tf.int32, "stop_token_ids")] if stop_token_ids else specs


def _beam_option_specs(stop_token_ids):
    """The specs of `beam_search`'s options, in the order they follow the prompt; `DEFAULTS` has their defaults."""
    import tensorflow as tf

    specs = [tf.TensorSpec([], dtype, name) for name, dtype in
             [("max_new_tokens", tf.int32), ("num_beams", tf.int32), ("length_penalty", tf.float32)]]
    return specs + [tf.TensorSpec([None], tf.int32, "stop_token_ids")] if stop_token_ids else specs


def _fits_positions(model, length, what):
    """In-graph checks that `length` tokens fit `model`'s learned position table, if it has one.

    A SavedModel takes any length; without the check a longer request fails
    deep in a gather with "indices[128] = 128 is not in [0, 128)".
    """
    import tensorflow as tf

    from kerasformer.generate import learned_positions_message

    message = learned_positions_message(model, what)
    if message is None:
        return []
    return [tf.debugging.assert_less_equal(length, model.max_sequence_length, message=message)]


def _float32(x):
    """A model's float output as float32: what a served signature returns whatever the model computes in
    (a `mixed_bfloat16` model's are bfloat16, which JSON clients and softmax handle worse)."""
    import tensorflow as tf

    return tf.cast(x, tf.float32)


def _after(checks, *tensors):
    """`tensors`, computed only once `checks` (assertions) have passed."""
    import tensorflow as tf

    with tf.control_dependencies(checks):
        return tuple(tf.identity(t) for t in tensors)


def _noise(batch, length, seed, part=0):
    """Uniform draws `(batch, length)` of a request's `seed`; `part` numbers a GPT's windows, each its own draws."""
    import tensorflow as tf

    return tf.random.stateless_uniform(tf.stack([batch, length]), seed=tf.stack([seed, part]), dtype=tf.float32)


def _checked_options(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids):
    """The generation options, once in-graph checks of their ranges have passed (the messages of `generate`'s)."""
    import tensorflow as tf

    checks = [
        tf.debugging.assert_greater_equal(max_new_tokens, 1, message="`max_new_tokens` must be at least 1."),
        # NaN fails the first check, infinity the second.
        tf.debugging.assert_greater_equal(temperature, 0.0, message="`temperature` must be a finite number >= 0."),
        tf.debugging.assert_less(temperature, float("inf"), message="`temperature` must be a finite number >= 0."),
        tf.debugging.assert_greater_equal(top_k, 0, message="`top_k` must be >= 0 (0: all tokens)."),
        tf.debugging.assert_greater(top_p, 0.0, message="`top_p` must be above 0 and at most 1 (1: all tokens)."),
        tf.debugging.assert_less_equal(top_p, 1.0, message="`top_p` must be above 0 and at most 1 (1: all tokens)."),
    ]
    # The loop compares each new token with every entry: -1, which none equals, lets the list be empty.
    stop_token_ids = tf.concat([stop_token_ids, [-1]], axis=0)
    return _after(checks, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids)


def _checked_beam_options(max_new_tokens, num_beams, length_penalty):
    """Beam search's options, once in-graph checks of their ranges have passed (the messages of `generate`'s)."""
    import tensorflow as tf

    checks = [
        tf.debugging.assert_greater_equal(max_new_tokens, 1, message="`max_new_tokens` must be at least 1."),
        tf.debugging.assert_greater_equal(num_beams, 1, message="`num_beams` must be at least 1."),
        tf.debugging.assert_less(tf.abs(length_penalty), float("inf"), message="`length_penalty` must be a finite number."),
    ]
    return _after(checks, max_new_tokens, num_beams, length_penalty)


def _sampling(temperature, top_k, top_p):
    """Graph-side sampling options: greedy at temperature 0 (decided per call, in the graph)."""
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "greedy": None}


def _prompts(token_ids, padding_mask):
    """GPT prompts `(B, P)` aligned left, their lengths `(B,)`, and the check that each has a token.

    Each row's prompt is its tokens under the mask, so left-padded rows (as
    Hugging Face pads for generation) read as right-padded ones.
    """
    import tensorflow as tf

    prompt = tf.ragged.boolean_mask(token_ids, padding_mask > 0)  # (B, None)
    token_ids, lengths = prompt.to_tensor(default_value=0), tf.cast(prompt.row_lengths(), tf.int32)  # (B, P), (B,)
    message = "Each prompt needs at least one token; a row of `padding_mask` has none."
    return token_ids, lengths, [tf.debugging.assert_greater_equal(lengths, 1, message=message)]


def _generate_in_graph(model, token_ids, padding_mask, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids):
    """GPT generation in the graph, in the windows of `Generator._slide` past the context.

    Everything fits one window of `prompt + max_new_tokens` positions when
    that is within the context (`max_sequence_length`); past it, windows of
    the context's length: a row's first holds its prompt's last `context - 1`
    tokens, each later one the text's last `context // 2`. Every window is
    the same cached loop (traced once), so the greedy tokens are those of
    `generate`. `text` holds each row's prompt, then its `produced` new tokens.
    """
    import tensorflow as tf

    from kerasformer.generate import NO_ROOM, Generator, _loop_body

    generator = Generator(model)
    window, keep = model.max_sequence_length, model.max_sequence_length // 2
    token_ids, lengths, checks = _prompts(token_ids, padding_mask)
    if window < 2:  # As `generate`: no prompt + new token fits, and a window could not move on.
        checks.append(tf.debugging.assert_less_equal(tf.shape(token_ids)[1] + max_new_tokens, window, message=NO_ROOM.format(window)))
    token_ids, lengths, max_new_tokens = _after(checks, token_ids, lengths, max_new_tokens)
    batch, prompt_length = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
    total = prompt_length + max_new_tokens
    width = tf.minimum(window, total)  # One window's positions
    text = tf.pad(token_ids, [[0, 0], [0, max_new_tokens]])  # (B, P + N)
    positions = tf.range(width)[None, :]  # (1, W)
    body = _loop_body(generator._step(), _sampling(temperature, top_k, top_p), 0)

    def unfinished(part, text, produced, done):
        return tf.reduce_any(tf.logical_and(tf.logical_not(done), produced < max_new_tokens))

    def next_window(part, text, produced, done):
        text_lengths = lengths + produced  # (B,)
        active = tf.logical_and(tf.logical_not(done), produced < max_new_tokens)  # (B,)
        context = tf.minimum(text_lengths, tf.where(produced == 0, window - 1, keep))  # (B,) tokens the window starts from
        counts = tf.where(active, tf.minimum(max_new_tokens - produced, width - context), 0)  # (B,) tokens it adds
        in_context = positions < context[:, None]  # (B, W)
        starts = (text_lengths - context)[:, None]  # (B, 1)
        ids = tf.where(in_context, tf.gather(text, tf.minimum(starts + positions, total - 1), batch_dims=1), 0)  # (B, W)
        limits = context + counts
        start = tf.reduce_min(context)
        result = generator._loop(
            body, tf.zeros([batch, 1], tf.int32), ids, in_context, limits, _noise(batch, width, seed, part),
            start, stop_token_ids, ids[:, :start],  # Prefills the positions every row's context holds.
        )  # (B, W)
        # The window's new tokens (positions context .. limits - 1) follow the text.
        offsets = tf.range(total)[None, :] - text_lengths[:, None]  # (B, P + N)
        fresh = tf.logical_and(offsets >= 0, offsets < counts[:, None])
        text = tf.where(fresh, tf.gather(result, tf.clip_by_value(offsets + context[:, None], 0, width - 1), batch_dims=1), text)
        new = tf.logical_and(positions >= context[:, None], positions < limits[:, None])  # (B, W)
        stopped = tf.reduce_any(tf.logical_and(new, tf.reduce_any(result[:, :, None] == stop_token_ids, axis=-1)), axis=1)
        return part + 1, text, produced + counts, tf.logical_or(done, stopped)

    state = (tf.constant(0), text, tf.zeros_like(lengths), tf.zeros([batch], tf.bool))
    text = tf.while_loop(unfinished, next_window, state)[1]
    # The new tokens of each row, after its own prompt.
    return tf.gather(text, lengths[:, None] + tf.range(max_new_tokens)[None, :], batch_dims=1)


def _seq2seq_generate_in_graph(model, encoder_token_ids, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                               start_token_id):
    from kerasformer.generate import Generator, _loop_body

    generator = Generator(model)
    body = _loop_body(generator._step(), _sampling(temperature, top_k, top_p), model.pad_token_id)
    return _seq2seq_loop_in_graph(generator, body, encoder_token_ids, max_new_tokens, stop_token_ids, start_token_id, seed)


def _seq2seq_loop_in_graph(generator, body, encoder_token_ids, max_new_tokens, stop_token_ids, start_token_id, seed=0,
                           length_penalty=1.0, num_beams=1):
    """The new tokens `(B, N)` of `body`'s loop from each row's start token, a row past its stop token padded."""
    import tensorflow as tf

    batch = tf.shape(encoder_token_ids)[0]
    total = 1 + max_new_tokens
    # Positions after a stop token keep the pad id, as in `generate` (the loop may end before it writes them).
    buffer = tf.concat([tf.fill([batch, 1], start_token_id), tf.fill([batch, max_new_tokens], generator.model.pad_token_id)], 1)
    prompt_mask = tf.broadcast_to(tf.range(total)[None, :] < 1, [batch, total])
    limits = tf.fill([batch], total)
    result = generator._loop(
        body, encoder_token_ids, buffer, prompt_mask, limits, _noise(batch, total, seed), tf.constant(1), stop_token_ids,
        length_penalty=length_penalty, num_beams=num_beams,
    )
    return result[:, 1:]


def _beams_or_greedy(generator, num_beams, run):
    """`run(body, num_beams)` with `transformers`' beam search for K > 1 beams, greedy for one (as `generate`)."""
    import tensorflow as tf

    from kerasformer.generate import _beam_body, _loop_body

    pad = generator._pad_token_id()
    greedy = {"greedy": True, "temperature": 0.0, "top_k": None, "top_p": None}
    return tf.cond(
        num_beams > 1,
        lambda: run(_beam_body(generator._step(), num_beams, pad), num_beams),
        lambda: run(_loop_body(generator._step(), greedy, pad), 1),
    )


def _seq2seq_beam_search_in_graph(model, encoder_token_ids, max_new_tokens, num_beams, length_penalty, stop_token_ids,
                                  start_token_id):
    from kerasformer.generate import Generator

    generator = Generator(model)
    return _beams_or_greedy(generator, num_beams, lambda body, beams: _seq2seq_loop_in_graph(
        generator, body, encoder_token_ids, max_new_tokens, stop_token_ids, start_token_id,
        length_penalty=length_penalty, num_beams=beams))


def _beam_search_in_graph(model, token_ids, padding_mask, max_new_tokens, num_beams, length_penalty, stop_token_ids):
    """A GPT's beam search in the graph: prompt and new tokens within the context, as `generate` requires."""
    import tensorflow as tf

    from kerasformer.generate import Generator

    generator = Generator(model)
    context = model.max_sequence_length
    token_ids, lengths, checks = _prompts(token_ids, padding_mask)
    checks.append(tf.debugging.assert_less_equal(
        tf.shape(token_ids)[1] + max_new_tokens, context,
        message=f"Beam search must fit the context: the longest prompt + `max_new_tokens` must be at most "
                f"max_sequence_length={context}."))
    token_ids, lengths, max_new_tokens = _after(checks, token_ids, lengths, max_new_tokens)
    batch = tf.shape(token_ids)[0]
    buffer = tf.pad(token_ids, [[0, 0], [0, max_new_tokens]])  # (B, P + N)
    total = tf.shape(buffer)[1]
    prompt_mask = tf.range(total)[None, :] < lengths[:, None]  # (B, P + N)
    start = tf.reduce_min(lengths)

    def run(body, beams):
        return generator._loop(
            body, tf.zeros([batch, 1], tf.int32), buffer, prompt_mask, lengths + max_new_tokens, tf.zeros([batch, total]),
            start, stop_token_ids, buffer[:, :start], length_penalty, beams,
        )  # (B, P + N)

    result = _beams_or_greedy(generator, num_beams, run)
    return tf.gather(result, lengths[:, None] + tf.range(max_new_tokens)[None, :], batch_dims=1)  # (B, N) after each prompt


def _text_signatures(model, tokenizer, signatures):
    """String-in / string-out signatures with the KerasHub tokenizer in the graph."""
    import tensorflow as tf

    from kerasformer import data
    from kerasformer.generate import learned_position_limit
    from kerasformer.models import GPT, BERTClassifier, BERTMaskedLM
    from kerasformer.models.seq2seq import EncoderDecoderModel

    text = tf.TensorSpec([None], tf.string, name="text")
    text_sampling_spec = _option_specs(stop_token_ids=False)  # A seq2seq text ends at the model's end token.
    text_beam_spec = _beam_option_specs(stop_token_ids=False)

    limit = data.codepoint_limit(tokenizer)

    def tokens(strings):  # (B, None) ragged ids; as `data.encode`, a char tokenizer's unknown characters are refused.
        ids = tokenizer(strings)
        if limit is None:
            return ids
        points = tf.strings.unicode_decode(strings, "UTF-8").flat_values  # Invalid UTF-8 reads as U+FFFD.
        check = tf.debugging.assert_less(
            points, tf.constant(limit, points.dtype),
            message=f"Each `text` must use only characters in the vocabulary of the char tokenizer (code points below {limit}).",
        )
        return ids.with_flat_values(_after([check], ids.flat_values)[0])

    def tokenize(strings):
        return padded(nonempty(tokens(strings)))

    def nonempty(ragged):  # Every text has a token: an empty prompt or source has nothing to condition on.
        check = tf.debugging.assert_greater_equal(ragged.row_lengths(), tf.constant(1, tf.int64), message="Each `text` needs at least one token.")
        return ragged.with_flat_values(_after([check], ragged.flat_values)[0])

    def padded(ragged):  # (B, None) ragged ids -> (B, T) ids and padding mask
        token_ids = tf.cast(ragged.to_tensor(default_value=0), tf.int32)
        mask = tf.cast(tf.sequence_mask(ragged.row_lengths(), tf.shape(token_ids)[1]), tf.int32)
        return token_ids, mask

    def before_first(ids, token):  # Each row of (B, T) ids cut at its first `token`, ragged.
        return tf.ragged.boolean_mask(ids, tf.cumsum(tf.cast(tf.equal(ids, token), tf.int32), axis=1) == 0)

    out = {}
    if isinstance(model, GPT):

        no_stop = tf.zeros([0], tf.int32)

        def continued(text, new_ids):  # `new_ids(token_ids, padding_mask)` -> (B, N) new ids; -> each text continued
            prompt = nonempty(tokens(text))  # (B, None) ragged
            new = new_ids(*padded(prompt))
            # As `data.continuation`: decoded with the prompt's ids, so that
            # word and subword tokenizers place the joining space.
            new = before_first(new, 0)  # Text ends at a pad id, as `data.decode`.
            whole = tokenizer.detokenize(tf.concat([tf.cast(prompt, new.dtype), new], axis=1))
            start = tf.strings.length(tokenizer.detokenize(prompt))
            return {"text": tf.strings.join([text, tf.strings.substr(whole, start, tf.strings.length(whole) - start)])}

        @tf.function(autograph=False, input_signature=[text, *text_sampling_spec])
        def generate_text(text, max_new_tokens, temperature, top_k, top_p, seed):
            return continued(text, lambda token_ids, mask: signatures["generate"](
                token_ids, mask, max_new_tokens, temperature, top_k, top_p, seed, no_stop)["generated_ids"])

        @tf.function(autograph=False, input_signature=[text, *text_beam_spec])
        def beam_search_text(text, max_new_tokens, num_beams, length_penalty):
            return continued(text, lambda token_ids, mask: signatures["beam_search"](
                token_ids, mask, max_new_tokens, num_beams, length_penalty, no_stop)["generated_ids"])

        out.update(generate_text=generate_text, beam_search_text=beam_search_text)
    elif isinstance(model, EncoderDecoderModel):
        start, end = data.SPECIAL_TOKENS.index(data.START), data.SPECIAL_TOKENS.index(data.END)

        def transformed(text, max_new_tokens, new_ids):  # `new_ids(token_ids, padding_mask, max_new_tokens)` -> (B, N)
            token_ids, mask = tokenize(text)
            token_ids, mask = _after(_fits_positions(model, tf.shape(token_ids)[1], "Each `text`"), token_ids, mask)
            limit = learned_position_limit(model)
            if limit is not None:  # As `kerasformer generate`: the text ends by the table's end.
                max_new_tokens = tf.minimum(max_new_tokens, limit)
            # The loop ends once every row has its end token.
            new = new_ids(token_ids, mask, max_new_tokens)
            # As `data.decode_target`: up to the first end or pad id, without control tokens.
            control = tf.constant([data.SPECIAL_TOKENS.index(t) for t in data.CONTROL_TOKENS], new.dtype)
            ended = tf.cumsum(tf.cast(tf.equal(new, end) | tf.equal(new, 0), tf.int32), axis=1) > 0  # (B, T)
            is_control = tf.reduce_any(tf.equal(new[:, :, None], control), axis=-1)  # (B, T)
            return {"text": tokenizer.detokenize(tf.ragged.boolean_mask(new, ~ended & ~is_control))}

        @tf.function(autograph=False, input_signature=[text, *text_sampling_spec])
        def generate_text(text, max_new_tokens, temperature, top_k, top_p, seed):
            return transformed(text, max_new_tokens, lambda token_ids, mask, max_new_tokens: signatures["generate"](
                token_ids, mask, max_new_tokens, temperature, top_k, top_p, seed, [end], start)["generated_ids"])

        @tf.function(autograph=False, input_signature=[text, *text_beam_spec])
        def beam_search_text(text, max_new_tokens, num_beams, length_penalty):
            return transformed(text, max_new_tokens, lambda token_ids, mask, max_new_tokens: signatures["beam_search"](
                token_ids, mask, max_new_tokens, num_beams, length_penalty, [end], start)["generated_ids"])

        out.update(generate_text=generate_text, beam_search_text=beam_search_text)
    elif isinstance(model, (BERTMaskedLM, BERTClassifier)):
        cls, sep, mask_id = (data.SPECIAL_TOKENS.index(t) for t in (data.CLS, data.SEP, data.MASK))

        def bert_rows(text):  # "[CLS] text [SEP]", each "[MASK]" in the text the mask id, as `kerasformer train bert` writes rows.
            pieces = tf.strings.split(text, sep=data.MASK)  # (B, pieces) ragged
            piece_ids = tf.cast(tokens(pieces.flat_values), tf.int32).with_row_splits_dtype(tf.int64)  # (N, None) ragged
            row_ends = tf.gather(pieces.row_limits(), pieces.value_rowids())  # (N,) where each piece's text ends
            followed = tf.cast(tf.range(tf.size(pieces.flat_values, out_type=tf.int64)) < row_ends - 1, tf.int32)  # (N,)
            masks = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(followed)], mask_id), tf.cast(followed, tf.int64))
            # A mask id after every piece but each text's last.
            ids = tf.RaggedTensor.from_row_lengths(tf.concat([piece_ids, masks], axis=1), pieces.row_lengths()).merge_dims(1, 2)
            ids = nonempty(ids)
            batch = tf.shape(text)[:1]
            return tf.concat([tf.fill(tf.concat([batch, [1]], 0), cls), ids, tf.fill(tf.concat([batch, [1]], 0), sep)], axis=1)

        if isinstance(model, BERTMaskedLM):

            @tf.function(autograph=False, input_signature=[text])
            def fill_mask_text(text):
                rows = bert_rows(text)  # (B, None) ragged
                token_ids, mask = padded(rows)
                predicted = signatures["fill_mask"](token_ids, mask, tf.zeros_like(token_ids))["predicted_ids"]  # (B, T)
                filled = tf.where(tf.equal(token_ids, mask_id), predicted, token_ids)  # (B, T)
                filled = tf.RaggedTensor.from_tensor(filled, lengths=rows.row_lengths())[:, 1:-1]  # Without [CLS], [SEP].
                return {"text": tokenizer.detokenize(filled)}

            out["fill_mask_text"] = fill_mask_text
        else:

            @tf.function(autograph=False, input_signature=[text])
            def classify_text(text):
                token_ids, mask = padded(bert_rows(text))
                return signatures["classify"](token_ids, mask, tf.zeros_like(token_ids))

            out["classify_text"] = classify_text
    return out


if __name__ == "__main__":  # The subprocess of `export`: python -m kerasformer.export MODEL OUT [--tokenizer DIR] [--import MODULE]...
    import argparse
    import importlib

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output")
    parser.add_argument("--tokenizer")
    parser.add_argument("--import", dest="modules", action="append", default=[])
    arguments = parser.parse_args()
    for module in arguments.modules:  # Registers the user's classes for loading.
        importlib.import_module(module)
    _export_with_tensorflow(arguments.model, arguments.tokenizer, arguments.output)

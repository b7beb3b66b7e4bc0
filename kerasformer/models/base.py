"""What every model builder shares: its constructor arguments are its config."""

import contextlib
import inspect
import numbers

import keras
import numpy as np

from kerasformer.checks import check_batch_sizes, check_positive_int


def position_layer(position_type, max_sequence_length, initializer="glorot_uniform"):
    """The layer adding positions to embeddings: learned, sinusoidal, or None
    (rotary positions live inside attention)."""
    from kerasformer.layers import PositionEmbedding, SinusoidalPositionEncoding

    if position_type == "learned":
        return PositionEmbedding(max_sequence_length, initializer=initializer, name="position_embedding")
    if position_type == "sinusoidal":
        return SinusoidalPositionEncoding(name="position_encoding")
    return None


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"Unknown `{name}` {value!r}; expected one of {choices}.")


def argument_names(cls):
    """The named arguments of `cls.__init__`, in order."""
    return [
        name
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    ]


# Arguments that count something: each a positive int, or None for its default.
SIZE_ARGUMENTS = (
    "vocab_size", "target_vocab_size", "num_layers", "num_decoder_layers", "num_heads", "num_key_value_heads",
    "hidden_dim", "intermediate_dim", "head_dim", "max_sequence_length", "num_segments", "num_classes",
    "relative_attention_num_buckets", "relative_attention_max_distance",
)


def constructor_arguments(frame_locals, cls):
    """The named arguments of `cls.__init__` as they were passed, their sizes checked.

    Keras would take a size of 0 or -1 (a model with no blocks, an empty
    vocabulary) or fail far from the argument (a shape error for "16").
    """
    arguments = {name: frame_locals[name] for name in argument_names(cls)}
    for name in SIZE_ARGUMENTS:
        if arguments.get(name) is not None:
            check_positive_int(name, arguments[name], owner=f"{cls.__name__}'s ")
    pad_token_id, vocab_size = arguments.get("pad_token_id"), arguments.get("vocab_size")
    if pad_token_id is not None and not (isinstance(pad_token_id, numbers.Integral) and 0 <= pad_token_id < vocab_size):
        raise ValueError(f"{cls.__name__}'s `pad_token_id` must be a token id in [0, {vocab_size}), got {pad_token_id!r}.")
    return arguments


# What a builder's `**kwargs` pass on to `keras.Model` (its config round-trips them).
MODEL_KEYWORDS = ("name", "trainable")


def unknown_arguments_message(cls, names):
    """The error for the arguments among `names` that builder `cls` does not take; None if it takes them all."""
    known = argument_names(cls) + list(MODEL_KEYWORDS)
    unknown = [name for name in names if name not in known]
    if not unknown:
        return None
    return f"{cls.__name__} has no argument {', '.join(map(repr, unknown))}; its arguments are {', '.join(known)}."


class TransformerModel(keras.Model):
    """A functional `keras.Model` whose config is its constructor arguments.

    Subclasses build their layers and graph in `__init__`, call
    `super().__init__(inputs=..., outputs=...)`, then `self._set_config(...)`
    so that `get_config` / `from_config` (and `.keras` files) round-trip.
    """

    def __init__(self, inputs, outputs, **kwargs):
        # keras.Model drops keywords it does not know: a misspelt argument
        # (`num_layer=4`) would build the default model without a word.
        message = unknown_arguments_message(type(self), kwargs)
        if message:
            raise TypeError(message)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    def __call__(self, inputs, *args, **kwargs):
        return super().__call__(self.complete_inputs(inputs), *args, **kwargs)

    def call(self, inputs, training=None, mask=None):
        inputs = self.complete_inputs(inputs)  # JAX's trainer calls `call` directly.
        check_integer_inputs(self._inputs_struct, inputs)
        if isinstance(inputs, dict):
            check_batch_sizes(**inputs)
        return super().call(inputs, training=training, mask=mask)

    def complete_inputs(self, inputs):
        """`inputs` with the inputs that may be left out filled in (BERT's segment ids); here, as given."""
        return inputs

    # Compiled steps cannot check values, and under XLA (TF, JAX) a gather
    # clamps an index out of range: ids past the vocabulary, or (TF, once
    # Keras relaxed the traced length) a sequence past the learned position
    # table, trained and predicted without a word. Arrays, and the shapes of
    # datasets, are checked here before any step.
    def fit(self, x=None, y=None, *args, **kwargs):
        x = without_none(x)
        check_data(self, x, y)
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)):
            validation = kwargs["validation_data"] = (without_none(validation[0]), *validation[1:])
            check_data(self, *validation[:2])
        else:
            check_data(self, validation)
        return super().fit(x, y, *args, **kwargs)

    def _symbolic_build(self, iterator=None, data_batch=None):
        # Under a `tf.distribute` strategy (MirroredStrategy over several
        # GPUs), Keras's TF trainer builds the model from the replicas' first
        # batches averaged by a "MEAN" reduce: float token ids, which `call`
        # refuses. Only their shapes count there, so they take back the
        # inputs' dtypes; the steps themselves get the data as given.
        if data_batch is not None:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data_batch)
            data_batch = (with_input_dtypes(self, self.complete_inputs(x)), y, sample_weight)
        return super()._symbolic_build(iterator=iterator, data_batch=data_batch)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        x = without_none(x)
        check_data(self, x, y)
        with reattach_jax_state(self):
            return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        x = without_none(x)
        check_data(self, x)
        with reattach_jax_state(self):
            return super().predict(x, *args, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras's `export`; a TF SavedModel is written by `kerasformer.export.export`, from any backend.

        Keras's own SavedModel export failed on our models where a user meets
        it: on torch for every model (`torch.export` of a functional model),
        and on JAX for two inputs of one length (BERT's token and segment
        ids, traced with a symbolic length each). This writes the same
        SavedModel on every backend: Keras's `serve` endpoint (the model's
        inputs as it takes them -> its outputs, as float32) beside the
        signatures of `kerasformer export` (`serving_default`, `generate`, ...).
        An `input_signature`, Keras's keyword options, or another `format`
        go to Keras's export as given.

        Example:

        >>> model.export("saved_models/gpt")                       # doctest: +SKIP
        >>> tf.saved_model.load("saved_models/gpt").serve(token_ids)  # doctest: +SKIP
        """
        if format != "tf_saved_model" or input_signature is not None or kwargs:
            return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)
        from kerasformer.export import export

        path = export(self, filepath)
        if verbose is None or verbose:
            print(f"Saved artifact at '{path}': call `tf.saved_model.load(path).serve(inputs)`, "
                  "or see its signatures with `saved_model_cli show --all --dir PATH`.")
        return path

    def input_vocabularies(self):
        """`{input name: (number of ids, the argument that sets it)}`: the ids each input may hold."""
        return {}

    # A step that fails (a batch that does not trace: a sequence longer than
    # the position table, labels of the wrong shape) must leave the model as
    # it was. On JAX, Keras's fit / evaluate / predict detach the variables
    # while a step holds them and reattach them only after it returns: every
    # weight was left None, the trained model lost. On TF, a first fit that
    # failed kept its half-traced function: every later fit raised "Creating
    # variables on a non-first call to a function decorated with tf.function".
    def make_train_function(self, force=False):
        super().make_train_function(force)
        self.train_function = guard_step_function(self, self.train_function, "train")
        return self.train_function

    def make_test_function(self, force=False):
        super().make_test_function(force)
        self.test_function = guard_step_function(self, self.test_function, "test")
        return self.test_function

    def make_predict_function(self, force=False):
        super().make_predict_function(force)
        self.predict_function = guard_step_function(self, self.predict_function, "predict")
        return self.predict_function

    def _set_config(self, config):
        self._model_config = dict(config)
        for key, value in config.items():
            setattr(self, key, value)

    def get_config(self):
        # "dtype": the policy it was built under, which its layers took (e.g.
        # `mixed_bfloat16` in a `--precision bf16` run); it loads under it again.
        config = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy.name, **self._model_config}
        quantized = quantized_layers(self)
        if quantized:
            config["quantized_layers"] = quantized
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        quantized = config.pop("quantized_layers", None)
        with dtype_policy_scope(config.pop("dtype", None)):
            model = cls(**cls._deserialize_arguments(config))
        quantize_layers(model, quantized)
        return model

    @classmethod
    def _deserialize_arguments(cls, config):
        """The constructor arguments in `config`, objects deserialized (under the model's dtype policy)."""
        return config


@contextlib.contextmanager
def reattach_jax_state(model):
    """On JAX, puts the state of an interrupted `evaluate` / `predict` back into `model`'s variables.

    Keras's JAX trainer detaches the variables while its loop holds their
    values, and only `fit` reattaches them when interrupted (its `finally`):
    a Ctrl-C or a callback's error during `predict` left every weight None.
    """
    if keras.backend.backend() != "jax":
        yield
        return
    model._jax_state = None  # Only this call's state may come back, never an older one.
    try:
        yield
    finally:
        model.jax_state_sync()


def guard_step_function(model, step_function, kind):
    """Keras's compiled step `kind` ("train", "test" or "predict") of `model`, left as it was by a failure.

    On JAX, the step's `state` argument (variable values in the order of
    Keras's `JAXTrainer._get_jax_state`) goes back into the variables if the
    step raises. On TF, a step that fails before it ever ran is dropped, so
    that the next call traces a fresh one. Torch needs neither.
    """
    backend = keras.backend.backend()
    if backend not in ("jax", "tensorflow") or step_function is None or getattr(step_function, "guarded", False):
        return step_function

    def variable_groups():
        groups = [model.trainable_variables, model.non_trainable_variables]
        if kind == "train":
            groups.append(model.optimizer.variables)
        if kind in ("train", "test"):
            groups.append(model.metrics_variables)
        return groups

    def give_state_back(state):
        pairs = [pair for group, values in zip(variable_groups(), state) for pair in zip(group, values)]
        # Values a step consumed (donated buffers) cannot come back; a failure
        # while tracing, the usual one, consumed none.
        if not any(getattr(value, "is_deleted", lambda: False)() for _, value in pairs):
            for variable, value in pairs:
                variable.assign(value)
            model._jax_state_synced = True  # So that fit's own clean-up restores nothing older.

    def step(*args):
        try:
            outputs = step_function(*args)
        except BaseException:
            if backend == "jax":
                give_state_back(args[0])
            elif not step.ran:
                setattr(model, f"{kind}_function", None)
            raise
        step.ran = True
        return outputs

    step.guarded, step.ran = True, False
    return step


def check_data(model, x, y=None):
    """Raises a ValueError naming what in `fit` / `evaluate` / `predict` data `model` cannot take.

    Checked: sequences longer than a learned position table; in arrays and
    tensors, no rows at all, ids outside an input's vocabulary and integer labels `y`
    outside the logits. `x` is an array or tensor, a dict of them by input
    name, or a `tf.data.Dataset` (its element spec's lengths, where static).
    Other data (generators, `PyDataset`s) is left to the layers.
    """
    from kerasformer.layers import PositionEmbedding
    from kerasformer.layers.embedding import check_token_ids

    if x is None:
        return
    spec = getattr(x, "element_spec", None)
    if spec is not None:  # A tf.data.Dataset of (inputs, labels, ...) or of inputs: shapes only.
        x, y = (spec[0] if isinstance(spec, tuple) else spec), None
    if not isinstance(x, dict):  # Token ids alone, which a BERT also takes.
        x = {"token_ids" if isinstance(model._inputs_struct, dict) else model.inputs[0].name: x}
    named = list(x.items())
    tables = [layer.sequence_length for layer in model._flatten_layers() if isinstance(layer, PositionEmbedding)]
    vocabularies = model.input_vocabularies()
    for name, value in named:
        shape = tuple(getattr(value, "shape", ()))
        if spec is None and is_array(value) and shape and shape[0] == 0:  # Keras's predict failed on it, unnamed.
            raise ValueError(f"`{name}` holds no examples (0 rows): give at least one.")
        length = shape[1] if len(shape) >= 2 else None
        if tables and isinstance(length, int) and length > min(tables):
            raise ValueError(
                f"`{name}` holds sequences of {length} tokens, longer than the learned position table "
                f"(`max_sequence_length={min(tables)}`): give at most {min(tables)} tokens a row."
            )
        if spec is None and name in vocabularies and is_array(value):
            size, size_name = vocabularies[name]
            check_token_ids(value, size, name, size_name)
    if is_array(y) and len(model.outputs) == 1:
        check_labels(y, model.outputs[0].shape[-1])


def with_input_dtypes(model, x):
    """`x` with each tensor cast to the dtype of the model input it feeds (a structure that does not match: as given)."""
    expected = model._inputs_struct
    if isinstance(expected, dict) != isinstance(x, dict):
        return x
    if not isinstance(x, dict):
        return keras.ops.cast(x, expected.dtype)
    return {name: keras.ops.cast(value, expected[name].dtype) if name in expected and value is not None else value for name, value in x.items()}


def without_none(x):
    """A dict of inputs without its `None` entries, which the model fills in (Keras 3.11's data adapters fail on them)."""
    return {name: value for name, value in x.items() if value is not None} if isinstance(x, dict) else x


def is_array(value):
    return isinstance(value, np.ndarray) or keras.ops.is_tensor(value)


def check_labels(y, num_logits):
    """Raises a ValueError unless integer labels `y` are class ids in `[0, num_logits)`; float labels pass."""
    values = keras.ops.convert_to_numpy(y)
    if values.dtype.kind not in "iu" or values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_logits:
        raise ValueError(
            f"Labels `y` must be ids in [0, {num_logits}) for the model's {num_logits} logits, got values from "
            f"{low} to {high}. Leave positions out of the loss with a `sample_weight` of 0 (not an id such as -100)."
        )


def check_integer_inputs(expected, inputs):
    """Raises a ValueError naming the input that takes ids but was given non-integer values.

    A functional model casts each input to its `keras.Input` dtype, so float
    token ids (1.7) would be truncated to 1 without a word. The dtype is
    static, so this holds in compiled calls (`fit`, `predict`) too.

    Args:
        expected: the model's `keras.Input` tensors, one or a dict by name.
        inputs: what the model was called with, in the same structure.
    """
    if isinstance(expected, dict) != isinstance(inputs, dict):
        return  # Keras names a structure that does not match.
    pairs = [(expected[name], inputs[name]) for name in expected if name in inputs] if isinstance(expected, dict) else [(expected, inputs)]
    for spec, value in pairs:
        if not keras.backend.standardize_dtype(spec.dtype).startswith(("int", "uint")):
            continue
        dtype = getattr(value, "dtype", None)
        dtype = np.asarray(value).dtype.name if dtype is None else keras.backend.standardize_dtype(dtype)
        if not dtype.startswith(("int", "uint")):
            raise ValueError(f"`{spec.name}` must be integer token ids, got dtype {dtype}.")


class TaskModel(TransformerModel):
    """A `TransformerModel` wrapping a backbone model (given as `backbone=`)."""

    def input_vocabularies(self):
        return self.backbone.input_vocabularies()

    def complete_inputs(self, inputs):
        return self.backbone.complete_inputs(inputs)

    def get_config(self):
        config = super().get_config()
        config["backbone"] = keras.saving.serialize_keras_object(self.backbone)
        return config

    @classmethod
    def _deserialize_arguments(cls, config):
        return {**config, "backbone": keras.saving.deserialize_keras_object(config["backbone"])}


class GenerativeModel(TransformerModel):
    """A `TransformerModel` that generates text: `GPT`, `T5`, `Transformer`."""

    def generate(self, inputs, max_new_tokens=32, **options):
        """New tokens after each prompt (GPT) or for each source (T5, Transformer).

        `kerasformer.generate.generate(self, ...)`, which has the options
        (greedy by default; `temperature`, `top_k`, `top_p`, `seed`,
        `stop_token_ids`, `num_beams`, ...); compiled once per model and shape.

        Example:

        >>> from kerasformer.models import GPT
        >>> model = GPT(vocab_size=100, num_layers=2, num_heads=2, hidden_dim=32)
        >>> model.generate([[5, 6, 7], [8]], max_new_tokens=4).shape  # (B, max_new_tokens), int32 numpy
        (2, 4)
        """
        from kerasformer.generate import generate

        return generate(self, inputs, max_new_tokens=max_new_tokens, **options)


# A model rebuilds from its constructor arguments, with float kernels. The
# layers that `model.quantize(mode)` replaced (int8, int4, float8, GPTQ, ...)
# are listed in its config, by path, and quantized again when it loads, so
# that the weights of a quantized `.keras` file find their variables.
def quantized_layers(model):
    """`{layer path: {"mode", "config"}}` of `model`'s quantized layers."""
    return {
        layer.path: {
            "mode": layer.quantization_mode,
            "config": keras.saving.serialize_keras_object(getattr(layer, "quantization_config", None)),
        }
        for layer in model._flatten_layers(include_self=False)
        if layer.quantization_mode is not None
    }


def quantize_layers(model, quantized):
    """Quantizes the layers of a rebuilt `model` as `quantized_layers` listed them."""
    if not quantized:
        return
    layers = {layer.path: layer for layer in model._flatten_layers(include_self=False)}
    for path, entry in quantized.items():
        layer = layers.get(path)
        if layer is None:
            raise ValueError(f"The config lists a quantized layer {path!r} that {type(model).__name__} does not have.")
        if layer.quantization_mode is None:  # A backbone's layers are quantized by its own config.
            config = keras.saving.deserialize_keras_object(entry["config"])
            # Keras 3.11 takes no `config` (and writes none).
            options = {} if config is None else {"config": config}
            layer.quantize(entry["mode"], type_check=False, **options)
    if keras.backend.backend() == "torch":  # As `Model.quantize` does: track the new variables.
        for layer in model._flatten_layers():
            layer._track_variables()


@contextlib.contextmanager
def dtype_policy_scope(name):
    """Layers built inside take dtype policy `name` (None: the current global one), as a builder's do."""
    if name is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def empty_cache(blocks, batch_size, max_length, dtype):
    """A zero KV cache for the self-attention of `blocks`: one `(B, 2, K, max_length, D)`
    tensor per block (heads-major, see `layers/attention.py`), in a tuple
    (separate tensors, so a step updates each in place under XLA and copies
    nothing else)."""
    attention = blocks[0].self_attention.sublayer
    shape = (batch_size, 2, attention.num_key_value_heads, max_length, attention.head_dim)
    return tuple(keras.ops.zeros(shape, dtype=dtype) for _ in blocks)

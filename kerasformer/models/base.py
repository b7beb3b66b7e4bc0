"""What every model builder shares: its constructor arguments are its config."""

import contextlib
import inspect
import numbers

import keras

from kerasformer.checks import check_positive_int


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

    def _set_config(self, config):
        self._model_config = dict(config)
        for key, value in config.items():
            setattr(self, key, value)

    def get_config(self):
        # "dtype": the policy it was built under, which its layers took (e.g.
        # `mixed_bfloat16` in a `--precision bf16` run); it loads under it again.
        return {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy.name, **self._model_config}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        with dtype_policy_scope(config.pop("dtype", None)):
            return cls(**config)


class TaskModel(TransformerModel):
    """A `TransformerModel` wrapping a backbone model (given as `backbone=`)."""

    def get_config(self):
        config = super().get_config()
        config["backbone"] = keras.saving.serialize_keras_object(self.backbone)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        with dtype_policy_scope(config.pop("dtype", None)):
            config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
            return cls(**config)


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

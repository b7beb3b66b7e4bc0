"""Position information: sinusoidal, learned, rotary, and T5's relative bias."""

import math

import keras
from keras import ops

from kerasformer.checks import check_int, check_number, check_positive_int
from kerasformer.tf_xla import compiling_with_xla


def _checked_in_tf_graph(positions, sequence_length):
    """`positions`, once a TF graph has checked that they fit the table (a SavedModel of a model assembled from
    the layers: the gather's own error names no argument, "indices[8] = 8 is not in [0, 8)"). XLA would drop the
    check and log "Ignoring Assert operator" at each compilation, so a graph XLA compiles gets none."""
    import tensorflow as tf

    if tf.executing_eagerly() or compiling_with_xla():
        return positions
    message = f"The sequence does not fit the learned position table of `sequence_length={sequence_length}`."
    check = tf.debugging.assert_less(tf.reduce_max(positions), sequence_length, message=message)
    with tf.control_dependencies([check]):
        return tf.identity(positions)


def _check_inputs(layer, inputs, rank, expected, start_index=0):
    """Names `inputs` of the wrong rank and a negative Python-int `start_index` (else broadcasting or gathers fail)."""
    if len(inputs.shape) != rank:
        raise ValueError(f"{layer}'s `inputs` must have shape {expected}, got shape {tuple(inputs.shape)}.")
    if isinstance(start_index, int) and start_index < 0:
        raise ValueError(f"{layer}'s `start_index` must be >= 0, got {start_index}.")


def _static_length(tensor, axis=1):
    """The length along `axis` if known when tracing, else None."""
    length = tensor.shape[axis]
    return length if isinstance(length, int) else None


@keras.saving.register_keras_serializable(package="kerasformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed encoding of "Attention Is All You Need" (section 3.5).

    `PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`,
    sines and cosines interleaved as in the paper. Works for any length.

    Args:
        max_wavelength: the 10000 of the formula.

    Call arguments:
        inputs: `(B, T, d)` embeddings; only their shape is used.
        start_index: position of the first token (the cache index when
            decoding incrementally).

    Returns:
        The encoding `(B, T, d)`, to be added to `inputs`.

    Example:

    >>> x = np.zeros((2, 16, 32), "float32")
    >>> SinusoidalPositionEncoding()(x).shape
    (2, 16, 32)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        check_number("max_wavelength", max_wavelength, low=0, low_open=True)
        self.max_wavelength = max_wavelength
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        _check_inputs("SinusoidalPositionEncoding", inputs, 3, "(batch, length, width)", start_index)
        shape = ops.shape(inputs)
        length, width = shape[1], shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # (T,)
        pair_index = ops.arange((width + 1) // 2, dtype="float32")  # i
        inverse_wavelength = ops.power(
            float(self.max_wavelength), -2.0 * pair_index / float(width)
        )  # (d/2,)
        angles = positions[:, None] * inverse_wavelength[None, :]  # (T, d/2)
        encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, d/2, 2)
        encoding = ops.reshape(encoding, (length, -1))[:, :width]  # (T, d)
        return ops.broadcast_to(ops.cast(encoding, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}


@keras.saving.register_keras_serializable(package="kerasformer")
class PositionEmbedding(keras.layers.Layer):
    """A learned table of position vectors (BERT, GPT-2).

    Args:
        sequence_length: the number of positions in the table; longer inputs
            raise a `ValueError`.
        initializer: initializer of the table. GPT-2 and BERT use
            `TruncatedNormal(stddev=0.02)`.

    Call arguments:
        inputs: `(B, T, d)` embeddings; only their shape is used.
        start_index: position of the first token.

    Returns:
        The embeddings of positions `start_index .. start_index + T - 1`,
        broadcast to `(B, T, d)`.

    Example:

    >>> x = np.zeros((2, 16, 32), "float32")
    >>> PositionEmbedding(sequence_length=64)(x).shape
    (2, 16, 32)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        _check_inputs("PositionEmbedding", inputs, 3, "(batch, length, width)", start_index)
        shape = ops.shape(inputs)
        length = _static_length(inputs)
        start = start_index if isinstance(start_index, int) else None  # A traced index cannot be checked.
        if length is not None and start is not None and start + length > self.sequence_length:
            raise ValueError(
                f"Sequence of length {length} starting at position {start} does not "
                f"fit the learned position table of `sequence_length="
                f"{self.sequence_length}` (positions 0 to {self.sequence_length - 1})."
            )
        # A gather rather than a dynamic slice: both XLA and torch.export take it.
        positions = ops.arange(shape[1]) + ops.cast(start_index, "int32")  # (T,)
        if keras.backend.backend() == "tensorflow" and (length is None or start is None):
            positions = _checked_in_tf_graph(positions, self.sequence_length)
        embeddings = ops.take(self.position_embeddings, positions, axis=0)  # (T, d)
        return ops.broadcast_to(ops.cast(embeddings, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "initializer": keras.initializers.serialize(self.initializer),
        }


@keras.saving.register_keras_serializable(package="kerasformer")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoFormer, Su et al. 2021) of queries or keys.

    Rotates each pair of features `(x_j, x_{j + D/2})` by the angle
    `pos / max_wavelength^(2j/D)`, so that `q_m . k_n` depends only on `m - n`.
    The half-split pairing is that of GPT-NeoX, LLaMA and KerasHub.

    Args:
        max_wavelength: base of the angles.
        scaling_factor: positions are divided by it (linear position
            interpolation, to stretch a trained context).

    Call arguments:
        inputs: `(B, T, heads, D)`, with D even.
        start_index: position of the first token.

    Example:

    >>> q = np.random.rand(2, 16, 4, 8).astype("float32")
    >>> RotaryEmbedding()(q).shape
    (2, 16, 4, 8)
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        check_number("max_wavelength", max_wavelength, low=0, low_open=True)
        check_number("scaling_factor", scaling_factor, low=0, low_open=True)
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.built = True

    def call(self, inputs, start_index=0):
        _check_inputs("RotaryEmbedding", inputs, 4, "(batch, length, heads, head_dim)", start_index)
        shape = ops.shape(inputs)
        length, dim = shape[1], inputs.shape[-1]
        if dim % 2:
            raise ValueError(f"Rotary embedding needs an even head dim, got {dim}.")
        positions = ops.cast(ops.arange(length) + start_index, "float32")
        positions = positions / self.scaling_factor  # (T,)
        inverse_frequency = ops.power(
            float(self.max_wavelength), -ops.arange(0, dim, 2, dtype="float32") / dim
        )  # (D/2,)
        angles = positions[:, None] * inverse_frequency[None, :]  # (T, D/2)
        angles = ops.concatenate([angles, angles], axis=-1)[None, :, None, :]  # (1, T, 1, D)
        x = ops.cast(inputs, "float32")
        first, second = ops.split(x, 2, axis=-1)
        rotated_half = ops.concatenate([-second, first], axis=-1)  # (B, T, H, D)
        outputs = x * ops.cos(angles) + rotated_half * ops.sin(angles)
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {
            **super().get_config(),
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
        }


def check_buckets(num_buckets, max_distance, bidirectional, names=("num_buckets", "max_distance"), owner=""):
    """Raises a ValueError naming `names` (of `owner`) unless T5's bucketing works with them (else a division by zero)."""
    # Bidirectional buckets are halved by direction, then half of those are exact: each part needs one.
    check_int(names[0], num_buckets, low=4 if bidirectional else 2, owner=owner)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    # The log-spaced buckets cover distances from max_exact to max_distance.
    check_int(names[1], max_distance, low=max_exact + 1, owner=owner)


@keras.saving.register_keras_serializable(package="kerasformer")
class RelativePositionBias(keras.layers.Layer):
    """T5's bucketed relative position bias, added to the attention scores.

    Relative distances `key_pos - query_pos` fall into `num_buckets` buckets:
    exact ones for short distances, logarithmic ones up to `max_distance`.
    Each bucket has a learned bias per head. One such layer is shared by all
    layers of a T5 stack.

    Args:
        num_heads: number of attention heads.
        num_buckets: number of buckets (T5: 32).
        max_distance: distance beyond which all share the last bucket (T5: 128).
        bidirectional: True for the encoder, False for causal decoders, where
            keys in the future share a bucket.
        initializer: initializer of the `(num_buckets, num_heads)` table.

    Call arguments:
        query: `(B, T, ...)`; only its length is used.
        key: `(B, S, ...)`; defaults to `query`.
        query_start: position of the first query (the cache index).

    Returns:
        A `(1, heads, T, S)` bias.

    Example:

    >>> x = np.zeros((2, 10, 16), "float32")
    >>> RelativePositionBias(num_heads=4)(x).shape
    (1, 4, 10, 10)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_buckets(num_buckets, max_distance, bidirectional)
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.initializer = keras.initializers.get(initializer)

    def build(self, query_shape, key_shape=None):
        self.bias_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.initializer,
        )
        self.built = True

    def bucket(self, relative_position):
        """Maps `key_pos - query_pos` to a bucket id (T5's `_relative_position_bucket`)."""
        num_buckets = self.num_buckets
        buckets = 0
        if self.bidirectional:
            num_buckets //= 2
            buckets = ops.cast(relative_position > 0, "int32") * num_buckets
            distance = ops.abs(relative_position)
        else:
            distance = -ops.minimum(relative_position, 0)
        max_exact = num_buckets // 2
        is_small = distance < max_exact
        safe_distance = ops.maximum(ops.cast(distance, "float32"), 1.0)
        large = max_exact + ops.cast(
            ops.log(safe_distance / max_exact)
            / math.log(self.max_distance / max_exact)
            * (num_buckets - max_exact),
            "int32",
        )
        large = ops.minimum(large, num_buckets - 1)
        return buckets + ops.where(is_small, distance, large)

    def call(self, query, key=None, query_start=0):
        key = query if key is None else key
        query_positions = ops.arange(ops.shape(query)[1]) + ops.cast(query_start, "int32")
        key_positions = ops.arange(ops.shape(key)[1])
        relative = key_positions[None, :] - query_positions[:, None]  # (T, S)
        buckets = self.bucket(relative)  # (T, S)
        bias = ops.take(ops.convert_to_tensor(self.bias_embeddings), buckets, axis=0)  # (T, S, H)
        bias = ops.transpose(bias, (2, 0, 1))[None]  # (1, H, T, S)
        return ops.cast(bias, self.compute_dtype)

    def compute_output_shape(self, query_shape, key_shape=None):
        key_shape = key_shape or query_shape
        return (1, self.num_heads, query_shape[1], key_shape[1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
            "initializer": keras.initializers.serialize(self.initializer),
        }

"""Multi-head attention with masks, GQA, rotary positions, position bias and a KV cache.

Layout follows `keras.layers.MultiHeadAttention`: projections are `EinsumDense`
layers producing `(B, T, heads, head_dim)`; every mask source is merged in
`merge_attention_masks`; the fused `keras.ops.dot_product_attention` path is used
whenever attention scores are not needed (see `_prefer_fused_attention`).

Shape letters: B batch, T query length, S key length, H query heads,
K key/value heads, D head dim, C model width.

Caches hold keys and values heads-major, `(B, 2, K, S, D)`, and the keys are
the left operand of the score product: a decoding step then reads them as they
lie. In the `(B, S, K, D)` layout of the projections XLA on CPU copied each
layer's cached keys and values on every token (JAX greedy generation, batch 1:
1.02-1.10x KerasHub before, 1.35-1.50x after; `benchmarks/generate.py`).
"""

import math

import keras
from keras import ops

from kerasformer.checks import check_batch_sizes, check_number, check_positive_int, check_rate
from kerasformer.layers.linear import linear
from kerasformer.layers.positions import RotaryEmbedding

try:  # The implicit (`mask_zero=True`) mask lives outside the tensor on JAX.
    from keras.src.backend import get_keras_mask, set_keras_mask
except ImportError:  # pragma: no cover - older Keras keeps it on the tensor.

    def get_keras_mask(x):
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x, mask):
        try:
            x._keras_mask = mask
        except AttributeError:
            pass


def _large_negative(dtype):
    """A finite "minus infinity" for masking, safe to add to scores in `dtype`.

    Finite so that a fully masked row gives a uniform softmax instead of NaN.
    """
    return -3.0e4 if keras.backend.standardize_dtype(dtype) == "float16" else -1.0e9


def _check_rank(name, tensor, rank, expected):
    if tensor is not None and len(tensor.shape) != rank:
        raise ValueError(
            f"`{name}` must have shape {expected}, got shape {tuple(tensor.shape)}."
        )


def check_sequence_shapes(**shapes):
    """Raises a ValueError naming the first of `shapes` (name: shape or None) that is not `(batch, length, width)`."""
    for name, shape in shapes.items():
        if shape is not None and len(shape) != 3:
            raise ValueError(f"`{name}` must have shape (batch, length, width), got shape {tuple(shape)}.")


def check_float_inputs(**tensors):
    """Raises a ValueError naming the first of `tensors` (name: tensor or None) that is not floating point.

    Blocks and attention take embeddings; token ids given by mistake would
    otherwise fail deep inside a backend op, or be silently cast on some.
    """
    for name, tensor in tensors.items():
        dtype = getattr(tensor, "dtype", None)
        if dtype is None:
            continue
        dtype = keras.backend.standardize_dtype(dtype)
        if "float" not in dtype:
            raise ValueError(
                f"`{name}` must be floating-point vectors (batch, length, width), got dtype {dtype}. "
                "Embed token ids first, e.g. with `keras.layers.Embedding`."
            )


def merge_attention_masks(
    query_length,
    key_length,
    padding_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    query_start=0,
):
    """Merges every mask source into one boolean mask, or returns `None`.

    Args:
        query_length: T, the number of queries.
        key_length: S, the number of keys.
        padding_mask: `(B, S)`, True (or 1) at real keys, False at padding.
        attention_mask: `(B, T, S)`, True where query t may attend to key s.
        use_causal_mask: forbid keys after the query's own position.
        query_start: position of the first query among the keys (the cache
            index when decoding incrementally); scalar, may be a tensor.

    Returns:
        A `(B or 1, T, S)` boolean tensor, True where attention is allowed,
        or `None` when nothing is masked.
    """
    _check_rank("padding_mask", padding_mask, 2, "(batch, key_length)")
    _check_rank(
        "attention_mask", attention_mask, 3, "(batch, query_length, key_length)"
    )
    # Where the lengths are known, a mismatch is named here rather than failing in a broadcast.
    for name, tensor, expected in (
        ("padding_mask", padding_mask, (key_length,)),
        ("attention_mask", attention_mask, (query_length, key_length)),
    ):
        if tensor is None:
            continue
        given = tuple(tensor.shape[1:])
        if any(isinstance(g, int) and isinstance(e, int) and g != e for g, e in zip(given, expected)):
            raise ValueError(
                f"`{name}` must have shape (batch, {', '.join(map(str, expected))}) to match the "
                f"{'keys' if name == 'padding_mask' else 'queries and keys'}, got shape {tuple(tensor.shape)}."
            )
    mask = None
    if padding_mask is not None:
        mask = ops.cast(padding_mask, "bool")[:, None, :]  # (B, 1, S)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")  # (B, T, S)
        mask = attention_mask if mask is None else ops.logical_and(mask, attention_mask)
    if use_causal_mask:
        if isinstance(query_start, int):  # No host value copied to the device (on a GPU, a sync per layer).
            query_positions = ops.arange(query_start, query_start + query_length)
        else:
            query_positions = ops.arange(query_length) + ops.cast(query_start, "int32")
        key_positions = ops.arange(key_length)
        causal = key_positions[None, :] <= query_positions[:, None]  # (T, S)
        causal = causal[None]  # (1, T, S)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    return mask


def _project(dense, x, input_dims=1):
    """`dense` (an `EinsumDense`) applied as one 2-D matmul on its flattened kernel.

    Same result as `dense(x)`; the kernel `(C, H, D)` or `(H, D, C)` is viewed
    as a matrix, which XLA on CPU runs about 3x faster than the 3-D einsum
    (measured on TensorFlow, batch-1 decoding) and which skips a layer call.
    A quantized layer (`model.quantize`) runs its own call, which applies the
    kernel's scale. The weights are cast to the layer's compute dtype:
    `compute_cache` runs outside a layer call, where Keras does not autocast
    variables (a mixed_bfloat16 cache had come out float32).
    """
    if dense.quantization_mode is not None:
        return dense(x)
    kernel = ops.cast(dense.kernel, dense.compute_dtype)
    in_shape, out_shape = tuple(kernel.shape[:input_dims]), tuple(kernel.shape[input_dims:])
    in_size, out_size = math.prod(in_shape), math.prod(out_shape)
    lead = ops.shape(x)[:-input_dims]
    flat = ops.reshape(x, (-1, in_size))  # (B*T, C)
    bias = None if dense.bias is None else ops.reshape(ops.cast(dense.bias, dense.compute_dtype), (out_size,))
    y = linear(flat, ops.reshape(kernel, (in_size, out_size)), bias)  # (B*T, H*D)
    return ops.reshape(y, (*lead, *out_shape))


def _project_together(denses, x):
    """`[dense(x) for dense in denses]` as one matmul on the concatenated kernels.

    Self-attention's query, key and value projections read the same input:
    one `(C, 3 H D)` matmul instead of three `(C, H D)` ones is fewer, larger
    kernels (XLA on CPU pays a fixed cost per kernel; torch per launch), and
    the three input gradients arrive summed. Quantized layers run apart.
    """
    if any(d.quantization_mode is not None for d in denses):
        return [_project(d, x) for d in denses]
    kernels = [ops.reshape(d.kernel, (d.kernel.shape[0], -1)) for d in denses]
    sizes = [k.shape[1] for k in kernels]
    lead = ops.shape(x)[:-1]
    flat = ops.reshape(x, (-1, x.shape[-1]))  # (B*T, C)
    bias = None
    if all(d.bias is not None for d in denses):
        bias = ops.concatenate([ops.reshape(d.bias, (-1,)) for d in denses], axis=0)
    y = linear(flat, ops.concatenate(kernels, axis=1), bias)  # (B*T, sum of H*D)
    parts = split_columns(y, sizes)  # [(B*T, H*D)] * 3
    return [ops.reshape(part, (*lead, *d.kernel.shape[1:])) for d, part in zip(denses, parts)]  # (B, T, H, D)


def split_columns(y, sizes):
    """`y (N, sum(sizes))` as its column blocks `[(N, size)]`, their gradients joined by one concatenation.

    The gradient of slices pads each part's gradient to the full width and
    sums the pads. XLA on CPU ran that as pad + add passes over `(N, 3 H D)`:
    in the throughput benchmark's GPT (4 blocks, N=2048, 2 cores;
    `benchmarks/step_breakdown.py`) 9-15 ms of each JAX training step and
    8 ms of each TF one, the costliest operations outside its matmuls. Torch
    zero-fills a full-width tensor per slice (the backward of one split took
    2.07 ms as slices, 1.12 ms as a split). A split's gradient is one
    concatenation (`tf.split`, `torch.split`, `jax.lax.split`). JAX training
    step, 3 paired processes: 701 -> 651, 560 -> 547, 611 -> 558 ms (best of 5).
    """
    sizes = tuple(int(size) for size in sizes)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.split(y, sizes, axis=-1)
    if backend == "torch":
        import torch

        return list(torch.split(y, sizes, dim=-1))  # Views of y.
    if backend == "jax":
        from jax import lax

        if hasattr(lax, "split"):  # JAX 0.4.36 and later.
            return list(lax.split(y, sizes, axis=y.ndim - 1))
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [y[..., start:end] for start, end in zip(bounds[:-1], bounds[1:])]


def _heads_major(key_values):
    """`(B, 2, S, K, D)` stacked keys and values as `(B, 2, K, S, D)`, the caches' layout."""
    return ops.transpose(key_values, (0, 1, 3, 2, 4))


def _fused_attention_is_faster():
    """Whether `keras.ops.dot_product_attention` beats explicit einsum+softmax.

    Measured on 2 CPU cores, causal fwd+bwd of the attention core at
    B16/T128/H4/D64 (`benchmarks/attention_paths.py`; fused vs explicit):
    - jax (jit): 24.1 vs 22.6 ms -> explicit. On GPU,
      `jax.nn.dot_product_attention` reaches cuDNN flash attention -> fused.
    - tensorflow (XLA): 16.6 vs 15.2 ms -> explicit (TF 2.21 on Zen 4:
      11.1 vs 9.2 ms). Keras implements the "fused" op with the same einsums,
      so there is no kernel to win. A hand-written backward (heads-major
      operands, materialized transposes so that every product is
      non-transposed) was no faster than XLA's own gradient: 7.5-7.9 vs 7.5 ms
      (fwd+bwd alone, no copy out), 0.999x in the training step (median of 6
      paired rounds).
    - torch (eager): 15.0 vs 16.4 ms -> fused (SDPA: one kernel, no score
      tensor kept for backward); on CUDA it is flash attention.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
    return False


def causal_query_blocks(query_length, key_length):
    """How many query blocks the explicit causal path splits self-attention into.

    Query block i sees only keys up to its own end, so the score tiles above
    the diagonal are never computed, as flash attention skips them (4 blocks:
    62.5% of the scores' FLOPs). 4 or 2 blocks of at least 32 queries on JAX;
    1 (no split) for short, dynamic or non-square attention, and on the other
    backends. Measured on 2 CPU cores, B16/T128/H4/D64: the causal core's
    fwd+bwd alone (`benchmarks/attention_paths.py`) takes 0.71x the unsplit
    time on jax and 0.87x on tensorflow (XLA; 0.96x with TF 2.21); the
    throughput benchmark's whole training step, median of 8-10 paired rounds
    vs unsplit, gained 2.7% on jax but 0.985-0.996x on tensorflow, so TF stays
    unsplit. torch takes SDPA.
    """
    if keras.backend.backend() != "jax":
        return 1
    if not isinstance(query_length, int) or query_length != key_length or query_length < 128:
        return 1
    for blocks in (4, 2):
        if query_length % blocks == 0:
            return blocks
    return 1


@keras.saving.register_keras_serializable(package="kerasformer")
class MultiHeadAttention(keras.layers.Layer):
    """Scaled dot-product attention over several heads, with a KV cache.

    `softmax(Q K^T * scale + bias) V` per head, with `Q = x W_Q`, `K = m W_K`,
    `V = m W_V` and output `concat(heads) W_O`. One layer serves the three
    roles of a Transformer:

    - bidirectional self-attention: `attn(x)`;
    - causal self-attention: `attn(x, use_causal_mask=True)`;
    - cross-attention: `attn(x, encoder_outputs)`.

    Args:
        num_heads: number of query heads H.
        head_dim: width D of each head. Defaults to `width // num_heads`, in
            which case `num_heads` must divide the query width.
        num_key_value_heads: K, the number of key/value heads for grouped-query
            attention; must divide `num_heads`. Defaults to `num_heads`
            (plain multi-head attention); 1 gives multi-query attention.
        output_dim: width of the output. Defaults to the query width.
        use_bias: whether the four projections have biases.
        dropout: dropout on the attention probabilities. Defaults to 0 so the
            fused kernel stays usable; residual dropout lives in `Residual`.
        scale: multiplier of the scores. Defaults to `1 / sqrt(head_dim)`;
            T5 uses 1.0.
        use_rotary: apply rotary position embedding (RoFormer) to q and k.
        rotary_max_wavelength: base wavelength of the rotary embedding.
        kernel_initializer, bias_initializer: initializers of the projections.

    Call arguments:
        query: `(B, T, C)`.
        value: `(B, S, C')`, the memory to attend to. Defaults to `query`
            (self-attention).
        key: `(B, S, C')`. Defaults to `value`.
        padding_mask: `(B, S)`, True at real keys. Defaults to the Keras mask
            of `value` (e.g. from `Embedding(mask_zero=True)`).
        attention_mask: `(B, T, S)`, True where query t may attend to key s.
        attention_bias: additive bias broadcastable to `(B, H, T, S)`, e.g.
            from `RelativePositionBias`.
        use_causal_mask: forbid attention to later positions.
        cache: `(B, 2, K, S_max, D)` keys and values, heads-major. With
            `cache_update_index`, the new keys/values of this self-attention
            call are written at that index and attention covers the cache;
            without it the cache is taken as precomputed cross-attention
            keys/values (see `compute_cache`).
        cache_update_index: int scalar, position of the first query.
        return_attention_scores: also return the `(B, H, T, S)` probabilities.

    Returns:
        `output` `(B, T, output_dim)`; `(output, scores)` with
        `return_attention_scores`; `(output, cache)` or
        `(output, scores, cache)` when a cache is passed.

    Example:

    >>> attn = MultiHeadAttention(num_heads=4)
    >>> x = np.random.rand(2, 10, 64).astype("float32")
    >>> attn(x, use_causal_mask=True).shape
    (2, 10, 64)
    """

    def __init__(
        self,
        num_heads,
        head_dim=None,
        num_key_value_heads=None,
        output_dim=None,
        use_bias=True,
        dropout=0.0,
        scale=None,
        use_rotary=False,
        rotary_max_wavelength=10000,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        num_key_value_heads = num_key_value_heads or num_heads
        if num_heads % num_key_value_heads:
            raise ValueError(
                f"`num_key_value_heads` ({num_key_value_heads}) must divide "
                f"`num_heads` ({num_heads})."
            )
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        if output_dim is not None:
            check_positive_int("output_dim", output_dim)
        check_rate("dropout", dropout)
        check_number("scale", scale, low=0, low_open=True, none_ok=True)
        check_number("rotary_max_wavelength", rotary_max_wavelength, low=0, low_open=True)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_key_value_heads = num_key_value_heads
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.dropout = dropout
        self.scale = scale
        self.use_rotary = use_rotary
        self.rotary_max_wavelength = rotary_max_wavelength
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        # None picks the faster path for this backend and device; True/False
        # force the fused kernel or the explicit einsum path (benchmarks).
        self.fused_attention = None

    def build(self, query_shape, value_shape=None, key_shape=None):
        check_sequence_shapes(query=query_shape, value=value_shape, key=key_shape)
        width = query_shape[-1]
        if self.head_dim is None:
            if width % self.num_heads:
                raise ValueError(
                    f"`num_heads` ({self.num_heads}) must divide the model width "
                    f"({width}), or pass `head_dim`."
                )
            self.head_dim = width // self.num_heads
        if self.use_rotary and self.head_dim % 2:
            raise ValueError(
                f"Rotary positions (`use_rotary`) rotate pairs of features: the head width "
                f"(`head_dim`, here {self.head_dim}) must be even."
            )
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        output_dim = self.output_dim or width
        H, K, D = self.num_heads, self.num_key_value_heads, self.head_dim

        def projection(name, equation, output_shape, bias_axes):
            return keras.layers.EinsumDense(
                equation,
                output_shape=output_shape,
                bias_axes=bias_axes if self.use_bias else None,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = projection("query", "btc,chd->bthd", (None, H, D), "hd")
        self.query_dense.build(query_shape)
        self.key_dense = projection("key", "bsc,ckd->bskd", (None, K, D), "kd")
        self.key_dense.build(key_shape)
        self.value_dense = projection("value", "bsc,ckd->bskd", (None, K, D), "kd")
        self.value_dense.build(value_shape)
        self.output_dense = projection("output", "bthd,hdc->btc", (None, output_dim), "c")
        self.output_dense.build((None, None, H, D))
        self.rotary = None
        if self.use_rotary:
            self.rotary = RotaryEmbedding(
                max_wavelength=self.rotary_max_wavelength, dtype=self.dtype_policy
            )
        self.probability_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def check_cache(self, cache, query_length=None, cache_update_index=None, name="cache"):
        """Raises a ValueError naming `name` unless `cache` fits this layer (and the queries written to it).

        Expected: `(batch, 2, num_key_value_heads, length, head_dim)`, floating
        point, and with a Python-int `cache_update_index`, room for
        `query_length` new positions from it. Shapes unknown while tracing are
        skipped.
        """
        shape = tuple(cache.shape)
        expected = f"(batch, 2, {self.num_key_value_heads}, length, {self.head_dim})"
        wanted = (2, self.num_key_value_heads, None, self.head_dim)  # The length may be any.
        fits = len(shape) == 5 and all(
            want is None or not isinstance(got, int) or got == want for got, want in zip(shape[1:], wanted)
        )
        if not fits:
            raise ValueError(
                f"`{name}` must have shape {expected} (keys and values, key/value heads, "
                f"positions, head width), got shape {shape}."
            )
        check_float_inputs(**{name: cache})
        length = shape[3]
        if (
            isinstance(cache_update_index, int)
            and isinstance(query_length, int)
            and isinstance(length, int)
            and not 0 <= cache_update_index <= length - query_length
        ):
            if query_length > length:
                raise ValueError(f"`{name}` holds {length} positions, fewer than the {query_length} new ones.")
            raise ValueError(
                f"`cache_update_index` ({cache_update_index}) with {query_length} new position(s) does not "
                f"fit `{name}` of length {length}: it must be in [0, {length - query_length}]."
            )

    def compute_cache(self, value, key=None):
        """Projects a memory once into a `(B, 2, K, S, D)` cross-attention cache."""
        key = value if key is None else key
        k = _project(self.key_dense, key)  # (B, S, K, D)
        v = _project(self.value_dense, value)  # (B, S, K, D)
        if self.rotary is not None:
            k = self.rotary(k)
        return _heads_major(ops.stack([k, v], axis=1))  # (B, 2, K, S, D)

    def call(
        self,
        query,
        value=None,
        key=None,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        check_float_inputs(query=query, value=value, key=key)
        check_batch_sizes(query=query, value=value, key=key)
        if cache is not None:
            self.check_cache(cache, query.shape[1], cache_update_index)
        self_attention = value is None
        precomputed = cache is not None and cache_update_index is None
        value = query if value is None else value
        key = value if key is None else key
        if padding_mask is None and not precomputed:  # An explicit mask wins.
            padding_mask = get_keras_mask(key)
        query_mask = get_keras_mask(query)
        # Masks are handled here; clear them so the projections do not warn.
        for tensor in (query, value, key):
            set_keras_mask(tensor, None)

        if precomputed:
            # Precomputed cross-attention keys/values.
            q = _project(self.query_dense, query)  # (B, T, H, D)
            k, v = cache[:, 0], cache[:, 1]  # (B, K, S, D)
        elif key is query and value is query:
            q, k, v = _project_together(
                (self.query_dense, self.key_dense, self.value_dense), query
            )  # (B, T, H, D), (B, T, K, D), (B, T, K, D)
        else:
            q = _project(self.query_dense, query)  # (B, T, H, D)
            k = _project(self.key_dense, key)  # (B, S, K, D)
            v = _project(self.value_dense, value)  # (B, S, K, D)
        query_start = 0
        if cache_update_index is not None and not precomputed:
            if not self_attention:
                raise ValueError(
                    "`cache_update_index` is for self-attention; for "
                    "cross-attention pass a cache from `compute_cache`."
                )
            query_start = cache_update_index
        if self.rotary is not None:
            q = self.rotary(q, start_index=query_start)  # (B, T, H, D)
            if not precomputed:
                k = self.rotary(k, start_index=query_start)  # (B, S, K, D)
        if cache is not None and cache_update_index is not None:
            # One update of the (B, 2, K, S_max, D) cache: XLA does it in place,
            # torch copies the layer's cache once.
            new_key_values = _heads_major(ops.cast(ops.stack([k, v], axis=1), cache.dtype))  # (B, 2, K, T, D)
            cache = ops.slice_update(cache, [0, 0, 0, cache_update_index, 0], new_key_values)
            k, v = cache[:, 0], cache[:, 1]  # (B, K, S_max, D)
            # Unwritten cache slots lie after the queries: causal masking hides them.
            use_causal_mask = True
        heads_major = cache is not None  # k, v: (B, K, S, D), else (B, S, K, D)

        # `is_causal` lets the fused kernel skip the mask tensor altogether.
        only_causal = (
            use_causal_mask
            and cache is None
            and padding_mask is None
            and attention_mask is None
        )
        mask = None
        if not (only_causal and attention_bias is None):  # Else `_attend` builds it only if its path needs it.
            query_length, key_length = ops.shape(q)[1], ops.shape(k)[2 if heads_major else 1]
            mask = merge_attention_masks(
                query_length,
                key_length,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask and (cache is None or cache_update_index is not None),
                query_start=query_start,
            )
        output, scores = self._attend(
            q, k, v, mask, attention_bias, only_causal, return_attention_scores, training, heads_major
        )
        output = _project(self.output_dense, output, input_dims=2)  # (B, T, C)
        if query_mask is not None:
            set_keras_mask(output, query_mask)
        results = (output,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _attend(self, q, k, v, mask, bias, only_causal, return_scores, training, heads_major=False):
        """softmax(q k^T * scale + bias) v for (B, T, H, D) q; k, v (B, S, K, D), or (B, K, S, D) if `heads_major`."""
        scale = self.scale if self.scale is not None else 1.0 / self.head_dim**0.5
        use_dropout = self.dropout > 0 and training
        fused = self.fused_attention
        fused = _fused_attention_is_faster() if fused is None else fused
        if not return_scores and not use_dropout and fused:
            if bias is not None and mask is not None:
                # The fused op takes a bias or a mask, not both: fold the mask in.
                bias = ops.where(mask[:, None], bias, _large_negative(q.dtype))
                mask = None
            if heads_major:  # The fused op takes (B, S, K, D); on torch a view of the same memory.
                k, v = ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3))
            output = ops.dot_product_attention(
                q,
                k,
                v,
                bias=None if bias is None else ops.cast(bias, q.dtype),
                mask=None if (mask is None or only_causal) else mask[:, None],  # (B, 1, T, S)
                scale=scale,
                is_causal=only_causal and bias is None,
                # On torch SDPA picks flash attention itself where it can. Keras's own
                # check (None) builds `SDPAParams`: a graph break under `torch.compile`,
                # and host time per layer and token when eager (batch-1 greedy
                # generation on 2 CPU cores: 246 -> 291 new tokens/s).
                flash_attention=False if keras.backend.backend() == "torch" else None,
            )
            return output, None

        groups = self.num_heads // self.num_key_value_heads
        if groups > 1:
            k = ops.repeat(k, groups, axis=1 if heads_major else 2)  # (B, H, S, D) or (B, S, H, D)
            v = ops.repeat(v, groups, axis=1 if heads_major else 2)
        if heads_major:
            return self._explicit_attention(q, k, v, mask, bias, scale, training, "bhsd")
        blocks = causal_query_blocks(q.shape[1], k.shape[1])
        if only_causal and bias is None and not return_scores and blocks > 1:
            # Queries [start, end) see only keys [0, end); the last block takes any remainder.
            length = q.shape[1]
            size = length // blocks
            outputs = []
            for i in range(blocks):
                start, end = i * size, length if i == blocks - 1 else (i + 1) * size
                block_mask = merge_attention_masks(end - start, end, use_causal_mask=True, query_start=start)
                output, _ = self._explicit_attention(
                    q[:, start:end], k[:, :end], v[:, :end], block_mask, None, scale, training
                )  # (B, b, H, D)
                outputs.append(output)
            return ops.concatenate(outputs, axis=1), None  # (B, T, H, D)
        if mask is None and only_causal:
            mask = merge_attention_masks(
                ops.shape(q)[1], ops.shape(k)[1], use_causal_mask=True
            )
        return self._explicit_attention(q, k, v, mask, bias, scale, training)

    def _explicit_attention(self, q, k, v, mask, bias, scale, training, kv_layout="bshd"):
        """einsum + softmax + einsum on (B, T, H, D) q and k, v in `kv_layout` ("bshd" or "bhsd")."""
        if kv_layout == "bhsd":
            # Keys on the left: XLA on CPU takes a left operand contracted on its
            # last axis as it lies, but copied a right one into (B, H, D, S).
            scores = ops.transpose(ops.einsum("bhsd,bthd->bhst", k, q), (0, 1, 3, 2))  # (B, H, T, S)
        else:
            scores = ops.einsum("bthd,bshd->bhts", q, k)  # (B, H, T, S)
        # Softmax in float32 even under mixed precision.
        scores = ops.cast(scores, "float32") * scale
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")
        if mask is not None:
            scores = ops.where(mask[:, None], scores, _large_negative("float32"))
        if scores.shape[-1] == 1:
            # One key, as in a one-token call: softmax is exp(s - s), NaN kept.
            # Keras's softmax warns over an axis of size 1 ("a sigmoid?").
            probabilities = ops.exp(scores - scores)  # (B, H, T, 1)
        else:
            probabilities = ops.softmax(scores, axis=-1)  # (B, H, T, S)
        dropped = self.probability_dropout(
            ops.cast(probabilities, self.compute_dtype), training=training
        )
        output = ops.einsum(f"bhts,{kv_layout}->bthd", dropped, v)  # (B, T, H, D)
        return output, probabilities

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "scale": self.scale,
                "use_rotary": self.use_rotary,
                "rotary_max_wavelength": self.rotary_max_wavelength,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

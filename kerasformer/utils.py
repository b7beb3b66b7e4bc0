"""Looking inside a model: parameter accounting and attention / position plots."""

import keras
import numpy as np

from kerasformer.checks import check_int
from kerasformer.layers import (
    FeedForward,
    MultiHeadAttention,
    PositionEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
)
from kerasformer.layers.embedding import TokenEmbedding

CATEGORIES = ("embedding", "attention", "feedforward", "normalization", "head", "other")
_CATEGORY_OF_LAYER = (
    (MultiHeadAttention, "attention"),
    (FeedForward, "feedforward"),
    ((TokenEmbedding, PositionEmbedding, RelativePositionBias, keras.layers.Embedding), "embedding"),
    ((keras.layers.LayerNormalization, keras.layers.RMSNormalization), "normalization"),
)


def _category(layer):
    for layer_type, category in _CATEGORY_OF_LAYER:
        if isinstance(layer, layer_type):
            return category
    return None


def parameter_breakdown(model, print_table=True):
    """Counts the parameters of `model` (or any layer) by role.

    Attention projections, feed-forward networks, embeddings (token, position,
    segment, relative bias), normalization, and heads (any other weights of
    the top model: LM head, pooler, classifier, MLM head). Shared weights
    (a tied head) count once, where they are defined.

    Returns:
        A dict `{category: count}` with a "total" entry; prints it as a table
        unless `print_table=False`.
    """
    counts = dict.fromkeys(CATEGORIES, 0)
    seen = set()

    def count(layer, category):
        for weight in layer.weights:
            if id(weight) not in seen:
                seen.add(id(weight))
                counts[category] += int(np.prod(weight.shape))

    def visit(layer, inside_block):
        category = _category(layer)
        if category is not None:
            count(layer, category)
            return
        children = list(layer._flatten_layers(include_self=False, recursive=False))
        for child in children:
            visit(child, inside_block or _is_block(layer))
        # Weights a layer owns directly (not through children): heads, or
        # "other" inside blocks.
        own = [w for w in layer._trainable_variables + layer._non_trainable_variables]
        if own:
            for weight in own:
                if id(weight) not in seen:
                    seen.add(id(weight))
                    counts["other" if inside_block else "head"] += int(np.prod(weight.shape))

    visit(model, False)
    counts["total"] = sum(counts[c] for c in CATEGORIES)
    if print_table:
        width = max(len(f"{counts['total']:,}"), 5)
        print(f"{'part':<15}{'parameters':>{width + 2}}  share")
        for name in (*CATEGORIES, "total"):
            share = counts[name] / max(counts["total"], 1)
            print(f"{name:<15}{counts[name]:>{width + 2},}  {share:6.1%}")
    return counts


def _is_block(layer):
    from kerasformer.layers import DecoderBlock, EncoderBlock

    return isinstance(layer, (EncoderBlock, DecoderBlock))


def _block_inputs(model, block):
    """The arguments `block` receives inside `model`, as symbolic tensors."""
    nodes = [node for node in block._inbound_nodes if node.operation is block]
    if not nodes:
        raise ValueError(f"`layer` {block.name!r} is not called inside this model's graph.")
    return nodes[0].arguments


def attention_scores(model, inputs, layer):
    """The attention probabilities of block `layer` for `inputs`.

    Args:
        model: a functional model built from `EncoderBlock`/`DecoderBlock`s.
        inputs: what `model` takes.
        layer: the block's index among the model's blocks, or its name.

    Returns:
        `(B, H, T, S)` self-attention probabilities as numpy (a decoder block
        with cross-attention returns self-attention's).
    """
    blocks = [sub for sub in model._flatten_layers(include_self=False) if _is_block(sub)]
    if isinstance(layer, bool):  # An int to Python, but no block's index.
        raise ValueError(f"`layer` must be a block's index or name, got {layer!r}.")
    if isinstance(layer, int):
        if not -len(blocks) <= layer < len(blocks):
            raise ValueError(f"`layer` must be in [0, {len(blocks)}), got {layer}.")
        block = blocks[layer]
    else:
        names = [b.name for b in blocks]
        if layer not in names:
            raise ValueError(f"`layer` {layer!r} is not one of {names}.")
        block = blocks[names.index(layer)]
    arguments = _block_inputs(model, block)
    # Compute the block's own inputs, then call it again asking for its scores.
    probe = keras.Model(model.input, arguments.keras_tensors)
    if hasattr(model, "complete_inputs"):  # A BERT's segment ids may be left out.
        inputs = model.complete_inputs(inputs)
    values = probe(inputs)
    values = values if isinstance(values, (list, tuple)) else [values]
    args, kwargs = arguments.fill_in({id(t): v for t, v in zip(arguments.keras_tensors, values)})
    outputs = block(*args, **{**kwargs, "return_attention_scores": True})
    return keras.ops.convert_to_numpy(outputs[1])


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the install.
        raise ImportError("Plots need matplotlib: pip install 'kerasformer[plot]'.") from error
    return plt


def plot_attention(model, inputs, layer, head, path, example=0, tokens=None):
    """Draws the attention heatmap of one head of block `layer` into a PNG file.

    Rows are queries, columns keys; a GPT shows its causal triangle.

    Args:
        model, inputs, layer: as `attention_scores`.
        head: the head's index.
        path: the PNG file to write.
        example: which example of the batch.
        tokens: optional labels for the positions.

    Returns:
        The `(T, S)` array that was plotted.
    """
    scores = attention_scores(model, inputs, layer)
    check_int("head", head, 0, scores.shape[1])
    check_int("example", example, 0, scores.shape[0])
    matrix = scores[example, head]
    if tokens is not None and len(tokens) != matrix.shape[1]:  # Else the labels would sit on the wrong positions.
        raise ValueError(f"`tokens` must hold one label per position ({matrix.shape[1]}), got {len(tokens)}.")
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 5))
    image = axis.imshow(matrix, cmap="viridis", vmin=0.0, vmax=max(float(matrix.max()), 1e-9))
    axis.set_xlabel("key position")
    axis.set_ylabel("query position")
    axis.set_title(f"{model.name}: layer {layer}, head {head}")
    if tokens is not None:
        axis.set_xticks(range(len(tokens)), tokens, rotation=90)
        axis.set_yticks(range(len(tokens)), tokens)
    figure.colorbar(image, ax=axis, label="attention weight")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return matrix


def plot_position_encoding(path, length=128, width=64, kind="sinusoidal"):
    """Draws a position encoding into a PNG file.

    Args:
        path: the PNG file to write.
        length: number of positions.
        width: model (sinusoidal) or head (rotary) width.
        kind: "sinusoidal" (the encoding added to embeddings) or "rotary"
            (the rotation of an all-ones query vector at each position).

    Returns:
        The `(length, width)` array that was plotted.
    """
    if kind == "sinusoidal":
        values = SinusoidalPositionEncoding()(np.zeros((1, length, width), "float32"))
    elif kind == "rotary":
        values = RotaryEmbedding()(np.ones((1, length, 1, width), "float32"))[:, :, 0]
    else:
        raise ValueError(f"Unknown `kind` {kind!r}; expected 'sinusoidal' or 'rotary'.")
    matrix = keras.ops.convert_to_numpy(values)[0]
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    image = axis.imshow(matrix, cmap="RdBu", aspect="auto", vmin=-1.0, vmax=1.0)
    axis.set_xlabel("dimension")
    axis.set_ylabel("position")
    axis.set_title(f"{kind} position encoding")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return matrix

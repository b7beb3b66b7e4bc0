import numpy as np
import pytest

from kerasformer.layers import EncoderBlock
from kerasformer.models import BERTMaskedLM, from_preset
from kerasformer.utils import (
    attention_scores,
    parameter_breakdown,
    plot_attention,
    plot_position_encoding,
)
from tests.conftest import to_numpy


def test_breakdown_of_a_transformer_base_layer_is_two_thirds_feedforward(capsys):
    block = EncoderBlock(num_heads=8, intermediate_dim=2048)
    block.build((None, None, 512))
    counts = parameter_breakdown(block)
    d, d_ff = 512, 2048
    assert counts["attention"] == 4 * d * d + 4 * d
    assert counts["feedforward"] == 2 * d * d_ff + d_ff + d
    assert counts["normalization"] == 2 * 2 * d
    share = counts["feedforward"] / counts["total"]
    assert share == pytest.approx(2 / 3, abs=1e-3)
    assert "feedforward" in capsys.readouterr().out


def test_breakdown_adds_up_and_counts_a_tied_embedding_once():
    model = BERTMaskedLM(from_preset("bert-tiny"))
    counts = parameter_breakdown(model, print_table=False)
    assert counts["total"] == model.count_params()
    backbone = model.backbone
    assert counts["embedding"] == sum(
        int(np.prod(w.shape))
        for layer in (backbone.token_embedding, backbone.position_embedding, backbone.segment_embedding)
        for w in layer.weights
    )
    assert counts["head"] > 0 and counts["other"] == 0


def test_plot_attention_writes_the_real_causal_scores(tmp_path):
    model = from_preset("gpt2-tiny", num_layers=2)
    ids = np.arange(1, 11)[None]
    path = tmp_path / "attention.png"
    plotted = plot_attention(model, ids, layer=1, head=2, path=path)
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The plotted matrix is layer 1's head 2, recomputed independently here.
    block = model.blocks[1]
    hidden = model.token_embedding(ids) + model.position_embedding(model.token_embedding(ids))
    hidden = model.blocks[0](hidden)
    _, scores = block(hidden, return_attention_scores=True)
    np.testing.assert_allclose(plotted, to_numpy(scores)[0, 2], atol=1e-6)
    assert np.all(plotted[np.triu_indices(10, 1)] == 0)  # The causal triangle.
    np.testing.assert_allclose(plotted.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(layer=0, head=0, example=3), "`example` must be an int in \\[0, 1\\), got 3"),
        (dict(layer=0, head=-1), "`head` must be an int in \\[0, 4\\), got -1"),
        (dict(layer=0, head=0, tokens=["a", "b"]), "`tokens` must hold one label per position \\(5\\), got 2"),
        (dict(layer=True, head=0), "`layer` must be a block's index or name, got True"),
    ],
)
def test_plot_attention_names_bad_arguments(arguments, message, tmp_path):
    # An example past the batch had raised numpy's IndexError; two labels for
    # five positions were drawn on the first two; True was read as layer 1.
    model = from_preset("gpt2-tiny", num_layers=2)
    with pytest.raises(ValueError, match=message):
        plot_attention(model, np.arange(1, 6)[None], path=tmp_path / "attention.png", **arguments)
    assert not (tmp_path / "attention.png").exists()


def test_attention_scores_of_an_encoder_decoder_block():
    model = from_preset("t5-tiny")
    inputs = {"encoder_token_ids": np.array([[5, 6, 7, 0]]), "decoder_token_ids": np.array([[0, 5, 6]])}
    scores = attention_scores(model, inputs, "decoder_block_1")
    assert scores.shape == (1, 4, 3, 3)
    scores = attention_scores(model, inputs, 0)  # encoder_block_0: the padded key gets nothing.
    assert scores.shape == (1, 4, 4, 4) and np.all(scores[..., 3] == 0)
    with pytest.raises(ValueError, match="layer"):
        attention_scores(model, inputs, 99)


def test_attention_scores_of_a_bert_given_token_ids_alone():
    model = from_preset("bert-tiny")
    ids = np.array([[2, 5, 6, 7, 0]])
    scores = attention_scores(model, ids, 1)  # One segment, as the model itself takes them.
    expected = attention_scores(model, {"token_ids": ids, "segment_ids": np.zeros_like(ids)}, 1)
    np.testing.assert_allclose(scores, expected, atol=1e-6)
    assert scores.shape == (1, 2, 5, 5) and np.all(scores[..., 4] == 0)  # bert-tiny: 2 heads; the padded key gets nothing.


@pytest.mark.parametrize("kind", ["sinusoidal", "rotary"])
def test_plot_position_encoding_writes_the_encoding(kind, tmp_path):
    path = tmp_path / f"{kind}.png"
    plotted = plot_position_encoding(path, length=32, width=16, kind=kind)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotted.shape == (32, 16)
    if kind == "sinusoidal":
        assert plotted[5, 0] == pytest.approx(np.sin(5.0), abs=1e-5)
        assert plotted[5, 1] == pytest.approx(np.cos(5.0), abs=1e-5)
    else:  # Rotating ones: x cos + rotate_half(x) sin, first half is cos - sin.
        assert plotted[5, 0] == pytest.approx(np.cos(5.0) - np.sin(5.0), abs=1e-5)
    with pytest.raises(ValueError, match="kind"):
        plot_position_encoding(path, kind="alibi")

"""TokenEmbedding and the tied LM head against numpy written here."""

import keras
import numpy as np
import pytest

from kerasformer.layers.embedding import TokenEmbedding, tied_logits
from tests.conftest import random_inputs, to_numpy, value_and_gradients


def test_lookup_and_reverse_match_numpy():
    layer = TokenEmbedding(11, 6, scale=2.0)
    ids = np.array([[0, 3, 10], [5, 5, 1]], "int32")
    looked_up = to_numpy(layer(ids))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(looked_up, table[ids] * 2.0, rtol=1e-6)
    hidden = random_inputs(2, 3, 6)
    np.testing.assert_allclose(to_numpy(layer(hidden, reverse=True)), hidden @ table.T, rtol=1e-5, atol=1e-6)
    # A loop passes the transposed table it computed once (generation).
    transposed = layer.transposed_table()
    np.testing.assert_array_equal(to_numpy(transposed), table.T)
    np.testing.assert_allclose(
        to_numpy(layer(hidden, reverse=True, transposed_table=transposed)), hidden @ table.T, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_tied_logits_value_and_gradients_match_numpy(compiled):
    """Compiled is XLA on TF, where the table's gradient has its own formula (see embedding.py)."""
    hidden, table, upstream = random_inputs(5, 4, seed=1), random_inputs(9, 4, seed=2), random_inputs(5, 9, seed=3)
    value, (hidden_gradient, table_gradient) = value_and_gradients(
        lambda h, t: keras.ops.sum(keras.ops.multiply(tied_logits(h, t), upstream)), hidden, table, compiled=compiled
    )
    np.testing.assert_allclose(value, np.sum(hidden @ table.T * upstream), rtol=1e-5)
    np.testing.assert_allclose(hidden_gradient, upstream @ table, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table_gradient, upstream.T @ hidden, rtol=1e-5, atol=1e-6)


def test_out_of_range_ids_are_refused_with_the_vocabulary_size():
    layer = TokenEmbedding(11, 6)
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        layer(np.array([[1, 11]], "int32"))


def test_round_trips_through_config():
    layer = TokenEmbedding(11, 6, scale=3.0, embeddings_initializer="zeros", name="tokens")
    clone = TokenEmbedding.from_config(layer.get_config())
    assert (clone.vocab_size, clone.hidden_dim, clone.scale, clone.name) == (11, 6, 3.0, "tokens")
    assert isinstance(clone.embeddings_initializer, keras.initializers.Zeros)


def test_is_public_and_names_bad_sizes():
    from kerasformer.layers import TokenEmbedding as Public

    assert Public is TokenEmbedding  # Building a tied-head GPT from the layers needs it.
    with pytest.raises(ValueError, match=r"`vocab_size` must be a positive int, got 0"):
        TokenEmbedding(0, 16)  # Had built an empty table.
    with pytest.raises(ValueError, match=r"`hidden_dim` must be a positive int, got '16'"):
        TokenEmbedding(100, "16")

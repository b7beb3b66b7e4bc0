"""The whole `Transformer` equals the paper's model written with `torch.nn`.

The blocks are compared with torch's layers in tests/layers/blocks_test.py;
this checks the model around them: one embedding shared by source and target
and scaled by sqrt(d_model), the sinusoidal encoding of section 3.5 (written
here in numpy), source padding masked in the encoder and in cross-attention,
and the output projection tied to the embedding.
"""

import math

import numpy as np
import pytest
import torch

from kerasformer.models import Transformer
from tests.conftest import to_numpy
from tests.layers.blocks_test import _tensor, copy_decoder_block, copy_encoder_block, copy_norm

V, N, H, C, F = 50, 2, 4, 32, 64


def paper_position_encoding(length, width):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    position = np.arange(length)[:, None]
    frequency = 1.0 / 10000 ** (np.arange(0, width, 2) / width)
    encoding = np.zeros((length, width))
    encoding[:, 0::2] = np.sin(position * frequency)
    encoding[:, 1::2] = np.cos(position * frequency)
    return torch.tensor(encoding, dtype=torch.float32)


def torch_stacks(model, norm_first):
    """`torch.nn` encoder and decoder stacks holding the model's weights."""
    options = dict(d_model=C, nhead=H, dim_feedforward=F, dropout=0.0, batch_first=True, norm_first=norm_first)
    # A pre-norm stack ends with a norm of its own; a post-norm one with its last block's.
    encoder = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(**options), N, norm=torch.nn.LayerNorm(C) if norm_first else None, enable_nested_tensor=False
    )
    decoder = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**options), N, norm=torch.nn.LayerNorm(C) if norm_first else None)
    for block, layer in zip(model.encoder_blocks, encoder.layers):
        copy_encoder_block(block, layer)
    for block, layer in zip(model.decoder_blocks, decoder.layers):
        copy_decoder_block(block, layer)
    if norm_first:
        copy_norm(model.encoder_final_norm, encoder.norm)
        copy_norm(model.decoder_final_norm, decoder.norm)
    return encoder.eval(), decoder.eval()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_transformer_equals_the_paper_model_in_torch(norm_first):
    model = Transformer(V, num_layers=N, num_heads=H, hidden_dim=C, intermediate_dim=F, dropout=0.1, norm_first=norm_first)
    source = np.array([[5, 9, 13, 17, 21, 25], [7, 11, 15, 0, 0, 0]])  # The second row is padded (id 0).
    target = np.array([[1, 4, 8, 12, 16], [1, 6, 10, 14, 3]])
    ours = to_numpy(model({"encoder_token_ids": source, "decoder_token_ids": target}))  # Inference: no dropout.

    encoder, decoder = torch_stacks(model, norm_first)
    table = _tensor(model.source_embedding.embeddings)  # (V, C), shared by source, target and output
    padding = torch.tensor(source == 0)  # True where a source key is left out

    def embed(ids):
        return table[torch.tensor(ids)] * math.sqrt(C) + paper_position_encoding(ids.shape[1], C)

    with torch.no_grad():
        memory = encoder(embed(source), src_key_padding_mask=padding)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        hidden = decoder(embed(target), memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=padding)
        expected = (hidden @ table.T).numpy()  # (B, T, V)
    # Every weight was copied: the stacks and the one shared table make up the model.
    assert model.target_embedding is model.source_embedding
    assert model.count_params() == sum(p.numel() for p in (*encoder.parameters(), *decoder.parameters())) + V * C
    np.testing.assert_allclose(ours, expected, atol=1e-4)

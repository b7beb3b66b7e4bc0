"""Transformer building blocks, each a serializable Keras layer."""

from kerasformer.layers.attention import MultiHeadAttention, merge_attention_masks
from kerasformer.layers.blocks import DecoderBlock, EncoderBlock
from kerasformer.layers.embedding import TokenEmbedding
from kerasformer.layers.feedforward import FeedForward
from kerasformer.layers.positions import (
    PositionEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
)
from kerasformer.layers.residual import Residual

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RelativePositionBias",
    "Residual",
    "RotaryEmbedding",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "merge_attention_masks",
]

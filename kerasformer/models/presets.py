"""Named architectures: the published sizes, and `*-tiny` ones for tests and demos.

Presets are architectures only (randomly initialized); to start from trained
weights, load a local checkpoint with `kerasformer.convert.from_huggingface`.
"""

from kerasformer.models.base import unknown_arguments_message
from kerasformer.models.bert import BERT
from kerasformer.models.gpt import GPT
from kerasformer.models.t5 import T5
from kerasformer.models.transformer import Transformer

PRESETS = {
    # GPT-2 (Radford et al., 2019): 124M and 355M parameters.
    "gpt2-small": (GPT, dict(vocab_size=50257, num_layers=12, num_heads=12, hidden_dim=768, max_sequence_length=1024, dropout=0.1)),
    "gpt2-medium": (GPT, dict(vocab_size=50257, num_layers=24, num_heads=16, hidden_dim=1024, max_sequence_length=1024, dropout=0.1)),
    "gpt2-tiny": (GPT, dict(vocab_size=512, num_layers=2, num_heads=4, hidden_dim=64, max_sequence_length=128, dropout=0.0)),
    # BERT (Devlin et al., 2019), uncased WordPiece vocabulary: 110M and 335M.
    "bert-base": (BERT, dict(vocab_size=30522, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, max_sequence_length=512)),
    "bert-large": (BERT, dict(vocab_size=30522, num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096, max_sequence_length=512)),
    "bert-tiny": (BERT, dict(vocab_size=512, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128, max_sequence_length=128, dropout=0.0)),
    # T5 v1.0 (Raffel et al., 2020): 60M and 220M.
    "t5-small": (T5, dict(vocab_size=32128, num_layers=6, num_heads=8, hidden_dim=512, intermediate_dim=2048, head_dim=64)),
    "t5-base": (T5, dict(vocab_size=32128, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, head_dim=64)),
    "t5-tiny": (T5, dict(vocab_size=512, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128, head_dim=16, dropout=0.0)),
    # "Attention Is All You Need", table 3; 37000 shared BPE tokens (EN-DE).
    "transformer-base": (Transformer, dict(vocab_size=37000, num_layers=6, num_heads=8, hidden_dim=512, intermediate_dim=2048, dropout=0.1)),
    "transformer-big": (Transformer, dict(vocab_size=37000, num_layers=6, num_heads=16, hidden_dim=1024, intermediate_dim=4096, dropout=0.3)),
    "transformer-tiny": (Transformer, dict(vocab_size=512, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128, dropout=0.0)),
}


def preset_names():
    return sorted(PRESETS)


def from_preset(name, **overrides):
    """Builds the model of preset `name`; `overrides` replace any of its arguments.

    >>> model = from_preset("gpt2-tiny", vocab_size=100)
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; expected one of {preset_names()}.")
    builder, arguments = PRESETS[name]
    message = unknown_arguments_message(builder, overrides)  # Before building: `kerasformer train --model` names it.
    if message:
        raise ValueError(message)
    return builder(**{**arguments, **overrides})

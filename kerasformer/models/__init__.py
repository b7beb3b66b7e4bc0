"""Ready model builders: GPT, BERT, T5 and the original Transformer."""

from kerasformer.models.bert import BERT, BERTClassifier, BERTMaskedLM
from kerasformer.models.gpt import GPT
from kerasformer.models.presets import PRESETS, from_preset, preset_names
from kerasformer.models.t5 import T5
from kerasformer.models.transformer import Transformer

__all__ = [
    "BERT",
    "BERTClassifier",
    "BERTMaskedLM",
    "GPT",
    "PRESETS",
    "T5",
    "Transformer",
    "from_preset",
    "preset_names",
]

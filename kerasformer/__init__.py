"""kerasformer: Transformer layers and models for Keras 3 (TensorFlow, JAX, PyTorch).

    kerasformer.layers    building blocks
    kerasformer.models    GPT, BERT, T5, Transformer, presets
    kerasformer.losses    TokenCrossEntropy
    kerasformer.optimizers AdamW (Keras's, with a fused update on torch)
    kerasformer.generate  KV-cached generation    (also the module of that name)
    kerasformer.export    SavedModel export       (also the module of that name)
"""

from kerasformer import layers, losses, models, optimizers  # Importing registers their classes for loading.
from kerasformer.export import export
from kerasformer.generate import generate

__version__ = "0.1.0"
__all__ = ["export", "generate", "layers", "losses", "models", "optimizers"]

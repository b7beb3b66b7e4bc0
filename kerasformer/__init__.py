"""kerasformer: Transformer layers and models for Keras 3 (TensorFlow, JAX, PyTorch)."""

from kerasformer import layers

__version__ = "0.1.0"

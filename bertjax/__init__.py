"""bertjax: pretraining the BERT family of encoders in JAX/Flax, TPU first."""

__version__ = "0.1.0"

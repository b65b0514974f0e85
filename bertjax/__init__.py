"""bertjax: pretraining the BERT family of encoders in JAX/Flax, TPU first."""

__version__ = "0.1.0"


def __getattr__(name):
  # ``bertjax.load`` imports JAX and the models only when first used, so that
  # ``import bertjax`` stays light.
  if name == "load":
    from bertjax.api import load
    return load
  raise AttributeError(f"module 'bertjax' has no attribute {name!r}")

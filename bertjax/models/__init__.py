"""The model registry: ``get_model(config)`` builds the module ``config.model`` names.

Each architecture lives in its own file and registers a builder
``(config, dtype) -> nn.Module`` in ``_BUILDERS``; the train loop only ever
calls ``get_model`` and ``model.apply``.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.models import albert
from bertjax.models import bert
from bertjax.models import deberta
from bertjax.models import electra
from bertjax.models import spanbert
from bertjax.models import xlnet

_BUILDERS: dict[str, Callable[[ml_collections.ConfigDict, Any], nn.Module]] = {
    "albert": albert.from_config,
    "bert": bert.from_config,
    "deberta": deberta.from_config,
    "electra": electra.from_config,
    "spanbert": spanbert.from_config,
    "xlnet": xlnet.from_config,
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def get_model(config: ml_collections.ConfigDict) -> nn.Module:
  """Returns the (unbound) flax module for ``config.model``.

  Raises:
    ValueError: for an unknown ``config.model`` or ``config.dtype``.
  """
  if config.model not in _BUILDERS:
    raise ValueError(
        f"Unknown model {config.model!r}; set --config.model to one of "
        f"{', '.join(sorted(_BUILDERS))}.")
  if config.dtype not in _DTYPES:
    raise ValueError(
        f"Unknown dtype {config.dtype!r}; set --config.dtype to one of "
        f"{', '.join(_DTYPES)}.")
  return _BUILDERS[config.model](config, _DTYPES[config.dtype])


def position_table_rows(config: Any) -> int | None:
  """The rows of the learned absolute position table the model reads at its
  ``positions`` input, which bound ``seq_len``; None for a model without one,
  whose rows may be longer than ``max_position_embeddings``: XLNet (sinusoids
  of relative distances) and DeBERTa encoders without absolute positions
  (``deberta.reads_absolute_positions``).

  Args:
    config: a ConfigDict or an encoder's saved fields (a mapping).
  """
  kind = config.get("model")
  if kind == "xlnet":
    return None
  if kind == "deberta" or (kind == "electra"
                           and config.get("encoder", "bert") == "deberta"):
    # ELECTRA's DeBERTa towers have no enhanced mask decoder.
    if not deberta.reads_absolute_positions(config, emd=kind == "deberta"):
      return None
  return int(config["max_position_embeddings"])


def has_sentence_head(model: nn.Module) -> bool:
  """Whether ``model`` (from ``get_model``) returns ``nsp_logits``: a pooler
  and a two-way sentence head (NSP or SOP)."""
  return bool(getattr(model, "sentence_head", False))


def count_params(params: Any) -> int:
  """Number of scalars in a parameter tree (boxed or not, arrays or shapes)."""
  return int(sum(np.prod(leaf.shape, dtype=np.int64)
                 for leaf in jax.tree.leaves(params)))

"""Pretraining objectives, chosen by name with ``config.objective``.

Every objective implements ``base.Objective``: ``corrupt`` a Batch into model
inputs and targets inside the jitted step, and score the model's outputs with
``loss``. Add a variant by writing its module and registering its class here.
"""

from __future__ import annotations

from typing import Any, Callable

from bertjax.objectives import albert
from bertjax.objectives import base
from bertjax.objectives import bert
from bertjax.objectives import electra
from bertjax.objectives import ernie
from bertjax.objectives import mlm_only
from bertjax.objectives import spanbert
from bertjax.objectives import unilm
from bertjax.objectives import xlnet

_REGISTRY: dict[str, Callable[[Any], base.Objective]] = {
    "albert": albert.AlbertObjective,
    "bert": bert.BertObjective,
    "electra": electra.ElectraObjective,
    "ernie": ernie.ErnieObjective,
    "mlm_only": mlm_only.MlmOnlyObjective,
    "spanbert": spanbert.SpanBertObjective,
    "unilm": unilm.UnilmObjective,
    "xlnet": xlnet.XLNetObjective,
}


def get_objective(config: Any) -> base.Objective:
  """Builds the objective named by ``config.objective`` (checks its fields)."""
  name = config.objective
  if name not in _REGISTRY:
    raise ValueError(
        f"Unknown objective {name!r}; set --config.objective to one of "
        f"{', '.join(sorted(_REGISTRY))}.")
  return _REGISTRY[name](config)

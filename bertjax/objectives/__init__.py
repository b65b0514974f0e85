"""Pretraining objectives, chosen by name with ``config.objective``.

Every objective implements ``base.Objective``: ``corrupt`` a Batch into model
inputs and targets inside the jitted step, and score the model's outputs with
``loss``. Add a variant by writing its module and registering its class here.

Every objective class also names what it needs of the model: ``models``, the
``config.model`` values whose inputs and outputs it matches (ELECTRA calls the
generator, XLNet feeds two streams, UniLM an attention mask only BERT reads,
SpanBERT scores the SBO head), and ``needs_sentence_head`` where its loss reads
``nsp_logits``. ``model_mismatch`` compares them with the model built.
"""

from __future__ import annotations

from typing import Any, Callable

from bertjax import models as models_lib
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


def _objective_class(name: str) -> Callable[[Any], base.Objective]:
  if name not in _REGISTRY:
    raise ValueError(
        f"Unknown objective {name!r}; set --config.objective to one of "
        f"{', '.join(sorted(_REGISTRY))}.")
  return _REGISTRY[name]


def get_objective(config: Any) -> base.Objective:
  """Builds the objective named by ``config.objective`` (checks its fields)."""
  return _objective_class(config.objective)(config)


def models_for(objective: str) -> tuple[str, ...]:
  """The ``config.model`` values objective ``objective`` runs with."""
  return tuple(_objective_class(objective).models)


def model_mismatch(objective: str, model_name: str, model: Any) -> str | None:
  """Why objective ``objective`` cannot train ``model``, a module built for
  ``config.model=model_name``: a clause ('it runs only with ...'), or None."""
  runs_with = [repr(m) for m in models_for(objective)]
  if model_name not in models_for(objective):
    last = runs_with.pop()
    return f"it runs only with {', '.join(runs_with) + ' or ' if runs_with else ''}{last}"
  if _objective_class(objective).needs_sentence_head and not models_lib.has_sentence_head(model):
    return "its sentence-level task needs a sentence head, which this model is built without"
  return None

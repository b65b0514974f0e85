"""Training figures per corpus of a mixture (``config.mixture``).

A mixture's batches mix its corpora, so the training loss alone does not
say how each one is learnt. For a mixture, the training iterator labels every
row with the corpus its (first) document comes from (``labelled``: a one-hot
``corpus`` field [B, C], from the row's ``example_id`` and
``mixture.MixedSource.corpora``; a row of the full_sentences or stream layouts
that crosses into another document counts toward its first token's corpus).
The train step splits that field off before masking and sums the masked-LM
scores of each corpus's rows (``mlm_sums``: every objective's masked-LM part,
the generator's for ELECTRA); the logged metrics then have, per corpus label
(as evaluation names them), ``<label>/mlm_loss``, ``<label>/mlm_accuracy``
and ``<label>/mlm_share`` (its part of the step's predicted slots), so that
sum over corpora of share x loss is the step's ``mlm_loss``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.objectives import mlm

FIELD = "corpus"
# Per-corpus sums in the step's metrics: {PREFIX + name: (sums [C], counts [C])}.
PREFIX = "by_corpus/"


class LabelledIterator:
  """A training iterator whose batches gain the one-hot ``FIELD`` [B, C];
  ``get_state``/``set_state`` are the wrapped iterator's."""

  def __init__(self, parent: Any, source: Any, num_corpora: int):
    self._parent, self._source, self._num = parent, source, num_corpora

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self._parent))
    docs = batch["example_id"][:, 0]
    onehot = np.zeros((len(docs), self._num), np.float32)
    onehot[np.arange(len(docs)), self._source.corpora(docs)] = 1.0
    onehot[~batch["example_mask"].astype(bool)] = 0.0
    batch[FIELD] = onehot
    return batch

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)


def labelled(train_iter: Any, source: Any, num_corpora: int) -> Any:
  """``train_iter`` with corpus labels where ``source`` is a mixture's pass
  of several corpora, else ``train_iter`` itself."""
  if num_corpora < 2 or not hasattr(source, "corpora"):
    return train_iter
  return LabelledIterator(train_iter, source, num_corpora)


def split(batch: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
  """(the batch without ``FIELD``, the field or None)."""
  batch = dict(batch)
  return batch, batch.pop(FIELD, None)


def mlm_sums(outputs: Mapping[str, jax.Array], targets: Mapping[str, jax.Array],
             onehot: jax.Array | None) -> dict[str, tuple[jax.Array, jax.Array]]:
  """Per corpus: masked-LM loss and accuracy sums over its rows' used slots,
  and those slots against all (``PREFIX`` names, [C] arrays); {} without
  labels or a masked-LM output. Not differentiated."""
  if onehot is None or "mlm_logits" not in outputs or "mlm_targets" not in targets:
    return {}
  nll, correct = jax.lax.stop_gradient(
      mlm.slot_scores(outputs["mlm_logits"], targets["mlm_targets"]))
  weights = targets["mlm_weights"].astype(jnp.float32)
  per_corpus = lambda x: jnp.einsum("bp,bc->c", x * weights, onehot)
  counts = per_corpus(jnp.ones_like(nll))
  return {PREFIX + "mlm_loss": (per_corpus(nll), counts),
          PREFIX + "mlm_accuracy": (per_corpus(correct), counts),
          PREFIX + "mlm_share": (counts, jnp.broadcast_to(jnp.sum(counts), counts.shape))}


def expand(sums: Mapping[str, Any], labels: Sequence[str]) -> dict[str, Any]:
  """Host side: the ``PREFIX`` entries of accumulated metrics as one
  (sum, count) pair per corpus, named ``<label>/<metric>``."""
  out = {}
  slots = sums.get(PREFIX + "mlm_loss")
  # A corpus with no used slot in the window (no row of it) is left out.
  present = np.asarray(slots[1]) > 0 if slots is not None else None
  for name, value in sums.items():
    if not name.startswith(PREFIX):
      out[name] = value
      continue
    total, count = (np.asarray(v) for v in value)
    for k, label in enumerate(labels):
      if present[k]:
        out[f"{label}/{name[len(PREFIX):]}"] = (total[k], count[k])
  return out

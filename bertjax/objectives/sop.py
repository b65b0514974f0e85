"""Sentence-order prediction (ALBERT): negatives are the pair swapped, in-step.

Rows of the sentence-pair layout are exactly ``[CLS] A [SEP] B [SEP] PAD...``
with B the true continuation of A (bertjax/batch.py), so the negative of a
row is ``[CLS] B [SEP] A [SEP] PAD...``: the same two segments in the wrong
order, rebuilt from ``a_lengths``/``b_lengths`` alone by ``swap_segments``
(a gather, like ``nsp.pair_with_b_from``).

Labels: 0 = "in order" (row unchanged), 1 = "swapped".
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from bertjax import batch as batch_lib
from bertjax.objectives import nsp

# Fields whose rows are rebuilt; positions and doc_ids keep their values (the
# swapped row has the same length), and so do example_id, epoch, example_mask.
_ROW_FIELDS = ("tokens", "segment_ids", "word_starts",
               "special") + batch_lib.KNOWLEDGE_FIELDS


def swap_segments(batch: Mapping[str, jax.Array],
                  swap: jax.Array) -> dict[str, jax.Array]:
  """Exchanges the A and B segments of the chosen rows.

  A row i with ``swap[i]`` becomes ``[CLS] B_i [SEP] A_i [SEP] PAD...``
  (two [SEP] between them where the row has two, ``nsp.separators``):
  tokens and word starts (and the knowledge boundaries phrase_starts,
  entity_starts) of both segments move as blocks; segment ids are 0
  up to the first [SEP] and 1 for the second segment and the last [SEP];
  special is True at CLS, both SEPs and padding; a_lengths and b_lengths are
  exchanged. Other rows are returned unchanged.

  Args:
    batch: a Batch of the sentence-pair layout; arrays [B, L] and [B].
    swap: bool [B].

  Returns:
    A new Batch dict with the same keys, shapes and dtypes.
  """
  tokens = batch["tokens"]
  t = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
  a_len = batch["a_lengths"][:, None]
  b_len = batch["b_lengths"][:, None]
  seps = nsp.separators(batch)[:, None]  # 1, or 2 for <s> A </s></s> B </s>
  second = b_len + 1 + seps  # first column of the moved A
  end = second + a_len  # the last [SEP]
  in_first = (t >= 1) & (t <= b_len)
  in_second = (t >= second) & (t < end)
  is_sep = ((t > b_len) & (t < second)) | (t == end)
  # Column of the original row that lands at t (only read inside segments).
  source = jnp.where(in_first, t + a_len + seps,
                     jnp.where(in_second, t - second + 1, t))

  def moved(name):
    return jnp.take_along_axis(batch[name], source, axis=1)

  in_text = in_first | in_second
  filler = jnp.where(t == 0, batch_lib.CLS_ID,
                     jnp.where(is_sep, batch_lib.SEP_ID, batch_lib.PAD_ID))
  rebuilt = {
      "tokens": jnp.where(in_text, moved("tokens"), filler),
      "special": ~in_text,
      "segment_ids": ((t >= second) & (t <= end)).astype(jnp.int32),
  }
  for name in ("word_starts",) + batch_lib.KNOWLEDGE_FIELDS:
    rebuilt[name] = jnp.where(in_text, moved(name), (t == 0) | is_sep)
  out = dict(batch)
  for name in _ROW_FIELDS:
    out[name] = jnp.where(swap[:, None], rebuilt[name],
                          batch[name]).astype(batch[name].dtype)
  out["a_lengths"] = jnp.where(swap, batch["b_lengths"], batch["a_lengths"])
  out["b_lengths"] = jnp.where(swap, batch["a_lengths"], batch["b_lengths"])
  return out


def make_swaps(decision_keys: jax.Array, batch: Mapping[str, jax.Array],
               swap_rate: float) -> tuple[dict[str, jax.Array], jax.Array]:
  """Swaps a random ``swap_rate`` of the real pairs (SOP negatives).

  Each real example with a non-empty B independently becomes a negative with
  probability ``swap_rate``, decided by its own key (static or dynamic like
  its mask).

  Args:
    decision_keys: [B] one key per example (``masking.example_keys``).
    batch: a Batch of the sentence-pair layout.
    swap_rate: probability of a swap, in [0, 1].

  Returns:
    (the rebuilt Batch, sop_labels int32 [B]: 1 = swapped, 0 = in order).
  """
  wants = jax.vmap(lambda k: jax.random.bernoulli(k, swap_rate))(decision_keys)
  swap = wants & batch["example_mask"] & (batch["b_lengths"] > 0)
  return swap_segments(batch, swap), swap.astype(jnp.int32)


"""Next-sentence prediction: negatives made inside the step, and the NSP loss.

Rows of the sentence-pair layout are exactly ``[CLS] A [SEP] B [SEP] PAD...``
with ``a_lengths``/``b_lengths`` (bertjax/batch.py), so a negative is an array
transform: keep the row's A, and fill its B with text of another example of
the batch that comes from a different document. ``pair_with_b_from`` is that
pure rebuild; sentence-order variants (ALBERT's SOP) sit next to it.

A negative keeps its row's own B length (as BERT's data script aims a random
B at the same target length as a true one): the borrowed text is the
partner's passage, A then B, read from its start. Borrowing only the
partner's B, cut to fit, made negatives shorter than positives -- a positive
row fills its target length, a negative's total was A_i + B_p -- and on the
demo corpus padding alone then told the label apart 71% of the time, so NSP
learnt the padding instead of coherence (issue 16).

Labels: 0 = "B is the next sentence" (row unchanged), 1 = "B is random"
(B borrowed), as in BERT's reference data script.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from bertjax import batch as batch_lib

Metrics = dict[str, tuple[jax.Array, jax.Array]]

# Fields whose rows are rebuilt; the others (a_lengths, example_id, epoch,
# example_mask) keep their values.
_ROW_FIELDS = ("tokens", "segment_ids", "positions", "doc_ids", "word_starts",
               "special") + batch_lib.KNOWLEDGE_FIELDS


def separators(batch: Mapping[str, jax.Array]) -> jax.Array:
  """int32 [B]: the [SEP]s between A and B of each sentence-pair row, 1
  (``[CLS] A [SEP] B``) or 2 (``[CLS] A [SEP] [SEP] B``, a RoBERTa-style
  tokenizer's pair template: bertjax/data/packing.py), read off the row: the
  column after A's [SEP] is B's first token, never a [SEP], in the first."""
  after = jnp.minimum(batch["a_lengths"] + 2, batch["tokens"].shape[1] - 1)
  second = jnp.take_along_axis(batch["tokens"], after[:, None], axis=1)[:, 0]
  return 1 + (second == batch_lib.SEP_ID).astype(jnp.int32)


def pair_with_b_from(batch: Mapping[str, jax.Array], partner_index: jax.Array,
                     use_partner: jax.Array) -> dict[str, jax.Array]:
  """Replaces the B segment of chosen rows with text of a partner row.

  A row i with ``use_partner[i]`` becomes ``[CLS] A_i [SEP] P [SEP] PAD...``
  (p = ``partner_index[i]``; two [SEP] after A_i where the row has two,
  ``separators``), where P is the first
  ``min(b_lengths[i], a_lengths[p] + b_lengths[p])`` tokens of the partner's
  passage A_p B_p (its [SEP]s left out): the row keeps its length, and so
  its padding, whenever the partner has that much text. Tokens and word
  starts come from gathers; the rest
  follows the packer's layout (bertjax/data/packing.py): segment ids 0 up to
  the first [SEP], 1 for B and the last [SEP], 0 on padding; positions
  0..L-1; doc ids 1, 0 on padding; special at CLS, SEP and padding; word
  starts True at CLS and SEP, False on padding; the knowledge boundaries
  (phrase_starts, entity_starts) move exactly like word starts. Rows with
  ``use_partner`` False are returned unchanged.

  Args:
    batch: a Batch of the sentence-pair layout; arrays [B, L] and [B].
    partner_index: int32 [B], the row whose B to borrow.
    use_partner: bool [B].

  Returns:
    A new Batch dict (same keys, shapes and dtypes) with ``b_lengths`` updated.
  """
  tokens = batch["tokens"]
  seq_len = tokens.shape[1]
  t = jnp.arange(seq_len, dtype=jnp.int32)[None, :]
  a_len = batch["a_lengths"][:, None]
  seps = separators(batch)[:, None]
  partner_a = batch["a_lengths"][partner_index][:, None]
  partner_seps = seps[partner_index]
  new_b = jnp.minimum(batch["b_lengths"],
                      batch["a_lengths"][partner_index]
                      + batch["b_lengths"][partner_index])
  b_start = a_len + 1 + seps
  b_end = b_start + new_b[:, None]  # where the final [SEP] goes

  in_a = (t >= 1) & (t <= a_len)
  in_b = (t >= b_start) & (t < b_end)
  is_sep = ((t > a_len) & (t < b_start)) | (t == b_end)
  is_pad = t > b_end
  is_word = (t == 0) | is_sep  # CLS and SEP are one-token words
  # Column of the partner's row that lands at t (only read inside B): its A
  # from column 1, then its B after skipping its [SEP]s.
  k = t - b_start
  source = jnp.where(in_b, jnp.where(k < partner_a, k + 1, k + 1 + partner_seps), t)

  def from_partner(name):
    return jnp.take_along_axis(batch[name][partner_index], source, axis=1)

  filler = jnp.where(t == 0, batch_lib.CLS_ID,
                     jnp.where(is_sep, batch_lib.SEP_ID, batch_lib.PAD_ID))
  rebuilt = {
      "tokens": jnp.where(in_b, from_partner("tokens"),
                          jnp.where(in_a, tokens, filler)),
      "special": ~(in_a | in_b),
      "segment_ids": (in_b | (t == b_end)).astype(jnp.int32),
      "positions": jnp.broadcast_to(t, tokens.shape),
      "doc_ids": jnp.where(is_pad, 0, 1),
  }
  for name in ("word_starts",) + batch_lib.KNOWLEDGE_FIELDS:
    rebuilt[name] = jnp.where(in_b, from_partner(name),
                              jnp.where(in_a, batch[name], is_word))
  out = dict(batch)
  for name in _ROW_FIELDS:
    out[name] = jnp.where(use_partner[:, None], rebuilt[name],
                          batch[name]).astype(batch[name].dtype)
  out["b_lengths"] = jnp.where(use_partner, new_b,
                               batch["b_lengths"]).astype(jnp.int32)
  return out


def choose_partners(rng: jax.Array, example_id: jax.Array,
                    example_mask: jax.Array,
                    b_lengths: jax.Array,
                    a_lengths: jax.Array | None = None
                    ) -> tuple[jax.Array, jax.Array]:
  """For every example, a random partner from a different document.

  Partners are drawn uniformly among the real examples (``example_mask``) of
  the batch with a non-empty B whose document (``example_id[:, 0]``) differs,
  preferring those whose passage (A + B) has at least this example's
  ``b_lengths`` tokens, so that the negative keeps the row's length
  (``pair_with_b_from``). The score of pair (i, j) comes from a key folded from both example ids, so
  the chosen partner's identity does not depend on where the two examples sit
  in the batch (nor on the number of devices).

  Args:
    rng: key for this step (e.g. ``fold_in(root, step)``).
    example_id: int32 [B, 2].
    example_mask: bool [B].
    b_lengths: int32 [B].
    a_lengths: int32 [B]; None: no preference by length.

  Returns:
    partner_index int32 [B], has_partner bool [B] (False: no valid partner,
    partner_index is then meaningless).
  """
  doc, instance = example_id[:, 0], example_id[:, 1]
  fold = jax.vmap(jax.random.fold_in)
  fold_one = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
  row_keys = fold(fold_one(rng, doc), instance)

  def row_scores(key):
    pair_keys = fold(fold_one(key, doc), instance)
    return jax.vmap(jax.random.uniform)(pair_keys)

  scores = jax.vmap(row_scores)(row_keys)  # [B, B]
  valid = ((doc[:, None] != doc[None, :]) & example_mask[None, :]
           & (b_lengths[None, :] > 0))
  if a_lengths is not None:
    # Long enough partners score in [1, 2), the others in [0, 1).
    scores = scores + ((a_lengths + b_lengths)[None, :]
                       >= b_lengths[:, None]).astype(scores.dtype)
  partner = jnp.argmax(jnp.where(valid, scores, -1.0), axis=1)
  return partner.astype(jnp.int32), jnp.any(valid, axis=1)


def make_negatives(
    decision_keys: jax.Array, partner_rng: jax.Array,
    batch: Mapping[str, jax.Array], negative_rate: float,
    eligible: jax.Array | None = None) -> tuple[dict[str, jax.Array], jax.Array]:
  """Turns a random ``negative_rate`` of the pairs into NSP negatives.

  Each real example independently becomes a negative with probability
  ``negative_rate`` (from its own key, so static or dynamic like the masks);
  one that finds no partner from another document stays positive, so the
  realised rate is slightly lower on batches dominated by one document.

  Args:
    decision_keys: [B] one key per example (``masking.example_keys``).
    partner_rng: key of this step for the partner choice.
    batch: a Batch of the sentence-pair layout.
    negative_rate: probability of a negative, in [0, 1].
    eligible: optional bool [B]; rows False here always stay positive (UniLM
      scores NSP on its bidirectional rows only, and keeps the others' B).

  Returns:
    (the rebuilt Batch, nsp_labels int32 [B]: 1 = B is random, 0 = is next).
  """
  wants = jax.vmap(lambda k: jax.random.bernoulli(k, negative_rate))(
      decision_keys)
  partner, has_partner = choose_partners(
      partner_rng, batch["example_id"], batch["example_mask"],
      batch["b_lengths"], batch["a_lengths"])
  use = wants & has_partner & batch["example_mask"]
  if eligible is not None:
    use = use & eligible
  return pair_with_b_from(batch, partner, use), use.astype(jnp.int32)


def nsp_loss(nsp_logits: jax.Array, nsp_labels: jax.Array,
             example_mask: jax.Array) -> tuple[jax.Array, Metrics]:
  """Mean cross-entropy of the two-way sentence head over real examples.

  Args:
    nsp_logits: float [B, 2] (scored in float32).
    nsp_labels: int32 [B].
    example_mask: bool [B].

  Returns:
    (scalar float32 loss, {'nsp_loss': (sum, count), 'nsp_accuracy':
    (sum, count)}), count being the number of real examples.
  """
  log_probs = jax.nn.log_softmax(nsp_logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, nsp_labels[:, None], axis=-1)[:, 0]
  weights = example_mask.astype(jnp.float32)
  count = jnp.sum(weights)
  loss_sum = jnp.sum(nll * weights)
  correct = (jnp.argmax(log_probs, axis=-1) == nsp_labels).astype(jnp.float32)
  metrics = {
      "nsp_loss": (loss_sum, count),
      "nsp_accuracy": (jnp.sum(correct * weights), count),
  }
  return loss_sum / jnp.maximum(count, 1.0), metrics

"""XLNet's permutation language model with partial prediction.

Per example (Yang et al., 2019, section 2):

1. A factorization order ``z`` is drawn on device from the example's key
   (``masking.example_keys``: ``config.masking`` 'dynamic' draws a new order
   every step, 'static' one per example and ``epoch % dupe_factor``), so the
   orders do not depend on how the batch is split over devices. The order is
   a uniformly random permutation of the row's candidates (real tokens that
   are not special) placed after the rest of the row (special tokens and
   padding, in random order): context that is never predicted comes first.
2. Partial prediction: only the last ``n`` tokens of the order are predicted,
   ``n = floor(candidates / K + u)`` with u ~ U[0, 1) from the same key
   (stochastic rounding: exactly 1/K of the candidates in expectation),
   K = ``partial_prediction_k`` (6 in the paper). Shapes stay static: the P =
   ``max_predictions_per_seq`` slots hold the last P tokens of the order,
   latest first, and the first ``n`` slots have weight 1 (P must be at least
   ceil(seq_len / K), so no predicted token lacks a slot).
3. Masks, as model input ``perm_visible`` bool [B, L, L]: True where j comes
   before i in the order. The model's query stream reads exactly those keys
   (never the token itself); its content stream also reads i itself. The
   model ANDs both with the document mask, so packed documents never see
   each other; each document's tokens keep a uniformly random relative order.
4. Inputs, positions and segment ids stay in the original order and are not
   corrupted (no [MASK] in the input); the loss is the mean cross-entropy of
   the query stream's predictions over the predicted slots (``mlm.mlm_loss``,
   so ``bertjax.evaluate``'s accuracy and most-frequent-token baseline read
   the predicted positions).

No ``forward`` hook is needed: everything random happens in ``corrupt`` and
the masks travel as a model input, so the step stays ``corrupt -> apply ->
loss`` and gradient accumulation slices ``perm_visible`` with the batch.

Span option (``max_span`` > 0, as XLNet's data script): instead of the last
1/K of a random order, whole-word n-grams of 1..max_span words (P(n)
proportional to 1/n) are chosen until round(candidates / K) tokens
(``choose_span_tokens``); they go last in the order, in random order among
themselves, after the other candidates, so the masks keep their definition
and the predicted tokens are still the last of the order.

Segment memory (``mem_len`` > 0) is not the objective's business beyond a
check: the model declares it (``carry_shapes``), the train step carries it in
``TrainState.carry``, and the ``stream`` layout makes row r of the next batch
continue row r's text; this objective only refuses memory without that
layout. Each segment draws its own order; the memory (the previous segment's
content-stream states) is visible to every token of both streams.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import mlm

# fold_in constant keeping the permutation keys apart from other streams.
_ORDER_STREAM = 0x71E7


def min_slots(seq_len: int, k: int) -> int:
  """The fewest prediction slots that always hold the predicted tokens."""
  return math.ceil(seq_len / k)


def draw_order(key: jax.Array, candidates: jax.Array, k: float,
               chosen: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """One example's factorization order and how many of its tokens to predict.

  Args:
    key: the example's key.
    candidates: bool [L], tokens that may be predicted.
    k: the partial-prediction divisor K.
    chosen: bool [L] or None: the tokens to predict, chosen beforehand (the
      span option); they go last in the order, after the other candidates.
      None: the last 1/K of the candidates' order (stochastic rounding).

  Returns:
    (rank int32 [L]: the place of each token in the order; num_predict int32
    scalar: the last ``num_predict`` tokens of the order are predicted).
  """
  order_key, count_key = jax.random.split(key)
  score = jax.random.uniform(order_key, candidates.shape) + candidates
  if chosen is not None:
    score = score + chosen
  rank = jnp.argsort(jnp.argsort(score)).astype(jnp.int32)
  if chosen is not None:
    return rank, jnp.sum(chosen).astype(jnp.int32)
  count = jnp.sum(candidates).astype(jnp.float32)
  num_predict = jnp.floor(count / k + jax.random.uniform(count_key, ()))
  return rank, jnp.minimum(num_predict, count).astype(jnp.int32)


def choose_span_tokens(key: jax.Array, candidates: jax.Array,
                       word_starts: jax.Array, *, k: float, max_span: int,
                       num_slots: int) -> jax.Array:
  """The span option: bool [L], whole-word n-grams (n = 1..max_span words,
  P(n) proportional to 1/n, as XLNet's data script draws them) chosen until
  round(candidates / K) tokens (``masking.choose_spans``, ALBERT's n-gram
  machinery); a span never crosses a special token or a document."""
  positions, weights = masking.choose_spans(
      key, candidates, word_starts, rate=1.0 / k, max_predictions=num_slots,
      length_probs=masking.ngram_length_probs(max_span), whole_word=True)
  return jnp.zeros(candidates.shape, bool).at[positions].max(weights > 0)


def visible_from_rank(rank: jax.Array) -> jax.Array:
  """bool [..., L, L]: True where token j precedes token i in the order."""
  return rank[..., None, :] < rank[..., :, None]


def slots_from_rank(rank: jax.Array, num_predict: jax.Array,
                    num_slots: int) -> tuple[jax.Array, jax.Array]:
  """The last ``num_slots`` tokens of the order, latest first, and which of
  them are predicted.

  Args:
    rank: int32 [B, L].
    num_predict: int32 [B].
    num_slots: P.

  Returns:
    (positions int32 [B, P], predicted bool [B, P]).
  """
  order = jnp.argsort(rank, axis=-1).astype(jnp.int32)  # order[r] = token of rank r
  positions = order[:, ::-1][:, :num_slots]
  predicted = jnp.arange(num_slots)[None, :] < num_predict[:, None]
  return positions, predicted


class XLNetObjective:
  """Permutation LM with two-stream attention (see the module docstring)."""
  models = ("xlnet",)  # feeds the query stream and permutation masks
  needs_sentence_head = False

  def __init__(self, config: Any):
    self.k = float(config.partial_prediction_k)
    self.num_slots = int(config.max_predictions_per_seq)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    self.max_span = int(config.get("max_span", 0))
    if self.max_span < 0:
      raise ValueError(f"max_span={self.max_span} must not be negative; fix "
                       "--config.max_span (0 = no spans).")
    if self.max_span > self.num_slots:
      # As mlm's max_ngram: longer spans never fit (max_span=1000 on the demo:
      # 1,562 held-out predictions instead of 4,681 at max_span=3).
      raise ValueError(
          f"max_span={self.max_span} is longer than the max_predictions_per_seq="
          f"{self.num_slots} tokens a row predicts at most, so the longer spans "
          f"can never be chosen; set --config.max_span to at most "
          f"{self.num_slots} (0 = no spans).")
    if not 1 <= self.k <= int(config.seq_len):
      # Above seq_len fewer than one token a row is predicted (K=1000 on
      # 128-token rows: 27 predictions in the demo's 28,629 held-out tokens).
      raise ValueError(
          f"partial_prediction_k={self.k:g} must lie between 1 and seq_len "
          f"({config.seq_len}); fix --config.partial_prediction_k (XLNet "
          "predicts 1/K of each row, K=6).")
    need = min_slots(int(config.seq_len), self.k)
    if self.num_slots < need:
      raise ValueError(
          f"max_predictions_per_seq={self.num_slots} cannot hold 1/K of "
          f"seq_len={config.seq_len} (K={self.k:g}); set "
          f"--config.max_predictions_per_seq to at least {need}.")
    if int(config.get("mem_len", 0) or 0) > 0 and config.layout != "stream":
      raise ValueError(
          f"mem_len={config.mem_len} carries each row's memory into the same "
          f"row of the next batch, but layout {config.layout!r} does not "
          "continue a row's text there; set --config.layout=stream (or "
          "--config.mem_len=0).")

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids, positions, doc_ids int32 [B, L] (as
    in the Batch), masked_positions int32 [B, P] (the target mapping) and
    perm_visible bool [B, L, L]. Targets: mlm_targets int32 [B, P],
    mlm_weights float32 [B, P], example_mask bool [B].
    """
    keys = masking.example_keys(
        jax.random.fold_in(rng, _ORDER_STREAM), batch["example_id"],
        batch["epoch"], step, masking=self.masking, dupe_factor=self.dupe_factor)
    tokens = batch["tokens"]
    candidates = ~batch["special"] & (batch["doc_ids"] > 0)
    rank, num_predict = jax.vmap(self._draw)(keys, candidates,
                                             batch["word_starts"])
    positions, predicted = slots_from_rank(rank, num_predict, self.num_slots)
    weights = predicted & batch["example_mask"][:, None]
    inputs = {
        "tokens": tokens,
        "segment_ids": batch["segment_ids"],
        "positions": batch["positions"],
        "doc_ids": batch["doc_ids"],
        "masked_positions": positions,
        "perm_visible": visible_from_rank(rank),
    }
    targets = {
        "mlm_targets": jnp.take_along_axis(tokens, positions, axis=1),
        "mlm_weights": weights.astype(jnp.float32),
        "example_mask": batch["example_mask"],
    }
    return inputs, targets

  def _draw(self, key: jax.Array, candidates: jax.Array,
            word_starts: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``draw_order`` of one example, with spans when ``max_span`` > 0."""
    if not self.max_span:
      return draw_order(key, candidates, self.k)
    span_key, order_key = jax.random.split(jax.random.fold_in(key, 1))
    chosen = choose_span_tokens(span_key, candidates, word_starts, k=self.k,
                                max_span=self.max_span, num_slots=self.num_slots)
    return draw_order(order_key, candidates, self.k, chosen)

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean cross-entropy of the predicted tokens; metrics mlm_loss,
    mlm_accuracy and 'loss' as (loss, 1)."""
    value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    metrics["loss"] = (value, jnp.ones((), jnp.float32))
    return value, metrics

"""UniLM's unified self-attention masks: which keys each query may see.

One shared encoder is trained as four language models by its attention mask
alone (Dong et al., 2019). Per example, one of:

  bidirectional   every token sees every token (BERT's cloze)
  seq2seq         segment A (``segment_ids`` 0: [CLS] A [SEP]) sees A only;
                  segment B (1: B [SEP]) sees all of A and B up to itself
  left_to_right   a token sees itself and the tokens before it
  right_to_left   a token sees itself and the tokens after it

These are pure array functions with static shapes, used inside the jitted
step. The masks here say nothing about documents or padding: the model
combines them with ``doc_ids`` (``layers.combine_masks``), so packed
documents never see each other and padding keys are never read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Index of each mask type, as in ``mask_types`` and the metric suffixes.
MASK_TYPES = ("bidirectional", "seq2seq", "left_to_right", "right_to_left")
BIDIRECTIONAL, SEQ2SEQ, LEFT_TO_RIGHT, RIGHT_TO_LEFT = range(4)
# The paper's mix: 1/3 bidirectional, 1/3 seq2seq, 1/6 each unidirectional.
PAPER_RATES = (1 / 3, 1 / 3, 1 / 6, 1 / 6)


def check_rates(rates) -> tuple[float, ...]:
  """The four mask-type probabilities, checked; raises ValueError naming the
  field."""
  rates = tuple(float(r) for r in rates)
  # "not (in range)": NaN compares False and must fail.
  if len(rates) != len(MASK_TYPES) or not (min(rates) >= 0
                                           and abs(sum(rates) - 1) <= 1e-6):
    raise ValueError(
        f"unilm_mask_rates={rates} must be {len(MASK_TYPES)} non-negative "
        f"probabilities summing to 1, for {', '.join(MASK_TYPES)}; fix "
        f"--config.unilm_mask_rates.")
  return rates


def draw_mask_types(keys: jax.Array, rates) -> jax.Array:
  """One mask type per example, drawn from its own key.

  Args:
    keys: [B] keys, one per example (``masking.example_keys``), so the type
      is static or dynamic like the example's masks.
    rates: the four probabilities (``check_rates``), in ``MASK_TYPES`` order.

  Returns:
    int32 [B], indices into ``MASK_TYPES``.
  """
  cdf = np.cumsum(np.asarray(rates, np.float64))[:-1]
  u = jax.vmap(jax.random.uniform)(keys)
  return jnp.searchsorted(jnp.asarray(cdf, jnp.float32), u,
                          side="right").astype(jnp.int32)


def attention_masks(mask_types: jax.Array, segment_ids: jax.Array) -> jax.Array:
  """Each example's unified mask.

  Args:
    mask_types: int32 [B], indices into ``MASK_TYPES``.
    segment_ids: int32 [B, L], 0 for the source segment A, 1 for B.

  Returns:
    bool [B, L, L]: True where query (axis 1) may attend to key (axis 2).
  """
  length = segment_ids.shape[1]
  q = jnp.arange(length)[:, None]
  k = jnp.arange(length)[None, :]
  left = (k <= q)[None]  # [1, L, L]
  right = (k >= q)[None]
  source_key = (segment_ids == 0)[:, None, :]
  target_query = (segment_ids == 1)[:, :, None]
  seq2seq = source_key | (target_query & left)
  t = mask_types[:, None, None]
  return jnp.where(
      t == BIDIRECTIONAL, True,
      jnp.where(t == SEQ2SEQ, seq2seq,
                jnp.where(t == LEFT_TO_RIGHT, left, right)))

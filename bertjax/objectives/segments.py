"""The segment ids a model reads, which are not always the layout's.

The sentence-pair layout marks sentence B with segment id 1
(bertjax/data/packing.py), and NSP negatives, SOP swaps and UniLM's seq2seq
mask read that mark. A model with a single segment reads 0 everywhere
instead: ``config.single_segment`` (an imported RoBERTa, whose tokenizer,
pretraining and fine-tuning give every token segment 0, even where its
checkpoint has an unused second row) or ``type_vocab_size`` 1, whose table
has no row for 1: bertjax's lookup (``jnp.take``) fills a missing row with
NaN, which stopped a continued NSP run at its first step, and a clamping
gather would read row 0 silently.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def single_segment(config: Any) -> bool:
  """Whether the config's model reads segment 0 for every token."""
  return bool(config.get("single_segment", False)) or (
      int(config.get("type_vocab_size", 2)) == 1)


def model_segment_ids(segment_ids: jax.Array, single: bool) -> jax.Array:
  """int32 [B, L]: the layout's ``segment_ids``, or zeros for a ``single``
  segment model (see the module docstring)."""
  return jnp.zeros_like(segment_ids) if single else segment_ids

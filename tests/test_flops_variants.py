"""Useful-FLOP counts of XLNet, UniLM and BERT/RoBERTa with the sparse last
layer (bertjax/flops.py), checked two ways:
against arithmetic done by hand from the architecture, and against the matrix
multiplications of the real train step's program (its jaxpr, dead code
removed as XLA removes it)."""

import math

import jax
import numpy as np
import pytest
from jax._src.interpreters import partial_eval as pe

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import flops
from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.models import bert
from bertjax.models import sizes


def _small(name):
  """A small config of variant ``name``: L=2, H=16, 2 heads, F=24, V=50,
  batch 2 x 12 tokens, 3 prediction slots per row."""
  c = config_files.shipped(name).get_config("tiny")
  c.model_size = "custom"
  c.num_layers, c.hidden_size, c.num_heads, c.mlp_dim = 2, 16, 2, 24
  c.vocab_size, c.batch_size, c.seq_len, c.max_predictions_per_seq = 50, 2, 12, 3
  return c


def _pair_batch(b, s, vocab):
  """[CLS] A [SEP] B [SEP] rows of random tokens, every position real."""
  out = batch_lib.empty_batch(b, s)
  rng = np.random.default_rng(0)
  out["tokens"] = rng.integers(batch_lib.NUM_SPECIAL_TOKENS, vocab, (b, s)).astype(np.int32)
  a = (s - 3) // 2
  out["tokens"][:, 0] = batch_lib.CLS_ID
  out["tokens"][:, [1 + a, s - 1]] = batch_lib.SEP_ID
  out["segment_ids"][:, 2 + a:] = 1
  out["positions"][:] = np.arange(s)
  out["doc_ids"][:] = 1
  out["word_starts"][:] = True
  out["special"][:] = False
  out["special"][:, [0, 1 + a, s - 1]] = True
  out["a_lengths"][:] = a
  out["b_lengths"][:] = s - 3 - a
  out["example_id"][:, 0] = np.arange(b)
  out["example_mask"][:] = True
  return out


def _matmul_flops(jaxpr, lookups: list | None = None) -> int:
  """2 x multiply-adds of every dot_general in ``jaxpr`` and its sub-jaxprs.

  The position and segment tables' gradient is a one-hot matmul that stands
  in for a scatter-add (bertjax/models/bert.py): a lookup's gradient, not
  model FLOPs, so it is left out and its FLOPs appended to ``lookups``."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      flops = 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs[d] for d in contract)
      if bert.TABLE_GRAD_SCOPE in str(eqn.source_info.name_stack):
        if lookups is not None:
          lookups.append(flops)
        continue
      total += flops
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += _matmul_flops(sub.jaxpr, lookups)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += _matmul_flops(sub, lookups)
  return total


@pytest.mark.parametrize("name", ["xlnet", "unilm", "bert", "roberta"])
def test_step_flops_are_the_matmuls_of_the_train_step(name):
  # Everything step_flops counts is a matmul of the step, and every matmul
  # of the step (forward, backward, both XLNet streams, position and segment
  # scores, heads) is counted: the two agree exactly. Dead code (XLNet's last
  # content-stream layer beyond its keys and values) is removed first, as
  # XLA's compiler removes it.
  c = _small(name)
  mesh = sharding.make_mesh("1,1,1", jax.devices()[:1])
  model, tx = models.get_model(c), optim.make_optimizer(c)
  # Traced on the abstract state: nothing is initialised or compiled.
  state, shardings = state_lib.state_shardings(model, tx, c, mesh)
  step = train.make_train_step(model, objectives.get_objective(c), tx, shardings, mesh)
  with sharding.use_mesh(mesh):
    batch = train.to_global(_pair_batch(c.batch_size, c.seq_len, c.vocab_size), mesh)
    closed = jax.make_jaxpr(step)(state, batch, jax.random.key(0))
  live, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  lookups = []
  assert _matmul_flops(live, lookups) == flops.step_flops(c)
  # UniLM (BERT's embeddings) has the position and segment tables' one-hot
  # gradients: 2 x tokens x rows x width each; XLNet has neither table.
  tokens, width = c.batch_size * c.seq_len, c.hidden_size
  if name != "xlnet":
    rows = (c.max_position_embeddings, c.type_vocab_size)
    assert sorted(lookups) == sorted(2 * tokens * r * width for r in rows)
  else:
    assert lookups == []
  # The dead code is there before elimination for XLNet alone.
  dead = _matmul_flops(closed.jaxpr) - _matmul_flops(live)
  assert (dead > 0) == (name == "xlnet")


def test_xlnet_step_flops_by_hand():
  # Forward matmuls as (rows, inner, columns), each 2 * rows * inner * columns
  # FLOPs; the step does them 3x (forward, and the input and weight
  # gradients), except the sinusoid table's projection, 2x (no input
  # gradient for a constant).
  c = _small("xlnet")
  H, F, V, S, R = 16, 24, 50, 12, 23  # R = 2S - 1 relative distances
  T, P = 2 * 12, 2 * 3  # tokens and prediction slots of the batch

  def stream(rows):  # one stream's matmuls in one layer, keys and values aside
    return [(rows, H, H), (rows, H, H),  # query and output projections
            (rows, H, F), (rows, F, H),  # feed-forward
            (rows, H, S), (rows, S, H),  # scores against S keys, x values
            (rows, H, R), (rows, H, 2)]  # relative position and segment scores

  keys_values = [(T, H, H), (T, H, H)]
  first_layer = keys_values + stream(T) + stream(P)
  last_layer = keys_values + stream(P)  # the loss reads g alone
  head = [(P, H, V)]  # tied decoder
  fwd = lambda mm: sum(2 * m * k * n for m, k, n in mm)
  want = 3 * fwd(first_layer + last_layer + head) + 2 * 2 * fwd([(R, H, H)])
  assert flops.step_flops(c) == want


def test_unilm_step_flops_are_bert_base_with_its_heads():
  # UniLM-base: BERT-base's encoder (the masks cost no FLOPs), the MLM head
  # (transform + decoder) at 76 slots per row and the pooler + NSP head,
  # at the paper's recipe: batch 320 x 512, cased vocabulary 28,996. With the
  # sparse last layer (the default), that layer's queries, output projection,
  # feed-forward and attention run at the P slots and the B [CLS] rows only;
  # its keys and values at every token.
  c = config_files.shipped("unilm").get_config("base")
  assert sizes.resolve(c) == sizes.Size(12, 768, 12, 3072)
  L, H, F, V, B, S = 12, 768, 3072, 28_996, 320, 512
  P = B * c.max_predictions_per_seq
  T = B * S
  per_token_layer = 2 * (4 * H * H + 2 * H * F) + 2 * 2 * S * H
  heads = 3 * 2 * (H * H + H * V) * P + 3 * 2 * (H * H + H * 2) * B
  c.sparse_last_layer = False
  assert flops.step_flops(c) == 3 * L * per_token_layer * T + heads
  c.sparse_last_layer = True
  per_row_rest = 2 * (2 * H * H + 2 * H * F) + 2 * 2 * S * H  # Q, out, FFN, attention
  assert flops.step_flops(c) == (3 * (L - 1) * per_token_layer * T
                                 + 3 * 2 * (2 * H * H) * T  # last layer's K, V
                                 + 3 * per_row_rest * (P + B) + heads)


def test_xlnet_base_has_the_released_sizes():
  c = config_files.shipped("xlnet").get_config("base")
  assert sizes.resolve(c) == sizes.Size(12, 768, 12, 3072)
  assert c.vocab_size == 32_000  # xlnet-base-cased's sentencepiece model
  # The two streams cost more than the content stream alone.
  bert_like = c.copy_and_resolve_references()
  bert_like.model = "bert"
  bert_like.sentence_head = False
  assert flops.step_flops(c) > flops.step_flops(bert_like)

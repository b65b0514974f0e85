"""XLNet: permutation masks against their definitions, partial prediction,
no leakage into the query stream, golden shapes, mesh invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import config_files
from bertjax import flops
from bertjax import models
from bertjax import sharding
from bertjax import objectives
from bertjax import train
from bertjax.data import pipeline
from bertjax.models import xlnet as xlnet_model
from bertjax.objectives import xlnet
import variant_steps

xlnet_config = config_files.shipped("xlnet")  # configs/xlnet.py


def _slow_masks(order, length):
  """Content and query masks written from the definitions: a token sees
  itself (content only) and every token earlier in the order."""
  content = np.zeros((length, length), bool)
  query = np.zeros((length, length), bool)
  for step, i in enumerate(order):
    for j in order[:step]:
      content[i, j] = query[i, j] = True
    content[i, i] = True
  return content, query


def _masks_from_rank(rank, doc_ids=None):
  rank = jnp.asarray(rank)[None]
  doc = jnp.ones_like(rank) if doc_ids is None else jnp.asarray(doc_ids)[None]
  content, query = xlnet_model.stream_masks(doc, xlnet.visible_from_rank(rank))
  return np.asarray(content[0]), np.asarray(query[0])


def test_worked_example_order_3_2_4_1():
  # 1-based order 3 -> 2 -> 4 -> 1, i.e. ranks of tokens 1..4: 3, 1, 0, 2.
  content, query = _masks_from_rank(np.array([3, 1, 0, 2]))
  sees = {1: {1, 2, 3, 4}, 2: {2, 3}, 3: {3}, 4: {2, 3, 4}}
  for row, keys in sees.items():
    assert {j + 1 for j in np.flatnonzero(content[row - 1])} == keys
    assert {j + 1 for j in np.flatnonzero(query[row - 1])} == keys - {row}


def test_masks_equal_the_definitions_on_random_orders():
  length = 12
  candidates = jnp.asarray(np.random.default_rng(0).random(length) < 0.8)
  for seed in range(20):
    rank, _ = xlnet.draw_order(jax.random.key(seed), candidates, 6.0)
    rank = np.asarray(rank)
    assert sorted(rank) == list(range(length))  # a permutation
    order = list(np.argsort(rank))
    # Candidates (predictable tokens) come after the rest of the row.
    assert not candidates[np.array(order)].tolist().index(True) < (~candidates).sum()
    want_content, want_query = _slow_masks(order, length)
    content, query = _masks_from_rank(rank)
    assert np.array_equal(content, want_content) and np.array_equal(query, want_query)
  # Packed documents never see each other; padding is seen by nobody.
  doc_ids = np.array([1] * 5 + [2] * 5 + [0] * 2)
  content, query = _masks_from_rank(rank, doc_ids)
  same = (doc_ids[:, None] == doc_ids[None, :]) & (doc_ids[None, :] > 0)
  assert np.array_equal(content[:10], (want_content & same)[:10])
  assert np.array_equal(query, want_query & same)


def _synthetic_batch(batch, length, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, batch)
  real = np.arange(length)[None] < lengths[:, None]
  special = ~real | (np.arange(length)[None] == 0) | (
      np.arange(length)[None] == lengths[:, None] - 1)
  return {
      "tokens": jnp.asarray(rng.integers(5, 60, (batch, length)) * real, jnp.int32),
      "segment_ids": jnp.zeros((batch, length), jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
      "doc_ids": jnp.asarray(real, jnp.int32),
      "special": jnp.asarray(special),
      "word_starts": jnp.ones((batch, length), bool),  # every token a word
      "example_id": jnp.stack([jnp.arange(batch), jnp.zeros(batch, jnp.int32)], 1),
      "epoch": jnp.zeros((batch,), jnp.int32),
      "example_mask": jnp.ones((batch,), bool),
  }


def _objective(seq_len, k=6, slots=None, max_span=0):
  c = xlnet_config.get_config("tiny")
  c.seq_len, c.partial_prediction_k, c.max_span = seq_len, k, max_span
  c.max_predictions_per_seq = slots or -(-seq_len // k)
  return xlnet.XLNetObjective(c)


@pytest.mark.parametrize("max_span", [0, 3])
def test_the_last_one_kth_of_the_order_is_predicted(max_span):
  batch = _synthetic_batch(512, 40)
  objective = _objective(40, max_span=max_span)
  inputs, targets = jax.jit(objective.corrupt)(jax.random.key(3), batch, jnp.int32(0))
  visible = np.asarray(inputs["perm_visible"])
  rank = visible.sum(-1)  # how many tokens precede each token
  candidates = np.asarray(~batch["special"])
  weights = np.asarray(targets["mlm_weights"]) > 0
  positions = np.asarray(inputs["masked_positions"])
  tokens = np.asarray(batch["tokens"])
  for b in range(len(rank)):
    chosen = positions[b][weights[b]]
    n = len(chosen)
    assert len(set(chosen)) == n and candidates[b, chosen].all()
    # Exactly the last n tokens of the order, latest first.
    assert list(rank[b, chosen]) == list(range(40 - 1, 40 - 1 - n, -1))
    assert np.array_equal(np.asarray(targets["mlm_targets"])[b], tokens[b, positions[b]])
  # Stochastic rounding predicts 1/K of the candidates in expectation: the
  # rounding noise (variance <= 1/4 per row) is 0.9% of the total here; 4%
  # is more than 4 standard deviations.
  fraction = weights.sum() / candidates.sum()
  # How often a predicted token's right neighbour is predicted too.
  chosen = np.zeros_like(candidates)
  for b in range(len(rank)):
    chosen[b, positions[b][weights[b]]] = True
  together = (chosen[:, :-1] & chosen[:, 1:]).sum() / chosen[:, :-1].sum()
  if not max_span:
    assert abs(fraction - 1 / 6) < 0.04 / 6, fraction
    per_row = weights.sum(1) - candidates.sum(1) / 6
    assert np.all(np.abs(per_row) < 1)
    assert together < 0.25, together  # independent tokens: about 1/6
  else:
    # Whole spans within round(candidates / K): a span that would overflow
    # is skipped, so a row may fall a little short of its budget, never over.
    budget = np.round(candidates.sum(1) / 6)
    assert np.all(weights.sum(1) <= budget)
    assert 0.9 / 6 < fraction <= 1 / 6 + 0.01, fraction
    # Spans of 1..3 words with P(n) ~ 1/n: 7/18 of the tokens have their
    # right neighbour in their span (more by chance adjacency).
    assert together > 0.33, together


def _tiny_model():
  return xlnet_model.XLNetForPretraining(vocab_size=60, num_layers=2, hidden_size=32,
                                         num_heads=2, mlp_dim=48)


def test_a_prediction_never_sees_its_own_token():
  batch = _synthetic_batch(4, 16, seed=1)
  inputs, targets = jax.jit(_objective(16).corrupt)(jax.random.key(0), batch,
                                                    jnp.int32(0))
  model = _tiny_model()
  params = jax.jit(model.init)(jax.random.key(1), inputs)["params"]
  run = jax.jit(lambda x: model.apply({"params": params}, x))
  before = run(inputs)
  logits = before["mlm_logits"]
  row, slot = 0, 0
  assert targets["mlm_weights"][row, slot] == 1
  pos = int(inputs["masked_positions"][row, slot])
  changed = dict(inputs, tokens=inputs["tokens"].at[row, pos].set(
      (inputs["tokens"][row, pos] + 7) % 60))
  after = run(changed)
  np.testing.assert_array_equal(after["mlm_logits"][row, slot], logits[row, slot])
  # The same change does reach the content stream.
  assert not np.allclose(after["hidden"][row, pos], before["hidden"][row, pos])

  # By gradient: d(log-prob of the target) / d(embedded input) is exactly
  # zero at the predicted token and not zero at tokens before it.
  def score(perturbation):
    out = model.apply({"params": params, "perturbations": perturbation}, inputs)
    logp = jax.nn.log_softmax(out["mlm_logits"][row, slot])
    return logp[targets["mlm_targets"][row, slot]]
  zeros = {"embedded": jnp.zeros((4, 16, 32))}
  grad = np.asarray(jax.jit(jax.grad(score))(zeros)["embedded"][row])
  assert np.all(grad[pos] == 0)
  earlier = np.flatnonzero(np.asarray(inputs["perm_visible"][row, pos])
                           & np.asarray(inputs["doc_ids"][row] > 0))
  assert len(earlier) and np.all(np.abs(grad[earlier]).sum(-1) > 0)
  later = [j for j in range(16) if j not in set(earlier) and j != pos]
  assert np.all(grad[later] == 0)


def test_tiny_golden_parameter_shapes():
  c = xlnet_config.get_config("tiny")
  model = models.get_model(c)
  from bertjax import state as state_lib
  boxed = jax.eval_shape(lambda r: model.init(r, state_lib.dummy_inputs(c)),
                         jax.random.key(0))["params"]
  got = {k: tuple(v.shape) for k, v in
         traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/").items()}
  v, h, heads, f = 8000, 128, 2, 512
  d = h // heads
  want = {"word_embeddings/embedding": (v, h), "mask_emb": (h,), "lm_bias": (v,)}
  for i in range(2):
    att = f"layer_{i}/attention"
    for proj in ("query", "key", "value", "relative"):
      want[f"{att}/{proj}/kernel"] = (h, heads, d)  # no biases
    want[f"{att}/out"] = (h, heads, d)
    for bias in ("r_w_bias", "r_r_bias", "r_s_bias"):
      want[f"{att}/{bias}"] = (heads, d)
    want[f"{att}/seg_embed"] = (2, heads, d)
    want[f"layer_{i}/mlp/wi/kernel"], want[f"layer_{i}/mlp/wi/bias"] = (h, f), (f,)
    want[f"layer_{i}/mlp/wo/kernel"], want[f"layer_{i}/mlp/wo/bias"] = (f, h), (h,)
    for norm in ("attention_norm", "mlp_norm"):
      want[f"layer_{i}/{norm}/scale"] = want[f"layer_{i}/{norm}/bias"] = (h,)
  assert got == want


def test_bad_xlnet_fields_are_named():
  for field, value in (("partial_prediction_k", 0), ("max_predictions_per_seq", 5),
                       ("mem_len", 16), ("max_span", -1)):
    c = xlnet_config.get_config("tiny")
    c[field] = value
    with pytest.raises(ValueError, match=field) as error:
      objectives.get_objective(c)
    assert "\n" not in str(error.value)
  # Memory needs the stream layout (the objective says so, above); a
  # negative length is refused by the model.
  c = xlnet_config.get_config("tiny")
  c.mem_len = -1
  with pytest.raises(ValueError, match="mem_len"):
    models.get_model(c)


@pytest.fixture(scope="module")
def small(demo_data):
  """The tiny config on short rows with a narrow encoder (explicit
  dimensions win over model_size): a mesh splits its heads and mlp over
  tensor=2 all the same, and it compiles faster."""
  c = xlnet_config.get_config("tiny")
  c.data_dir = demo_data.data_dir
  c.batch_size, c.seq_len, c.max_predictions_per_seq = 8, 32, 6
  c.shuffle_window = 32
  c.num_train_steps, c.warmup_steps = 6, 1
  c.log_every_steps = c.checkpoint_every_steps = 3
  c.eval_every_steps, c.eval_max_batches = 0, 1
  c.model_size = "custom"
  c.num_layers, c.hidden_size, c.num_heads, c.mlp_dim = 2, 32, 2, 64
  return c


def test_same_losses_on_one_device_and_on_a_2x2x2_mesh(small, demo_data):
  c = small
  it = pipeline.make_train_iterator(c, demo_data.source("train"),
                                    local_batch_size=c.batch_size)
  batches = [next(it) for _ in range(2)]
  results = {}
  for name, devices, shape in (("one", jax.devices()[:1], "1,1,1"),
                               ("mesh", jax.devices(), "2,2,2")):
    mesh, state, step_fn = variant_steps.setup(c, shape, devices)
    rows = []
    with sharding.use_mesh(mesh):
      for b in batches:
        state, m = step_fn(state, train.to_global(b, mesh), jax.random.key(0))
        rows.append([float(m[k][0] / m[k][1]) for k in ("loss", "mlm_loss")]
                    + [float(m["mlm_loss"][1])])
      if name == "one":
        # The useful-FLOP count (both streams) against XLA's count of the
        # compiled step, which adds softmax, GELU, LayerNorm and Adam: a
        # little higher, never lower.
        cost = step_fn.lower(state, train.to_global(b, mesh),
                             jax.random.key(0)).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        ratio = cost["flops"] / flops.step_flops(c)
        assert 1.0 <= ratio < 1.5, ratio
    results[name] = np.asarray(rows)
  one = results["one"]
  assert np.all(np.isfinite(one)) and np.all(one[:, 2] > 0)
  # A learning step happened: the second batch's loss is not the first's.
  assert one[0, 0] != one[1, 0]
  np.testing.assert_allclose(results["mesh"], one, rtol=1e-5)



def test_rows_longer_than_max_position_embeddings_train(small, demo_data):
  # XLNet reads no absolute position table (its positions are sinusoids of
  # relative distances), yet seq_len above max_position_embeddings was
  # refused as reading past "the position table".
  from bertjax import config_validation
  c = small.copy_and_resolve_references()
  c.max_position_embeddings = 16  # half the 32-token rows
  config_validation.validate(c)
  state, metrics = variant_steps.one_train_step(c, demo_data.source("train"))
  for name in ("loss", "mlm_loss"):
    total, count = (float(x) for x in metrics[name])
    assert np.isfinite(total) and count > 0, name
  assert int(state.step) == 1
  # A row still has a lower bound.
  c.seq_len = 4
  with pytest.raises(ValueError, match=r"^config\.seq_len=4 is invalid: it must "
                     r"be at least 8 \(model 'xlnet' has no absolute position"):
    config_validation.validate(c)

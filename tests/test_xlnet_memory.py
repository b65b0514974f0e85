"""XLNet's segment memory: the stream layout continues each row, the memory
carries over between steps and receives no gradient, mesh invariance,
accumulation and exact resume with memory on, refusals."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax import checkpointing
from bertjax import evaluation
from bertjax import flops
from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline
from test_xlnet import small  # noqa: F401  (the shared fixture)
import variant_steps

MEM = 16  # shorter than the rows (32): the memory is the row's last 16 states


@pytest.fixture(scope="module")
def mem(small):
  """The shared small XLNet with memory, trained on a 2x2x2 mesh with two
  micro-batches (the step the mesh test compiles is the resume test's)."""
  c = small.copy_and_resolve_references()
  c.layout, c.mem_len = "stream", MEM
  c.mesh_shape, c.microbatches = "2,2,2", 2
  return c


def _batches(config, source, n):
  it = pipeline.make_train_iterator(config, source,
                                    local_batch_size=config.batch_size)
  return [next(it) for _ in range(n)]


def test_stream_rows_continue_their_row_and_resume_exactly(mem, demo_data):
  source = demo_data.source("train")
  rows = mem.batch_size
  it = pipeline.make_train_iterator(mem, source, local_batch_size=rows)
  batches = [next(it) for _ in range(4)]
  saved = json.loads(json.dumps(it.get_state()))
  later = [next(it) for _ in range(4)]
  resumed = pipeline.make_train_iterator(mem, source, local_batch_size=rows)
  resumed.set_state(saved)
  for want in later:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
  batches += later
  crossed = 0
  for r in range(rows):
    # Row r's text over the 8 steps, specials dropped, is whole documents of
    # row r's share, one after the other (the last one possibly unfinished).
    text = np.concatenate([b["tokens"][r][~b["special"][r]] for b in batches])
    share = {d: np.asarray(source[d]["tokens"])
             for d in range(r, len(source), rows)}
    pos, used = 0, []
    while pos < len(text):
      rest = text[pos:]
      match = [d for d, t in share.items() if d not in used
               and np.array_equal(t[:len(rest)], rest[:len(t)])]
      assert len(match) == 1, (r, pos)
      used.append(match[0])
      pos += len(share[match[0]])
    crossed += len(used) - 1
  assert crossed > 0  # some row went on into its next document


def test_too_few_documents_for_the_rows_are_refused(mem):
  with pytest.raises(ValueError, match="stream") as error:
    pipeline.make_train_iterator(mem, [{}] * 3, local_batch_size=8)
  assert "\n" not in str(error.value)


def _layer_inputs(model, params, inputs):
  """(the model's outputs, each layer's input: word embeddings, then the
  blocks' content outputs, read from flax's captured intermediates, not from
  the memory code)."""
  @jax.jit
  def run(params, inputs):
    outputs, seen = model.apply({"params": params}, inputs,
                                capture_intermediates=True,
                                mutable=["intermediates"])
    layer_inputs = [params["word_embeddings"]["embedding"][inputs["tokens"]]]
    for i in range(model.num_layers - 1):
      layer_inputs.append(seen["intermediates"][f"layer_{i}"]["__call__"][0][0])
    return outputs, layer_inputs
  return run(params, inputs)


def test_memory_carries_over_and_receives_no_gradient(mem, demo_data):
  b0, b1 = _batches(mem, demo_data.source("train"), 2)
  mesh, state, step_fn = variant_steps.setup(mem, "1,1,1", jax.devices()[:1])
  model = models.get_model(mem)
  objective = objectives.get_objective(mem)
  corrupt = jax.jit(objective.corrupt)
  rng = jax.random.key(0)
  p0 = jax.device_get(state.params)  # the state is donated to the step
  empty = jax.device_get(state.carry)
  assert not empty["memory_mask"].any()
  with sharding.use_mesh(mesh):
    # The useful-FLOP count with memory (bertjax/flops.py) against XLA's
    # count of the compiled step: a little higher, never lower.
    cost = step_fn.lower(state, train.to_global(b0, mesh),
                         rng).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert 1.0 <= cost["flops"] / flops.step_flops(mem) < 1.5
    state, _ = step_fn(state, train.to_global(b0, mesh), rng)
    carry = jax.device_get(state.carry)
    p1 = jax.device_get(state.params)
    inputs0, _ = corrupt(rng, b0, jnp.int32(0))
    _, want = _layer_inputs(model, p0, {**inputs0, **empty})
    for layer, x in enumerate(want):
      np.testing.assert_allclose(carry["memory"][:, layer], x[:, -MEM:],
                                 rtol=1e-5, atol=1e-6)
    assert np.array_equal(carry["memory_mask"], b0["doc_ids"][:, -MEM:] > 0)
    assert carry["memory_mask"].any()

    # The memory matters: step 2 with it and with an empty one differ.
    fresh = state_lib.TrainState(step=np.int32(1), params=p1,
                                 opt_state=jax.device_get(state.opt_state),
                                 carry=empty)
    fresh = jax.device_put(fresh, jax.tree.map(lambda a: a.sharding, state))
    _, with_memory = step_fn(state, train.to_global(b1, mesh), rng)
    _, without = step_fn(fresh, train.to_global(b1, mesh), rng)
  assert float(with_memory["loss"][0]) != float(without["loss"][0])

  # No gradient into the memory: step 2's loss does not depend, through the
  # memory, on step 1's parameters, nor on the memory itself, which it reads.
  inputs1, targets1 = corrupt(rng, b1, jnp.int32(1))

  def loss(params, memory):
    out = model.apply({"params": params}, {**inputs1, "memory": memory,
                                           "memory_mask": carry["memory_mask"]})
    return objective.loss(out, targets1)[0]

  def through_memory(previous):
    out = model.apply({"params": previous}, {**inputs0, **empty})
    return loss(p1, out["memory"])

  grad_previous = jax.jit(jax.grad(through_memory))(p0)
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grad_previous))
  value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=1))
  value, grad_memory = value_and_grad(p1, carry["memory"])
  assert np.all(np.asarray(grad_memory) == 0)
  assert float(value_and_grad(p1, carry["memory"] + 0.5)[0]) != float(value)


def test_memory_longer_than_a_row_keeps_the_older_states():
  from bertjax.models import xlnet as xlnet_model
  model = xlnet_model.XLNetForPretraining(vocab_size=40, num_layers=2,
                                          hidden_size=16, num_heads=2,
                                          mlp_dim=24, mem_len=12)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(5, 40, (2, 8)), jnp.int32)
  doc_ids = jnp.asarray(np.arange(8)[None] < np.array([[8], [6]]), jnp.int32)
  inputs = dict(tokens=tokens * doc_ids, segment_ids=jnp.zeros_like(tokens),
                positions=jnp.broadcast_to(jnp.arange(8), (2, 8)), doc_ids=doc_ids)
  old = jnp.asarray(rng.normal(size=(2, 2, 12, 16)), jnp.float32)
  old_mask = jnp.asarray(rng.random((2, 12)) < 0.7)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), {
      **inputs, "memory": old, "memory_mask": old_mask})["params"])
  memory = {"memory": old, "memory_mask": old_mask}
  out, want = _layer_inputs(model, params, {**inputs, **memory})
  for layer, x in enumerate(want):
    np.testing.assert_array_equal(out["memory"][:, layer, :4], old[:, layer, 8:])
    np.testing.assert_allclose(out["memory"][:, layer, 4:], x, rtol=1e-6)
  assert np.array_equal(out["memory_mask"],
                        np.concatenate([old_mask[:, 8:], doc_ids > 0], axis=1))


def _run(config, batches, mesh_shape, devices, microbatches):
  mesh = sharding.make_mesh(mesh_shape, devices)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  step_fn = train.make_train_step(model, objectives.get_objective(config), tx,
                                  shardings, mesh, microbatches=microbatches)
  losses = []
  with sharding.use_mesh(mesh):
    for b in batches:
      state, m = step_fn(state, train.to_global(b, mesh), jax.random.key(0))
      losses.append(float(m["loss"][0] / m["loss"][1]))
  return np.asarray(losses), jax.device_get(state.carry)


def test_same_losses_and_memory_on_a_mesh_with_accumulation(mem, demo_data):
  """One device, whole batch against a 2x2x2 mesh (rows over data x fsdp,
  heads and mlp over tensor) with two micro-batches of 4 rows each: each
  micro-batch reads and returns its own rows' memory."""
  batches = _batches(mem, demo_data.source("train"), 3)
  one, carry = _run(mem, batches, "1,1,1", jax.devices()[:1], 1)
  assert np.all(np.isfinite(one)) and carry["memory_mask"].any()
  assert one[1] != one[2]  # learning steps happened
  got, got_carry = _run(mem, batches, mem.mesh_shape, jax.devices(),
                        mem.microbatches)
  np.testing.assert_allclose(got, one, rtol=1e-5)
  np.testing.assert_allclose(got_carry["memory"], carry["memory"],
                             rtol=1e-4, atol=1e-5)
  assert np.array_equal(got_carry["memory_mask"], carry["memory_mask"])


def test_killed_run_with_memory_resumes_to_identical_result(mem, tmp_path):
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "resumed")
  ref = train.train_and_evaluate(mem, ref_dir)
  assert np.isfinite(ref["mlm_accuracy"]) and ref["num_predictions"] > 0
  assert train.train_and_evaluate(mem, workdir, stop_at_step=3) is None
  assert train.train_and_evaluate(mem, workdir) == ref

  def losses(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
      return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

  assert losses(workdir)[6] == losses(ref_dir)[6]


def _saved_import(mem, demo_data, workdir):
  """Writes what bertjax.convert --from_hf writes for an XLNet with mem_len >
  0 (transformers' default is 512): a step-0 checkpoint whose memory is
  empty, a row per row of the batch_size it was imported with (8); returns
  the config of another batch_size (4) to go on with."""
  model, tx = models.get_model(mem), optim.make_optimizer(mem)
  mesh = sharding.make_mesh(mem.mesh_shape)
  state, _ = state_lib.create_train_state(model, tx, mem, mesh)
  saver = checkpointing.Checkpointer(workdir)
  saver.save(0, state, {}, mem, demo_data.fingerprint, force=True)
  saver.close()
  other = mem.copy_and_resolve_references()
  other.batch_size, other.microbatches, other.mesh_shape = 4, 1, "4,1,2"
  other.num_train_steps = other.log_every_steps = other.checkpoint_every_steps = 1
  return other


def test_a_checkpoint_with_memory_is_evaluated_at_another_batch_size(
    mem, demo_data, tmp_path):
  # bertjax.evaluate reads only the parameters: another batch_size (so
  # another number of memory rows) evaluates the checkpoint all the same. It
  # used to be refused: "carry.memory is (8, ...) in the checkpoint but (4,
  # ...) in this config; resume it with the config it was trained with".
  workdir = str(tmp_path / "imported")
  other = _saved_import(mem, demo_data, workdir)
  record = evaluation.evaluate_checkpoint(other, workdir)
  assert record["step"] == 0 and record["num_predictions"] > 0
  assert record["config_changes"]["batch_size"] == [8, 4]


def test_an_import_with_memory_continues_at_another_batch_size(
    mem, demo_data, tmp_path):
  # A step-0 checkpoint may be continued with any batch (README); an XLNet
  # import with memory used to stop at the restore with the line above.
  workdir = str(tmp_path / "imported")
  record = train.train_and_evaluate(_saved_import(mem, demo_data, workdir), workdir)
  assert record["step"] == 1 and np.isfinite(record["mlm_loss"])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [r for r in map(json.loads, f) if "loss" in r]
  assert [r["step"] for r in rows] == [1] and np.isfinite(rows[0]["loss"])


def test_another_batch_size_with_memory_is_refused_as_a_layout_change(mem):
  # The memory has a row per row of the batch: a resumed run cannot restore
  # it at another batch_size, so allow_changes cannot allow it; the refusal
  # comes from the config comparison, before the workdir is locked or the
  # data prepared (it used to come from the restore, after both).
  from bertjax import compat
  saved = compat.as_json(mem)
  other = mem.copy_and_resolve_references()
  other.batch_size, other.allow_changes = 16, "batch_size"
  with pytest.raises(compat.IncompatibleCheckpoint,
                     match=r"batch_size=8 .* changes the saved state's layout; "
                           r"keep --config.batch_size=8 to resume it"):
    compat.check(saved, other, "The checkpoint at step 6")
  # An import (step 0) has empty memory: any batch continues it; without
  # memory batch_size stays a stream change that allow_changes allows.
  assert [c.field for c in compat.check(saved, other, "The checkpoint",
                                        layout_only=True)] == ["allow_changes", "batch_size"]
  other.mem_len, saved["mem_len"], other.layout = 0, 0, "full_sentences"
  saved["layout"] = "full_sentences"
  assert "batch_size" in [c.field for c in compat.check(saved, other, "The checkpoint")]

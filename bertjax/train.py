"""The train loop: one jitted, sharded train step fed by the host pipeline.

``train_and_evaluate(config, workdir)`` is what ``python -m bertjax.main`` runs
and what notebooks and tests call. The loop knows nothing about variants: the
objective (``config.objective``) corrupts the batch and scores the outputs, the
model (``config.model``) maps inputs to outputs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bertjax import checkpointing
from bertjax import compat
from bertjax import config_validation
from bertjax import corpus_metrics
from bertjax import evaluation
from bertjax import guards
from bertjax import metrics as metrics_lib
from bertjax import models
from bertjax import multihost
from bertjax import objectives
from bertjax import optim
from bertjax import progress as progress_lib
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import paths
from bertjax import workdir_lock
from bertjax.data import layout
from bertjax.data import pipeline
from bertjax.data import prepare

# Masks must not depend on how the batch is split over devices.
jax.config.update("jax_threefry_partitionable", True)

_DROPOUT_STREAM = 0xD50  # fold_in constant separating dropout from masking keys


def train_step(state: state_lib.TrainState, batch: dict[str, jax.Array],
               rng: jax.Array, *, model, objective, tx, debug_nan_step: int = -1,
               microbatches: int = 1, mesh=None):
  """One optimizer step. Pure; jitted once by ``make_train_step``.

  An update whose loss or gradient norm is not finite is not applied: params
  and optimizer state stay as they were, the step counter advances and
  ``metrics['skipped']`` is 1 (bertjax/guards.py decides what happens next).

  With ``microbatches > 1`` the gradient of the whole global batch is
  accumulated over that many slices (``_accumulate``), so the update is the
  one a single big batch would give, to float rounding.

  ``state.carry`` (empty for most models; XLNet's segment memory) joins the
  model inputs under its own names, and the model's outputs of those names
  are the next state's carry; a skipped update also empties the carry
  (zeros), so no NaN outlives its step.

  Args:
    state: the TrainState.
    batch: a global Batch (bertjax/batch.py) of sharded device arrays.
    rng: the run's root key; per-step keys are ``fold_in(rng, state.step)``.
    debug_nan_step: test hook; the loss of this step is made NaN.
    microbatches: gradient-accumulation slices of the batch.
    mesh: the device mesh; keeps each micro-batch split over all batch devices.

  Returns:
    (new state, metrics as {name: (sum, count)}).
  """
  # The whole batch is corrupted at once, before any split: masks are keyed by
  # example_id either way, and the NSP partner of an example is drawn from the
  # whole global batch, exactly as without accumulation.
  # Named scopes label the step's parts in profiles (bench/profile_step.py).
  batch, corpus = corpus_metrics.split(batch)  # a mixture's row labels, if any
  with jax.named_scope("corrupt"):
    inputs, targets = objective.corrupt(rng, batch, state.step)
  inputs = {**inputs, **state.carry}
  carried = tuple(state.carry)
  dropout_rng = jax.random.fold_in(
      jax.random.fold_in(rng, _DROPOUT_STREAM), state.step)

  if microbatches == 1:
    def loss_fn(params):
      apply = objectives.base.bind(model, params, deterministic=False,
                                   dropout_rng=dropout_rng)
      outputs = objectives.base.forward(objective, apply, inputs, targets)
      with jax.named_scope("loss"):
        loss, metrics = objective.loss(outputs, targets)
      metrics = {**metrics, **corpus_metrics.mlm_sums(outputs, targets, corpus)}
      return loss, (metrics, {k: outputs[k] for k in carried})

    (loss, (metrics, carry)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(state.params)
  else:
    loss, metrics, grads, carry = _accumulate(
        state.params, inputs, targets, dropout_rng, model, objective,
        microbatches, mesh, carried, corpus)
  loss = jnp.where(state.step == debug_nan_step, jnp.nan, loss)
  with jax.named_scope("optimizer"):
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  params, opt_state = guards.update_if_finite(finite, tx, grads, state.params,
                                              state.opt_state, grad_norm)
  metrics = dict(metrics)
  metrics["grad_norm"] = (grad_norm, jnp.float32(1.0))
  metrics["skipped"] = (1.0 - finite.astype(jnp.float32), jnp.float32(1.0))
  carry = jax.tree.map(lambda a: jnp.where(finite, a, jnp.zeros_like(a)),
                       jax.lax.stop_gradient(carry))
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state, carry=carry)
  return new_state, metrics


def _accumulate(params, inputs, targets, dropout_rng, model, objective,
                microbatches: int, mesh, carried: tuple[str, ...] = (), corpus=None):
  """Loss, metrics and gradient of the whole batch, one micro-batch at a time.

  The objective's loss is a sum of means, ``sum_t S_t / C_t``
  (``objectives.base.loss_terms``),
  whose denominators C_t (used MLM slots, real examples) do not depend on the
  parameters. They are totalled over the micro-batches first, from a loss
  evaluation on zero outputs, so that each micro-batch contributes
  ``sum_t S_t,i / C_t`` and the summed gradient equals the big batch's. Dropout
  draws a key per micro-batch: with dropout on, the masks differ from those of
  the unaccumulated step (same distribution); without dropout the update is
  the same to float rounding.

  Args:
    params: the parameters (float32 pytree).
    inputs, targets: the corrupted global batch, leading dimension B.
    dropout_rng: this step's dropout key.
    microbatches: M; B must be divisible by M.
    mesh: when given, each micro-batch stays split over the batch axes.
    carried: names of the carry in ``inputs``; each micro-batch's rows get
      their own rows' carry and return their next carry, which is put back
      in row order, so the carry is the one the big batch gives.
    corpus: a mixture's one-hot row labels [B, C] (``corpus_metrics``), or None.

  Returns:
    (loss scalar, metrics {name: (sum, count)}, gradient pytree like params,
    next carry {name: [B, ...]}).
  """
  def split(x):
    # Row r goes to micro-batch r % M: every device's contiguous block of rows
    # then feeds every micro-batch, so no micro-batch lives on a few devices.
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    if mesh is not None:
      spec = jax.sharding.PartitionSpec(None, ("data", "fsdp"))
      x = jax.lax.with_sharding_constraint(
          x, jax.sharding.NamedSharding(mesh, spec))
    return x

  def merge(x):
    # The inverse of split: [M, B / M, ...] back to row order [B, ...].
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape((x.shape[0] * microbatches,) + x.shape[2:])

  micro_inputs = jax.tree.map(split, inputs)
  micro_targets = jax.tree.map(split, targets)
  micro_corpus = None if corpus is None else split(corpus)
  first = jax.tree.map(lambda x: x[0], (micro_inputs, micro_targets))
  out_shapes = jax.eval_shape(
      lambda p, xy: objectives.base.forward(
          objective, objectives.base.bind(model, p, deterministic=True), *xy),
      params, first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shapes)
  count_metrics = jax.vmap(lambda t: objective.loss(zeros, t)[1])(micro_targets)
  terms = objectives.base.loss_terms(objective, count_metrics)
  totals = {t: jnp.maximum(jnp.sum(count_metrics[t][1]), 1.0) for t in terms}

  def body(carry, micro):
    grads, metrics, index = carry
    x, y, c = micro

    def loss_fn(p):
      apply = objectives.base.bind(
          model, p, deterministic=False,
          dropout_rng=jax.random.fold_in(dropout_rng, index))
      outputs = objectives.base.forward(objective, apply, x, y)
      _, m = objective.loss(outputs, y)
      m = {**m, **corpus_metrics.mlm_sums(outputs, y, c)}
      return (sum(m[t][0] / totals[t] for t in terms),
              (m, {k: outputs[k] for k in carried}))

    (part, (m, carry)), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    m = dict(m)
    m["loss"] = (part, jnp.zeros((), jnp.float32))
    grads = jax.tree.map(jnp.add, grads, g)
    metrics = jax.tree.map(jnp.add, metrics, m)
    return (grads, metrics, index + 1), carry

  first_y, first_c = jax.tree.map(lambda x: x[0], (micro_targets, micro_corpus))
  metric_shapes = jax.eval_shape(lambda: {
      **objective.loss(zeros, first_y)[1],
      **corpus_metrics.mlm_sums(zeros, first_y, first_c)})
  zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
  zero_metrics["loss"] = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  (grads, metrics, _), carry = jax.lax.scan(
      body, (zero_grads, zero_metrics, jnp.int32(0)),
      (micro_inputs, micro_targets, micro_corpus))
  loss = metrics["loss"][0]
  metrics["loss"] = (loss, jnp.ones((), jnp.float32))
  return loss, metrics, grads, jax.tree.map(merge, carry)


def make_train_step(model, objective, tx, state_shardings, mesh, *,
                    debug_nan_step: int = -1, microbatches: int = 1):
  """Jits ``train_step`` once with in/out shardings and a donated state."""
  return jax.jit(
      sharding.with_rules(functools.partial(
          train_step, model=model, objective=objective, tx=tx,
          debug_nan_step=debug_nan_step, microbatches=microbatches, mesh=mesh),
          mesh),
      in_shardings=(state_shardings, sharding.batch_sharding(mesh),
                    sharding.replicated(mesh)),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=(0,))


def to_global(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """Turns this host's share of a batch into global arrays split over ``mesh``."""
  sh = sharding.batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sh, v) for k, v in batch.items()}


def train_and_evaluate(config, workdir: str, *,
                       stop_at_step: int | None = None) -> dict[str, Any] | None:
  """Prepares data if needed, trains (resuming from the latest checkpoint),
  then evaluates on the held-out split.

  Before anything is written, the config is checked against the newest
  checkpoint's (bertjax/compat.py); then the workdir is locked for the run
  (bertjax/workdir_lock.py) and damaged checkpoints are set aside
  (bertjax/checkpointing.py).

  Args:
    config: the run's ConfigDict (configs/*.py).
    workdir: where data (unless config.data_dir), checkpoints and metrics go.
    stop_at_step: stop early at this step with a checkpoint and no evaluation,
      as a preempted run would; the next call resumes from there.

  Returns:
    The final evaluation record (also written to ``workdir/eval_<step>.json``),
    or None when stopped early.

  Raises:
    guards.Preempted: SIGTERM (or a pod's preemption notice, or Ctrl-C in
      the train loop) came; the message says what was saved.
    ValueError: bad input, refused with one sentence.
  """
  preemption = guards.PreemptionWatcher()
  try:
    # First: a host started with other flags would fail elsewhere, or not at
    # all; one that got SIGTERM before JAX's notifier was there stops them all.
    workdir = paths.absolute(workdir)
    signalled = multihost.check_same_run(
        config.to_dict(), {"workdir": workdir,
                           "data_dir": layout.resolve_data_dir(config, workdir),
                           "stop_at_step": stop_at_step},
        preemption.signalled())
    if signalled:
      raise guards.Preempted.during_start_up(signalled)
    config_validation.validate(config, variant=False)
    compat.allowed(config)  # a misspelt allow_changes fails before anything
    layout.check_directories(config, workdir)  # reads only: no file in the way
    newest = checkpointing.newest_saved_config(workdir)
    compat.check_workdir_kind(newest, config, workdir)
    if newest is not None:  # read-only: a refusal leaves the workdir as it was
      newest_step, saved, where = newest
      compat.check(saved, config, where, layout_only=newest_step == 0,
                   imported=newest_step == 0 and compat.is_import(saved))
      compat.check_not_past_end(newest_step, config, where)
    # After the comparison, whose message is the clearer one where an
    # objective is set on another system's workdir.
    config_validation.check_variant(config)
    # e.g. text files that match nothing (and were never prepared)
    prepare.check_inputs(config, prepare.resolve_data_dir(config, workdir), workdir)
    lock = workdir_lock.hold(workdir, jax.process_index())
    try:
      return _train_and_evaluate(config, workdir, stop_at_step, preemption,
                                 lock.check if lock is not None else lambda: None)
    finally:
      if lock is not None:
        lock.release()
  finally:
    preemption.close()


def _train_and_evaluate(config, workdir, stop_at_step, preemption, still_held):
  """``train_and_evaluate`` once the workdir is held; ``still_held()`` raises
  once another run has taken the workdir's lock over (a gs:// lease)."""
  restart = bool(config.get("restart_from_scratch", False))
  checkpointer = checkpointing.Checkpointer(workdir, keep=config.keep_checkpoints)
  logged = set()

  def compatible(step):
    # A checkpoint of step 0 (an import by bertjax.convert) has consumed no
    # data and no schedule: any stream may start from it, only the layout
    # must match.
    changes = compat.check(checkpointer.saved_config(step), config,
                           checkpointer.where(step), layout_only=step == 0)
    if step not in logged:
      logged.add(step)
      for change in changes:
        logging.info("Resuming with %s (%s).", change.describe(),
                     "allowed by --config.allow_changes"
                     if change.kind != compat.SAFE else "safe to change")

  start = checkpointer.usable_step(compatible, restart_from_scratch=restart)
  if start is not None:
    if restart:
      logging.warning("--config.restart_from_scratch has no effect: checkpoint %d "
                      "is usable and is resumed.", start)
    verified = checkpointer.verify(start).status == "ok"
    logging.info("Resuming from the checkpoint at step %d (%s).", start,
                 "checksums verified" if verified else "no checksums to verify")
  if preemption.before_first_step():
    raise guards.Preempted.before_first_step(start)
  # Process 0 prepares what is missing while the others wait (bertjax/multihost.py).
  data_dir = prepare.resolve_data_dir(config, workdir)
  try:  # SIGTERM stops preparing at once, as it stops bertjax.prepare (one process)
    with guards.sigterm_raises():
      prepared = multihost.process_0_first(lambda: prepare.prepare(config, data_dir),
                                           "prepare the data")
  except guards.Terminated:
    raise guards.Preempted.while_preparing(start) from None
  config_validation.check_prepared(config, prepared)
  if start is not None:
    checkpointer.check_tokenizer(prepared.fingerprint, start)
  mesh = sharding.make_mesh(config.mesh_shape)
  config_validation.check_mesh(config, mesh)

  model = models.get_model(config)
  objective = objectives.get_objective(config)
  tx = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(config)
  local_batch = config.batch_size // jax.process_count()
  source = prepared.source(config.train_split)
  labels = prepared.labels() if hasattr(prepared, "labels") else []  # a mixture's
  train_iter = corpus_metrics.labelled(pipeline.make_train_iterator(
      config, source, local_batch_size=local_batch,
      process_index=jax.process_index(), process_count=jax.process_count()),
      source, len(labels))

  def acceptable(step):
    compatible(step)
    checkpointer.check_tokenizer(prepared.fingerprint, step)

  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  restore_as = (abstract, shardings)
  if start == 0:
    # An import (bertjax.convert) holds XLNet's memory empty, with a row per
    # row of the batch_size it was imported with; any batch_size may continue
    # it (layout_only above), so it is read at its own rows and started anew.
    restore_as = state_lib.with_carry_rows(
        abstract, shardings, int(checkpointer.saved_config(0).get(
            "batch_size", config.batch_size)), mesh)
  restored = checkpointer.restore_latest(*restore_as, acceptable,
                                         restart_from_scratch=restart)
  if restored is None:
    state, shardings = state_lib.create_train_state(model, tx, config, mesh)
    logging.info("Initialised %s-%s with %d parameters.", config.model,
                 config.model_size, models.count_params(state.params))
  else:
    latest, state, data_state = restored
    if data_state:  # an imported checkpoint (bertjax.convert) starts the data afresh
      train_iter.set_state(data_state)
    if latest == 0 and state.carry:
      state = state.replace(carry=jax.device_put(
          state_lib.empty_carry(model, config), shardings.carry))
    logging.info("Resuming from step %d.", latest)
  step = int(jax.device_get(state.step))
  if preemption.before_first_step():
    raise guards.Preempted.before_first_step(None if restored is None else step)

  step_fn = make_train_step(model, objective, tx, shardings, mesh,
                            debug_nan_step=config.debug_nan_step,
                            microbatches=config.microbatches)
  eval_fn = evaluation.make_eval_step(config, mesh, model, objective)
  rng = jax.random.key(config.seed)
  # Rows logged after the starting step are about to be redone: those of an
  # interrupted run, or of a run killed before its first checkpoint when
  # this one starts from step 0.
  writer = metrics_lib.MetricWriter(workdir, resumed_at=step)
  progress = progress_lib.Progress(config, step)
  best = checkpointing.BestCheckpoint(workdir)
  nonfinite = guards.NonFiniteGuard(config.nonfinite, config.max_consecutive_skips)
  # Evaluations stop early on SIGTERM (on pods: all hosts before the same batch).
  eval_stop = preemption.should_stop_evaluating
  last = config.num_train_steps if stop_at_step is None else min(
      stop_at_step, config.num_train_steps)
  acc, pending, previous, saved_step = None, None, None, None
  periodic = (None, None)  # (step, record) of the latest periodic evaluation
  preemption.catch_interrupt()  # Ctrl-C from here on: a checkpoint, then stop

  def save(step, state):
    nonlocal previous, saved_step, pending
    still_held()  # never write over the checkpoints of a run that took over
    if previous is not None:
      nonfinite.check(*previous)  # never checkpoint a step that went bad
      previous = None
    # The step's row goes out (uploaded too) before its checkpoint can commit:
    # a run killed after the commit resumes past this step and never logs it.
    if pending is not None:
      progress_lib.write_train_metrics(writer, progress, schedule, *pending, labels)
      pending = None
    writer.flush()
    checkpointer.save(step, state, train_iter.get_state(), config,
                      prepared.fingerprint)
    saved_step = step

  def periodic_evaluation(step, state) -> bool:
    """Evaluates ``state`` at ``step``, logs it and offers it as the best;
    False when a stop abandoned it (nothing logged)."""
    nonlocal periodic
    record = evaluation.evaluate_params(config, state.params, prepared, mesh, model,
                                        objective, should_stop=eval_stop, step_fn=eval_fn)
    if record is None:
      return False
    writer.write(step, record, prefix="eval_", flush=True)
    periodic = (step, record)
    best.offer(step, record.get("loss", record["mlm_loss"]), state,
               train_iter.get_state(), config, prepared.fingerprint)
    return True

  multihost.barrier("first step")  # the hosts start their steps together
  try:
    with sharding.use_mesh(mesh):
      if restored is not None and _evaluation_skipped(config, workdir, step):
        # A stop (SIGTERM, Ctrl-C) at or during this step's periodic
        # evaluation skipped it; its checkpoint is the one resumed from.
        if not periodic_evaluation(step, state):
          raise guards.Preempted(step)
      while step < last:
        still_held()
        host_batch = next(train_iter)
        state, step_metrics = step_fn(state, to_global(host_batch, mesh), rng)
        step += 1
        acc = metrics_lib.add(acc, step_metrics)
        # The previous step's flags and metrics are read now, one step late,
        # so the host never waits for the device.
        if previous is not None:
          nonfinite.check(*previous)
        previous = (step, step_metrics["skipped"])
        if pending is not None:
          progress_lib.write_train_metrics(writer, progress, schedule, *pending, labels)
          pending = None
        if step % config.log_every_steps == 0 or step == last:
          pending, acc = (step, acc, _batch_hash(host_batch)), None
        stopping = preemption.should_stop(step)
        if step % config.checkpoint_every_steps == 0 or step == last or stopping:
          save(step, state)
        if not stopping and config.eval_every_steps and (
            step % config.eval_every_steps == 0):
          if not periodic_evaluation(step, state):  # SIGTERM during the evaluation
            stopping = True
            if saved_step != step:
              save(step, state)
        if stopping:  # saved above, its row with it
          checkpointer.wait()
          raise guards.Preempted(step)
      if previous is not None:
        nonfinite.check(*previous)
  except BaseException:
    writer.close()
    raise
  finally:
    checkpointer.close()  # the last checkpoint is committed before the evaluation
    best.close()
  # The final evaluation logs through the run's writer, closed only after it,
  # so that each start of a run writes one TensorBoard event file.
  try:
    still_held()
    if step < config.num_train_steps:
      logging.info("Stopped at step %d with a checkpoint; run again to resume.", step)
      return None
    if periodic[0] == step:  # the last step's periodic evaluation is the final one
      record = {"step": step, **periodic[1]}
    else:
      record = evaluation.evaluate_params(config, state.params, prepared, mesh, model,
                                          objective, should_stop=eval_stop,
                                          step_fn=eval_fn)
      if record is None:
        raise guards.Preempted.during_final_evaluation(step)
      record = {"step": step, **record}
      if not metrics_lib.has_row(workdir, step, "eval_"):  # a finished run run again
        writer.write(step, {k: v for k, v in record.items() if k != "step"},
                     prefix="eval_")
  finally:
    writer.close()
  still_held()
  evaluation.write_record(workdir, record)
  print(json.dumps(record), flush=True)
  return record


def _evaluation_skipped(config, workdir: str, step: int) -> bool:
  """Whether ``step``, resumed from, is a periodic evaluation's step before
  the last with no evaluation row in metrics.jsonl (process 0's log: its
  answer holds on every process, a collective, called by all)."""
  every = config.eval_every_steps
  if not (every and 0 < step < config.num_train_steps and step % every == 0):
    return False
  return bool(multihost.gather_json(not metrics_lib.has_row(workdir, step, "eval_"))[0])


def _batch_hash(batch: dict[str, np.ndarray]) -> int:
  """A 63-bit digest of a host batch: resumed runs must see identical batches
  (a mixture's corpus labels, made from example_id, left out)."""
  digest = hashlib.sha256()
  for name in sorted(set(batch) - {corpus_metrics.FIELD}):
    digest.update(np.ascontiguousarray(batch[name]).tobytes())
  return int.from_bytes(digest.digest()[:8], "little") >> 1

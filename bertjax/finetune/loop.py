"""``run(config, init, workdir)``: fine-tune an encoder on a task; returns metrics.

What is reused from pretraining, and what is not:
  * the step: ``train.make_train_step`` (jitted once, in/out shardings, donated
    state; an update with a NaN/Inf loss or gradient is not applied), with ``objective.FineTuneObjective`` as objective
    and ``heads.FineTuneModel`` as model;
  * the state and its sharded layout (``state.state_shardings``), the optimizer
    (``optim.make_optimizer``, with layer-wise learning-rate decay chained on:
    ``layer_decay``),
    the mesh (``sharding``), the orbax checkpoints and their compatibility
    check (``checkpointing.Checkpointer``, ``checks.check_resume``), the best checkpoint
    (``checkpointing.BestCheckpoint``, fed the negated main metric), the metric
    writer (JSON lines + TensorBoard), the non-finite policy
    (``guards.NonFiniteGuard``: ``config.nonfinite`` 'stop' ends the run at the
    first skipped update with nothing saved after the last good step, 'skip'
    carries on until ``config.max_consecutive_skips`` in a row; the count of
    skipped updates is in the returned record as ``skipped_steps``).
  * Not reused: ``train._train_and_evaluate``'s loop body, which is tied to
    prepared pretraining shards, the grain pipeline and masked-LM evaluation.
    A task's examples fit in host memory, so the data source here is an
    in-memory, seed-permuted epoch iterator whose state is one integer, and
    evaluation decodes predictions on the host (spans, tags) for library
    metrics. The loop below is therefore short; it is the same sequence
    (restore -> step -> log -> checkpoint -> evaluate) as pretraining's.

Resume is exact: the state, the iterator position and the config are saved
together every ``checkpoint_every_steps`` and at every epoch's end; dropout
keys are ``fold_in(seed, step)``, batch order a function of (seed, epoch).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath
from flax import linen as nn

from bertjax import checkpointing
from bertjax import compat
from bertjax import evaluation as evaluation_lib
from bertjax import guards
from bertjax import metrics as metrics_lib
from bertjax import paths
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax import workdir_lock
from bertjax.finetune import checks
from bertjax.finetune import encoder_init
from bertjax.finetune import features as features_lib
from bertjax.finetune import layer_decay
from bertjax.finetune import metrics as task_metrics
from bertjax.finetune import objective as objective_lib
from bertjax.finetune import predict as predict_lib
from bertjax.finetune import tasks as tasks_lib
from bertjax.models import heads

MAIN_METRIC = {"classification": "accuracy", "regression": "pearson",
               "tagging": "entity_f1", "qa": "f1"}


# -------------------------------------------------------------------- the data
class EpochIterator:
  """Batches of example indices: epoch e is a permutation keyed by (seed, e),
  cut into ``n // batch`` global batches. Its state is the batches taken."""

  def __init__(self, num_examples: int, batch_size: int, seed: int, *,
               process_index: int = 0, process_count: int = 1):
    self.n, self.batch, self.seed = num_examples, batch_size, seed
    self.per_epoch = num_examples // batch_size
    self.local = batch_size // process_count
    self.offset = process_index * self.local
    self.taken = 0

  def next_indices(self) -> np.ndarray:
    epoch, k = divmod(self.taken, self.per_epoch)
    order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
    self.taken += 1
    rows = order[k * self.batch:(k + 1) * self.batch]
    return rows[self.offset:self.offset + self.local]

  def get_state(self) -> dict[str, Any]:
    return {"taken": int(self.taken)}

  def set_state(self, state: dict[str, Any]) -> None:
    self.taken = int(state["taken"])


def _device_batch(feats: dict[str, np.ndarray], kind: str, rows: np.ndarray,
                  valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
  out = {k: feats[k][rows] for k in features_lib.DEVICE_KEYS[kind]}
  out["weight"] = (np.ones(len(rows), np.float32) if valid is None
                   else valid.astype(np.float32))
  return out


# ------------------------------------------------------------------ the config
def run_config(config, task: tasks_lib.Task, num_train: int) -> ml_collections.ConfigDict:
  """The config the run saves: the user's plus what the task and data decide."""
  c = ml_collections.ConfigDict(config.to_dict())
  if c.batch_size < 1 or c.batch_size % jax.process_count():
    raise ValueError(f"batch_size {c.batch_size} must be a positive multiple of the "
                     f"{jax.process_count()} hosts; fix --config.batch_size.")
  checks.check_steps(c, num_train)
  c.task_kind = task.kind
  c.num_labels = task.num_outputs
  c.output_names = "\t".join(task.label_names)  # for bertjax.load (finetune.inference)
  # Resolved, so that a model loaded without its task decodes as the run did.
  c.no_answer = "on" if tasks_lib.predicts_no_answer(config, task) else "off"
  c.steps_per_epoch = num_train // c.batch_size
  c.num_train_steps = int(round(c.num_epochs * c.steps_per_epoch))
  c.warmup_steps = int(c.warmup_fraction * c.num_train_steps)
  c.max_predictions_per_seq = 1
  if not c.main_metric:
    c.main_metric = MAIN_METRIC[task.kind]
  checks.check_main_metric(c.main_metric, task.kind, task.num_outputs,
                           tasks_lib.predicts_no_answer(c, task))
  return c


def _loss_sign(cfg) -> float:
  """``checkpointing.BestCheckpoint`` minimises sign * the main metric: the
  metric negated unless lower is better (mse)."""
  return 1.0 if cfg.main_metric in task_metrics.LOWER_IS_BETTER else -1.0


def _best_loss(cfg, record: dict[str, Any]) -> float:
  return _loss_sign(cfg) * float(record[cfg.main_metric])


def _restore(checkpointer, abstract, shardings, accept, init: str, workdir: str):
  """``checkpointer.restore_latest``, with a checkpoint that is intact but
  does not restore blamed on ``--init``: the fine-tuning config does not
  describe the encoder, the init does (a workdir without ``init.json``)."""
  try:
    return checkpointer.restore_latest(abstract, shardings, accept)
  except checkpointing.StateMismatch as e:
    raise ValueError(
        f"The fine-tuning checkpoints in {workdir} do not fit the encoder that "
        f"--init={init} builds, so they were fine-tuned from another init; pass the "
        "--init this workdir was started from, or a new --workdir.") from e


# ------------------------------------------------------------------ evaluation
def predict_step(model, kind: str) -> Callable[[Any, dict[str, jax.Array]], jax.Array]:
  """The jitted map from (params, device batch) to the head's logits. A run
  builds it once, so that every evaluation after the first reuses its traced
  and compiled program (one built per evaluation was traced and compiled
  again each epoch)."""
  @jax.jit
  def step(p, batch):
    out = model.apply({"params": p}, objective_lib.model_inputs(batch), deterministic=True)
    if kind == "qa":
      return jnp.stack(objective_lib.span_logits(out["logits"], batch["context_mask"]), -1)
    return out["logits"]

  return step


def predict(step, params, feats, kind: str, batch_size: int, mesh, *,
            should_stop=None) -> np.ndarray | None:
  """Head logits of every feature row (float32, leading axis = rows), by
  ``step`` (``predict_step``) a batch at a time; None when ``should_stop``,
  asked before each batch, says to stop."""
  n = len(feats["tokens"])
  outs = []
  with sharding.use_mesh(mesh):
    for lo in range(0, n, batch_size):
      if should_stop is not None and should_stop():
        return None
      rows = np.arange(lo, lo + batch_size)
      valid = rows < n
      batch = _device_batch(feats, kind, np.minimum(rows, n - 1), valid)
      logits = step(params, train.to_global(batch, mesh))
      outs.append(np.asarray(jax.device_get(logits))[valid])
  return np.concatenate(outs)


# ---------------------------------------------------------------------- run
def run(config, init: str, workdir: str, *, stop_at_step: int | None = None) -> dict[str, Any]:
  """Fine-tunes the encoder of ``init`` on ``config.task``; evaluates every epoch.

  Args:
    config: a configs/finetune.py ConfigDict.
    init: a bertjax workdir (latest checkpoint) or an HF model directory; its
      tokenizer comes with it. ``config.random_init`` keeps only its
      architecture and tokenizer (the baseline of "do pretrained weights help").
    workdir: checkpoints, metrics.jsonl, tensorboard/, eval_<step>.json and
      predictions_<split>.jsonl (gs:// works for the files written here).
    stop_at_step: stop there with a checkpoint, as a preempted run would.

  Returns:
    The last evaluation: ``{'step', 'epoch', <metrics>, 'main_metric',
    'skipped_steps' (updates of this process's run not applied: NaN/Inf),
    'best': {'step', <main metric>}, 'predicted': {name: examples} where
    ``config.predict_files`` / ``predict_split`` were predicted
    (``predict`` module)}``, or None when stopped early.

  Raises:
    guards.NonFiniteLoss: a NaN/Inf loss or gradient under the
      ``config.nonfinite`` policy (module docstring).
    guards.Preempted: SIGTERM or Ctrl-C came; a checkpoint of the step it
      came at was saved (``bertjax.finetune`` prints it and exits 75 or 130).
  """
  # As every user path enters (``~`` expanded, a gs:// path's slashes made one).
  workdir = paths.absolute(workdir)
  init = paths.absolute(init) if init else init  # None: the workdir's own
  checks.check_config(config)
  checks.check_directories(config, workdir)
  # A pretraining workdir as --workdir: said before the task or init is read.
  compat.check_workdir_kind(checkpointing.newest_saved_config(workdir), config, workdir)
  # The task's files are read before the init's weights: bad task input is
  # refused before anything is loaded onto a device.
  task = tasks_lib.load(config)
  checks.check_metric_libraries(task.kind)
  if config.main_metric:
    checks.check_main_metric(config.main_metric, task.kind, task.num_outputs,
                             tasks_lib.predicts_no_answer(config, task))
  if config.max_train_examples:
    task.train = task.train[:config.max_train_examples]
  if config.max_eval_examples:
    task.eval = task.eval[:config.max_eval_examples]
  to_predict = predict_lib.inputs(config, task)
  if not init:  # a workdir that has fine-tuned before names its own
    init = encoder_init.recorded(workdir) or ""
  fields, loaded, tokenizer, init_step = encoder_init.load(init)
  # Before the state is built: a workdir started from another init is refused.
  init_record = encoder_init.identify(init, fields, loaded, init_step)
  encoder_init.check(workdir, init_record, str(getattr(tokenizer, "fingerprint", "")))
  separators, single = encoder_init.encoder_layout(fields, tokenizer)
  encoder = features_lib.Encoder(tokenizer, config.seq_len, pair_separators=separators,
                                 single_segment=single)
  checks.check_positions(config, fields)
  train_feats = features_lib.build(encoder, task, task.train, config)
  eval_feats = features_lib.build(encoder, task, task.eval, config)
  to_predict = [(name, ex, features_lib.build(encoder, task, ex, config))
                for name, ex in to_predict]
  cfg = run_config(config, task, len(train_feats["tokens"]))
  newest = checkpointing.newest_saved_config(workdir)
  if newest is not None:  # read-only: a refusal leaves the workdir as it was
    checks.check_resume(newest[1], cfg, newest[2], len(train_feats["tokens"]))
  # One run per workdir, as in pretraining: a second one is refused.
  lock = workdir_lock.hold(workdir, jax.process_index())
  try:
    return _run_held(cfg, task, fields, loaded, tokenizer, train_feats, eval_feats, to_predict,
                     init, init_record, workdir, stop_at_step,
                     lock.check if lock is not None else lambda: None)
  finally:
    if lock is not None:
      lock.release()


def _run_held(cfg, task, fields, loaded, tokenizer, train_feats, eval_feats, to_predict,
              init: str, init_record: dict[str, Any], workdir: str,
              stop_at_step: int | None, still_held: Callable[[], None]):
  """``run`` once its inputs are read and checked and the workdir is held."""
  workdir_path = epath.Path(workdir)
  from bertjax.convert import core
  model = heads.for_task(core.build_model(fields), task.kind, task.num_outputs, cfg)
  objective = objective_lib.FineTuneObjective(task.kind)
  mesh = sharding.make_mesh(cfg.mesh_shape)
  abstract_params = jax.eval_shape(
      lambda r: nn.meta.unbox(model.init({"params": r, "dropout": r},
                                         state_lib.dummy_inputs(cfg))["params"]),
      jax.random.key(0))
  tx = layer_decay.make_optimizer(cfg, abstract_params)
  abstract, shardings = state_lib.state_shardings(model, tx, cfg, mesh)

  checkpointer = checkpointing.Checkpointer(workdir, keep=cfg.keep_checkpoints)
  fingerprint = str(getattr(tokenizer, "fingerprint", ""))

  def accept(step):
    checks.check_resume(checkpointer.saved_config(step), cfg, checkpointer.where(step),
                        len(train_feats["tokens"]))

  restored = _restore(checkpointer, abstract, shardings, accept, init, workdir)
  saved = None  # the config of the checkpoint resumed from
  it = EpochIterator(len(train_feats["tokens"]), cfg.batch_size, cfg.seed,
                     process_index=jax.process_index(), process_count=jax.process_count())
  if restored is None:
    encoder_init.write(workdir, init_record)
    state = _initial_state(model, tx, cfg, abstract_params, shardings, loaded, mesh)
  else:
    step, state, data_state = restored
    saved = checkpointer.saved_config(step)
    it.set_state(data_state)
    logging.info("Resuming fine-tuning from step %d.", step)
  step = int(jax.device_get(state.step))

  step_fn = train.make_train_step(model, objective, tx, shardings, mesh,
                                  debug_nan_step=cfg.get("debug_nan_step", -1))
  predict_fn = predict_step(model, task.kind)
  nonfinite = guards.NonFiniteGuard(cfg.get("nonfinite", "stop"),
                                    cfg.get("max_consecutive_skips", 10))
  rng = jax.random.key(cfg.seed)
  # Rows a killed run logged after the step resumed from (all of them, when
  # it saved no checkpoint) are dropped: those steps are about to be redone.
  writer = metrics_lib.MetricWriter(workdir, resumed_at=step)
  best = checkpointing.BestCheckpoint(
      workdir, metric=f"held-out {cfg.main_metric}", sign=_loss_sign(cfg))
  last = cfg.num_train_steps if stop_at_step is None else min(stop_at_step, cfg.num_train_steps)
  record, acc, t0, s0 = None, None, time.time(), step
  previous = None  # (step, its 'skipped' flag), read one step late

  def check_previous():
    nonlocal previous
    if previous is not None:
      nonfinite.check(*previous)
      previous = None

  preemption = guards.PreemptionWatcher()
  preemption.catch_interrupt()  # Ctrl-C too: a checkpoint of the step, then stop
  # Every evaluation and the predictions stop early on SIGTERM (on pods every
  # host before the same batch), as pretraining's do; an epoch's end is
  # checkpointed before its evaluation, which the resumed run then does
  # (``_epoch_end_unevaluated``). The watcher is held until the last file is
  # written: closed before them, SIGTERM killed the run with status 143 and no word.
  eval_stop = preemption.should_stop_evaluating

  copy = ""  # the final evaluation's suffix ('' or '-2' ...), which the predict files share

  def final_evaluation(saved_config, metrics_writer):
    """``evaluate`` of the last step, which SIGTERM stops (``eval_stop``)."""
    nonlocal copy
    out = evaluate(cfg, task, predict_fn, state.params, eval_feats, mesh, step, workdir_path,
                   metrics_writer, saved=saved_config, should_stop=eval_stop)
    if out is None:
      checkpointer.wait()
      raise guards.Preempted.during_final_evaluation(step)
    record, copy = out
    return record

  def epoch_evaluation(metrics_writer):
    """``evaluate`` at an epoch's end before the last, which SIGTERM stops too."""
    out = evaluate(cfg, task, predict_fn, state.params, eval_feats, mesh, step, workdir_path,
                   metrics_writer, should_stop=eval_stop)
    if out is None:
      checkpointer.wait()
      raise guards.Preempted.during_evaluation_of_epoch(step)
    return out[0]

  with contextlib.closing(preemption):
    try:
      if preemption.before_first_step():  # during start-up: nothing new to save
        raise guards.Preempted.before_first_step(None if restored is None else step)
      with sharding.use_mesh(mesh):
        if _epoch_end_unevaluated(cfg, step, workdir_path):  # stopped there before
          record = (final_evaluation(saved, writer) if step == cfg.num_train_steps
                    else epoch_evaluation(writer))
          best.offer(step, _best_loss(cfg, record), state, it.get_state(), cfg, fingerprint)
        while step < last:
          still_held()  # a gs:// lease another run took over (bertjax/gcs_lease.py)
          batch = _device_batch(train_feats, task.kind, it.next_indices())
          state, m = step_fn(state, train.to_global(batch, mesh), rng)
          step += 1
          acc = metrics_lib.add(acc, m)
          check_previous()  # the step before this one: the device has moved on
          previous = (step, m["skipped"])
          if step % cfg.log_every_steps == 0 or step == last:
            scalars = metrics_lib.reduce(acc)
            acc = None
            rate = (step - s0) / max(time.time() - t0, 1e-9)
            scalars["examples_per_sec"] = rate * cfg.batch_size
            writer.write(step, scalars)
            shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(scalars.items())
                             if k in ("loss", "task_loss", "task_accuracy"))
            left = time.strftime("%H:%M:%S", time.gmtime((cfg.num_train_steps - step) / max(rate, 1e-9)))
            line = (f"step {step}/{cfg.num_train_steps} epoch "
                    f"{step / cfg.steps_per_epoch:.2f}/{cfg.num_epochs} {shown} "
                    f"examples/s={scalars['examples_per_sec']:.0f} time_left={left}")
            logging.info("%s", line)
            print(line, flush=True)
          epoch_end = step % cfg.steps_per_epoch == 0 or step == cfg.num_train_steps
          stopping = preemption.should_stop(step)
          if (step % cfg.checkpoint_every_steps == 0 or epoch_end or step == last
              or stopping):
            check_previous()  # never checkpoint a step that went bad
            still_held()
            checkpointer.save(step, state, it.get_state(), cfg, fingerprint)
            writer.flush()  # a run resumed from here finds every row up to it
          if stopping:  # the resumed run evaluates an epoch's end it skipped
            checkpointer.wait()
            raise guards.Preempted(step)
          if epoch_end:
            record = (final_evaluation(None, writer) if step == cfg.num_train_steps
                      else epoch_evaluation(writer))
            best.offer(step, _best_loss(cfg, record), state, it.get_state(), cfg, fingerprint)
        check_previous()
        if step == cfg.num_train_steps and record is None:
          # A finished run started again: evaluated once more, its record
          # beside the run's own where the settings differ (``evaluate``).
          record = final_evaluation(saved, None)
    finally:
      checkpointer.close()
      writer.close()
      best.close()
    if step < cfg.num_train_steps:
      logging.info("Stopped at step %d with a checkpoint; run again to resume.", step)
      return None
    record["skipped_steps"] = nonfinite.total
    record["best"] = {"step": best.best["step"],
                      cfg.main_metric: _loss_sign(cfg) * best.best["loss"]}
    # With the best evaluation's parameters (predict module); where the final
    # evaluation went beside the run's own record, so do they: the run's own
    # predict_<name>.jsonl is kept, these go to predict_<name>-2.jsonl.
    if to_predict:
      params = predict_lib.best_params(workdir, best.best["step"], abstract, shardings)
      for name, examples, feats in to_predict:
        logits = predict(predict_fn, params, feats, task.kind, cfg.batch_size, mesh,
                         should_stop=eval_stop)
        if logits is None:
          raise guards.Preempted.during_final_predictions(step)
        if jax.process_index() == 0:
          predict_lib.write(workdir_path / f"predict_{name}{copy}.jsonl",
                            predict_lib.records(task, examples, feats, logits, cfg))
        if copy:
          logging.info("Wrote predict_%s%s.jsonl beside the run's own predict_%s.jsonl, "
                       "which is kept.", name, copy, name)
      record["predicted"] = {name: len(examples) for name, examples, _ in to_predict}
  print(json.dumps(record), flush=True)
  return record


def _epoch_end_unevaluated(cfg, step: int, workdir: epath.Path) -> bool:
  """Whether a resumed run starts at an epoch's end (or the last step) whose
  evaluation a stop (SIGTERM, Ctrl-C) skipped: no eval_<step>.json there."""
  return (0 < step <= cfg.num_train_steps
          and (step % cfg.steps_per_epoch == 0 or step == cfg.num_train_steps)
          and not (workdir / f"eval_{step}.json").exists())


def _initial_state(model, tx, cfg, abstract_params, shardings, loaded, mesh):
  """Head (and, with ``random_init``, encoder) drawn at random; the encoder
  otherwise the init's parameters, placed with the state's shardings. With an
  init only the head is returned, so the encoder's draws are dead code, never
  compiled or run (MiniLM's init compiles in 0.4 s, not 3.1-3.3 s); flax keys
  each parameter by its path, so the head's numbers are unchanged."""
  drawn = [k for k in abstract_params if cfg.random_init or k != "encoder"]

  def init(rng):
    params = nn.meta.unbox(model.init({"params": rng, "dropout": rng},
                                      state_lib.dummy_inputs(cfg))["params"])
    return {k: params[k] for k in drawn}

  if not cfg.random_init:  # before anything is drawn
    want = jax.tree.map(lambda a: tuple(a.shape), abstract_params["encoder"])
    if want != jax.tree.map(lambda a: tuple(np.shape(a)), loaded):
      raise ValueError("The --init checkpoint's parameters do not fit the encoder its "
                       "config describes; re-import it with bertjax.convert.")
  rng = jax.random.fold_in(jax.random.key(cfg.seed), 0x1417)
  with sharding.use_mesh(mesh):
    params = jax.jit(init, out_shardings={k: shardings.params[k] for k in drawn})(rng)
    if not cfg.random_init:
      params["encoder"] = jax.device_put(
          jax.tree.map(lambda a: np.asarray(a, np.float32), loaded), shardings.params["encoder"])
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  return state_lib.TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step),
                              params=params, opt_state=opt_state)


def evaluate(cfg, task, predict_fn, params, eval_feats, mesh, step: int,
             workdir: epath.Path, writer, *, saved=None, should_stop=None
             ) -> tuple[dict[str, Any], str] | None:
  """Scores the eval split with ``predict_fn`` (``predict_step``); writes
  eval_<step>.json and predictions_<split>.jsonl and returns (the record, the
  suffix its files got: '' or '-2', '-3' ...); None when ``should_stop``
  said to stop (nothing written).

  ``saved``: the checkpoint's config, when a finished run is evaluated again.
  The run's own record is then never replaced by one that says something
  else (safe changes such as max_eval_examples or no_answer_threshold are
  accepted on a finished run): as ``bertjax.evaluate`` does, this one goes to
  eval_<step>-2.json (-3 ...) with ``config_changes``, its predictions to
  predictions_<split>-2.jsonl (and ``run`` its predict files to
  predict_<name>-2.jsonl); the same record rewrites the same files.
  """
  logits = predict(predict_fn, params, eval_feats, task.kind, cfg.batch_size, mesh,
                   should_stop=should_stop)
  if logits is None:
    return None
  scores, records = predict_lib.score(task, task.eval, eval_feats, logits, cfg)
  record = {"step": step, "epoch": round(step / cfg.steps_per_epoch, 3), **scores,
            "main_metric": cfg.main_metric, "num_examples": len(task.eval)}
  changes = evaluation_lib.config_changes(saved, cfg) if saved is not None else {}
  if changes:
    record["config_changes"] = changes
  if jax.process_index() == 0:
    workdir.mkdir(parents=True, exist_ok=True)
  written = epath.Path(evaluation_lib.write_record(str(workdir), record,
                                                   keep_others=saved is not None))
  copy = written.name[len(f"eval_{step}"):-len(".json")]  # '' or '-2', '-3' ...
  predictions = workdir / f"predictions_{cfg.eval_split}{copy}.jsonl"
  if jax.process_index() == 0:
    predict_lib.write(predictions, records)
  if copy:
    logging.info("Evaluated step %d with %s; wrote %s and %s beside the run's own "
                 "eval_%d.json and predictions_%s.jsonl, which are kept.", step,
                 ", ".join(f"{k}={v[1]!r} (the run's {v[0]!r})" for k, v in changes.items())
                 or "the same settings but another result", written.name,
                 predictions.name, step, cfg.eval_split)
  if writer is not None:
    writer.write(step, scores, prefix="eval_", flush=True)
  logging.info("Evaluation at step %d: %s", step, json.dumps(scores))
  return record, copy

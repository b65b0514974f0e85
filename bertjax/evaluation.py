"""Held-out evaluation: a fixed-seed pass over the eval split.

The record has ``mlm_loss``, ``mlm_accuracy``, ``nsp_accuracy`` (and any other
metric the objective reports), ``num_tokens`` (non-padding tokens read),
``num_predictions`` (masked positions scored) and ``baseline_mlm_accuracy``:
the accuracy of always predicting the single most frequent token among those
masked positions, the floor a model must clearly beat; with a sentence task,
``baseline_nsp_accuracy`` (or ``_sop_``) likewise: always its majority answer.
"""

from __future__ import annotations

import functools
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp

from bertjax import compat
from bertjax import guards
from bertjax import metrics as metrics_lib
from bertjax import multihost
from bertjax import objectives
from bertjax import paths
from bertjax import sharding
from bertjax.data import pipeline


def eval_step(params, batch, rng, *, model, objective, vocab_size: int):
  """Scores one batch without dropout; masks come from the fixed eval key.

  The batch is scored once per view of the objective
  (``objectives.base.eval_views``; one for most objectives, UniLM's four
  attention masks) and the metrics and counts of the views add up.

  Returns:
    (metrics as {name: (sum, count)}, target-id counts float32 [vocab_size]).
  """
  apply = objectives.base.bind(model, params, deterministic=True)
  metrics = None
  counts = jnp.zeros((vocab_size,), jnp.float32)
  for view in objectives.base.eval_views(objective):
    inputs, targets = view.corrupt(rng, batch, jnp.zeros((), jnp.int32))
    outputs = objectives.base.forward(view, apply, inputs, targets)
    _, view_metrics = view.loss(outputs, targets)
    metrics = metrics_lib.add(metrics, {**view_metrics, **_sentence_labels(
        targets, view_metrics)})
    counts = counts.at[targets["mlm_targets"].reshape(-1)].add(
        targets["mlm_weights"].reshape(-1))
  # The objective's loss is a per-batch mean; over the split it is made from
  # its terms' sums (``_record``).
  metrics.pop("loss")
  real = batch["doc_ids"] > 0
  metrics["num_tokens"] = (jnp.sum(real).astype(jnp.float32), jnp.float32(1.0))
  return metrics, counts


def _sentence_labels(targets, view_metrics) -> dict[str, Any]:
  """``<task>_random``: (rows whose B is not A's continuation (NSP) or is
  swapped (SOP), real rows), for the record's ``baseline_<task>_accuracy``."""
  out = {}
  for key in targets:
    task = key.removesuffix("_labels")
    if key.endswith("_labels") and f"{task}_accuracy" in view_metrics and (
        "example_mask" in targets):
      real = targets["example_mask"].astype(jnp.float32)
      out[f"{task}_random"] = (jnp.sum((targets[key] == 1) * real), jnp.sum(real))
  return out


def make_eval_step(config, mesh, model, objective):
  """The jitted, sharded eval step (``eval_step``) for ``evaluate_params``.

  A training run builds it once: every evaluation after the first then reuses
  its traced and compiled program, where one built per evaluation was traced
  and compiled again at every ``eval_every_steps``.
  """
  return jax.jit(
      sharding.with_rules(functools.partial(
          eval_step, model=model, objective=objective,
          vocab_size=config.vocab_size), mesh),
      in_shardings=(None, sharding.batch_sharding(mesh), sharding.replicated(mesh)),
      out_shardings=sharding.replicated(mesh))


def evaluate_params(config, params, prepared, mesh, model, objective, *,
                    should_stop=None, step_fn=None) -> dict[str, Any] | None:
  """Evaluates ``params`` on ``config.eval_split``; returns the record.

  Of a mixture of corpora (bertjax/data/mixture.py), each corpus's eval split
  is a pass of its own (``eval_max_batches`` each): the record's figures are
  over all of them, and ``<corpus>/<metric>`` entries give each corpus's.
  ``should_stop``: checked before each batch; when it returns True the
  evaluation is abandoned and None returned (a preempted run).
  ``step_fn``: ``make_eval_step``'s step, reused across evaluations; None
  builds one for this call.
  """
  if step_fn is None:
    step_fn = make_eval_step(config, mesh, model, objective)
  parts = prepared.eval_sources(config.eval_split)
  sums = counts = None
  by_corpus = {}
  for label, source in parts:
    scored = _score(config, params, source, mesh, step_fn, should_stop)
    if scored is None:
      return None
    if label:
      by_corpus[label] = _record(*scored, objective)
    sums = metrics_lib.add(sums, scored[0])
    counts = scored[1] if counts is None else counts + scored[1]
  record = _record(sums, counts, objective)
  for label, part in by_corpus.items():
    record.update({f"{label}/{k}": v for k, v in part.items()})
  return record


def _score(config, params, source, mesh, step_fn, should_stop):
  """One pass over ``source``: (metric sums, target-id counts), on device;
  None when ``should_stop`` said so."""
  from bertjax import train  # the host->global batch helper lives with the loop
  local_batch = config.batch_size // jax.process_count()
  batches = pipeline.make_eval_batches(
      config, source, local_batch_size=local_batch,
      process_index=jax.process_index(), process_count=jax.process_count(),
      max_batches=config.eval_max_batches)
  rng = jax.random.key(config.eval_seed)
  sums, counts = None, None
  with sharding.use_mesh(mesh):
    for batch in batches:
      if should_stop is not None and should_stop():
        return None
      m, c = step_fn(params, train.to_global(batch, mesh), rng)
      sums = metrics_lib.add(sums, m)
      counts = c if counts is None else counts + c
  if should_stop is not None and should_stop():
    return None
  if sums is None:
    raise ValueError(
        f"The eval split {config.eval_split!r} gave no batches; use a larger "
        "corpus or a smaller --config.batch_size.")
  return sums, counts


def _record(sums, counts, objective) -> dict[str, Any]:
  """The figures of summed metrics and target-id counts (module doc)."""
  host = jax.device_get(sums)
  record = metrics_lib.reduce({k: v for k, v in host.items() if k != "num_tokens"})
  # The objective's loss over the split: its terms' means over all of the
  # split's predictions and rows, added as the train step adds them
  # (``objectives.base.loss_terms``; mlm_loss + nsp_loss for BERT). A padded
  # last batch, or one of padding only, adds to no sum and no count.
  record["loss"] = float(sum(record[t] for t in objectives.base.loss_terms(objective, record)))
  # What always giving the majority answer of a sentence task scores: held-out
  # rows are read in document order, so fewer find a partner from another
  # document to be a negative than in training, and long documents fewer still.
  for key in [k for k in record if k.endswith("_random")]:
    rate = record.pop(key)
    record[f"baseline_{key.removesuffix('_random')}_accuracy"] = max(rate, 1.0 - rate)
  record["num_tokens"] = int(host["num_tokens"][0])
  counts = jax.device_get(counts)
  total = float(counts.sum())
  record["num_predictions"] = int(total)
  record["baseline_mlm_accuracy"] = float(counts.max() / total) if total else 0.0
  return record


def write_record(workdir: str, record: dict[str, Any], *,
                 keep_others: bool = False) -> str:
  """Writes ``record`` to ``workdir/eval_<step>.json`` (process 0 only).

  With ``keep_others`` (``bertjax.evaluate``), an existing record that says
  something else (the training run's, or one with other settings) is kept
  and this one goes to ``eval_<step>-2.json``, ``-3`` ... instead.
  """
  name = f"eval_{record['step']}"
  path = paths.join(workdir, f"{name}.json")
  if keep_others:
    copy = 1
    while paths.exists(path) and paths.read_json(path) != record:
      copy += 1
      path = paths.join(workdir, f"{name}-{copy}.json")
  if jax.process_index() == 0:
    paths.write_json(path, record, indent=1)
  return path


# Fields of the data stream and schedule that only training reads (the eval
# pass packs with eval_seed, reads deterministically and applies no dropout).
_TRAINING_ONLY = frozenset((
    "seed", "shuffle_window", "dropout_rate", "attention_dropout_rate",
    "learning_rate", "warmup_steps", "adam_b1", "adam_b2", "adam_eps",
    "weight_decay", "grad_clip_norm"))
# The safe fields that do move an evaluation's figures (to float rounding,
# for mesh_shape, attention_impl and sparse_last_layer). Not data_dir: a
# moved directory holds the same data (what it holds is named by the dataset
# and its tokenizer's fingerprint). The last six are fine-tuning's: the
# examples scored, QA's decoding and the metric the record names as main.
_EVALUATION_SAFE = frozenset((
    "eval_split", "eval_max_batches", "eval_seed", "mesh_shape",
    "attention_impl", "sparse_last_layer",
    "max_eval_examples", "max_answer_tokens", "max_answer_words", "no_answer",
    "no_answer_threshold", "main_metric"))


def _moves_evaluation(change) -> bool:
  """Whether a config change can make an evaluation's record differ: the data,
  masking and numerics it reads, not the training loop's cadence or schedule."""
  name = change.field.rsplit(".", 1)[-1]
  if change.kind == compat.SAFE:
    return name in _EVALUATION_SAFE
  return name not in _TRAINING_ONLY


def config_changes(saved, config) -> dict[str, list]:
  """{field: [saved, new]} of the fields ``config`` sets otherwise than the
  checkpoint's ``saved`` config that can move an evaluation's record: why a
  record written beside the training run's (``write_record``'s
  ``keep_others``) says something else."""
  return {c.field: [c.saved, c.new] for c in compat.differences(saved, config)
          if _moves_evaluation(c)}


def _require_prepared(config, data_dir: str) -> None:
  """Evaluation reads the data a training run prepared; it never makes any
  (the rest of the checks are prepare's, on what is there)."""
  from bertjax.data import layout
  if not paths.exists(layout.tokenized_dir(config, data_dir)):
    raise ValueError(
        f"No prepared data for --config.dataset={config.get('dataset')} in "
        f"{data_dir}; evaluate the workdir with the "
        "--config.data_dir its training run used (by default the workdir's "
        "own data/), or prepare it first with python -m bertjax.prepare.")


def evaluate_checkpoint(config, workdir: str, step: int | None = None, *,
                        should_stop=None) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` (latest by default) and evaluates
  it; the latest of a run still training there even when the run removes it
  meanwhile.

  ``should_stop``: asked before each batch (``bertjax.evaluate`` passes the
  SIGTERM flag, ``guards.PreemptionWatcher.signalled``); when it says so the
  evaluation is abandoned, nothing is written and ``guards.Preempted`` is
  raised. With several processes JAX's preemption notifier has SIGTERM, and
  a process that stopped alone would leave the others waiting in the next
  batch's collectives: there, when given, it is replaced by JAX's sync point,
  asked before each batch as the train loop asks it after each step, so that
  every process stops before the same batch.
  """
  from bertjax import checkpointing
  from bertjax.data import layout
  # As training does: processes given other flags would evaluate different
  # checkpoints (or data) side by side, each its own, without a word.
  workdir = paths.absolute(workdir)
  # A SIGTERM that came before JAX's preemption notifier stops every process.
  signalled = multihost.check_same_run(
      config.to_dict(), {"workdir": workdir,
                         "data_dir": layout.resolve_data_dir(config, workdir),
                         "step": step}, bool(should_stop and should_stop()))
  if signalled:
    raise guards.Preempted.during_start_up(signalled)
  if jax.process_count() > 1 and should_stop is not None:
    should_stop = guards.PreemptionWatcher().should_stop_evaluating
  return checkpointing.read_while_training(
      workdir, step, lambda s: _evaluate_checkpoint(config, workdir, s, should_stop))


def _evaluate_checkpoint(config, workdir: str, step: int | None,
                         should_stop=None) -> dict[str, Any]:
  from bertjax import checkpointing
  from bertjax import config_validation
  from bertjax import models
  from bertjax import objectives
  from bertjax import optim
  from bertjax import state as state_lib
  from bertjax.data import prepare

  config_validation.validate(config)
  workdir = paths.absolute(workdir)
  checkpointer, step = checkpointing.open_step(workdir, step)
  if step is None:
    raise ValueError(f"No checkpoint in {checkpointer.directory}; train first with "
                     "`python -m bertjax.main` on this --workdir.")
  checkpointer.check_intact(step)
  saved = checkpointer.saved_config(step)
  compat.check_workdir_kind((step, saved, checkpointer.where(step)), config, workdir,
                            evaluating=True)
  # A read-only workdir (another user's run) is still evaluated; the record
  # is only printed, as said here before any device work.
  writable = paths.unwritable(workdir) is None
  if not writable:
    logging.warning("The workdir %s is read-only, so this evaluation is printed "
                    "but not written to eval_%d.json; make it writable to keep it.",
                    workdir, step)
  # Evaluation reads only the parameters: just the layout has to agree.
  compat.check(saved, config, checkpointer.where(step),
               layout_only=True, evaluating=True)
  data_dir = prepare.resolve_data_dir(config, workdir)
  _require_prepared(config, data_dir)
  prepared = multihost.process_0_first(lambda: prepare.prepare(config, data_dir),
                                       "prepare the data")
  config_validation.check_prepared(config, prepared)
  checkpointer.check_tokenizer(prepared.fingerprint, step)
  mesh = sharding.make_mesh(config.mesh_shape)
  config_validation.check_mesh(config, mesh)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  # Evaluation reads only the parameters: XLNet's memory (a row per row of
  # the training batch) is restored at the rows it was saved with, so the
  # evaluation's batch_size is free.
  abstract, shardings = state_lib.with_carry_rows(
      *state_lib.state_shardings(model, tx, config, mesh),
      int(saved.get("batch_size", config.batch_size)), mesh)
  state, _ = checkpointer.restore(step, abstract, shardings)
  checkpointer.close()
  record = evaluate_params(config, state.params, prepared, mesh, model,
                           objectives.get_objective(config), should_stop=should_stop)
  if record is None:
    raise guards.Preempted.during_evaluation(step)
  record = {"step": step, **record}
  # What this evaluation was run with that the checkpoint was not (another
  # eval_seed, split, batch ...): why a record beside the training run's,
  # eval_<step>-2.json, says something else.
  changes = config_changes(saved, config)
  if changes:
    record["config_changes"] = changes
  if writable:
    logging.info("Wrote %s.", write_record(workdir, record, keep_others=True))
  return record

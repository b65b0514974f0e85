"""The equal-compute study: plan, pretrain to budget points, evaluate, fine-tune.

For every objective (a pretraining config) the study

  1. turns the FLOP budget into steps: ``steps = floor(budget / step_flops)``
     (``bertjax.flops.step_flops``: useful FLOPs of one step of the config's
     global batch), at least 1; the same for each budget point along the way
     (``budget_points``), so the FLOPs spent at a point are at most the point's
     budget and more than the budget less one step (except where one step is
     already over it: then 1 step, marked ``over_budget``);
  2. trains ONE run of ``steps`` steps through ``train.train_and_evaluate`` (the
     function ``python -m bertjax.main`` calls), stopping at each point's step
     with a checkpoint (``stop_at_step``); the learning-rate schedule is the run's
     whole schedule, so an early point is an early checkpoint of the full run, as
     ELECTRA's paper plots its curves, not a shorter run decayed to zero; the
     config's warmup keeps its share of the steps;
  3. at each point evaluates the checkpoint on the held-out split
     (``evaluation.evaluate_checkpoint``; the final point's evaluation is the one
     ``train_and_evaluate`` makes) and fine-tunes it on every task
     (``bertjax.finetune.run``), the task's final-epoch main metric being the score;
  4. records the point in ``<workdir>/<name>/result.json`` before going on, so
     that a rerun skips every finished point and an objective whose points are all
     recorded is neither retrained nor re-evaluated.

Data: objectives whose configs tokenize the same text the same way (dataset,
splits, tokenizer kind, vocabulary; ``data_key``) share one prepared data_dir,
``<workdir>/data/<key>``, prepared once by the first of them and reused by the
rest; a config that sets ``data_dir`` keeps its own. RoBERTa's byte-level BPE
therefore gets a data_dir of its own; the table says which objectives shared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any, Mapping, Sequence

import ml_collections
from absl import logging

from bertjax import config_validation
from bertjax import flops as flops_lib
from bertjax import paths
from bertjax.study import configs as configs_lib

DEFAULT_TASKS = ("coherence", "cloze_qa")
SPACINGS = ("log", "linear")
# What decides the tokenizer and the shards: configs equal on these share data.
_DATA_FIELDS = ("dataset", "text_files", "text_feature", "train_split", "eval_split",
                "tokenizer", "vocab_size", "tokenizer_path", "tokenizer_sample_sentences")
# The names bertjax.study's callers (and tests) use.
load_configs = configs_lib.load_configs
apply_overrides = configs_lib.apply_overrides
# Held-out record entries that are counts, not scores.
_COUNTS = ("step", "num_tokens", "num_predictions")


@dataclasses.dataclass
class Plan:
  """One objective's share of the study.

  Attributes:
    name: the objective's label (the config's file name, e.g. "bert").
    config: its pretraining ConfigDict (num_train_steps set from the budget).
    step_flops: useful FLOPs of one train step.
    budgets: the budget points, FLOPs, increasing.
    steps: the step of each budget point (the last is config.num_train_steps).
    workdir: where its pretraining run lives (``<study>/<name>/pretrain``).
    data_key: which prepared data it reads (``data_key``).
  """
  name: str
  config: ml_collections.ConfigDict
  step_flops: float
  budgets: list[float]
  steps: list[int]
  workdir: str
  data_key: str

  def describe(self) -> dict[str, Any]:
    """What a result must agree with to be reused (``config_sha256``: every
    field that can change its figures, e.g. a ``--set=learning_rate``)."""
    return {"config": self.name, "step_flops": self.step_flops, "budgets": self.budgets,
            "steps": self.steps, "data_key": self.data_key,
            "config_sha256": config_digest(self.config)}


def budget_points(budget: float, points: int, spacing: str = "log") -> list[float]:
  """``points`` budgets ending at ``budget``: doubling (``log``: budget/2^(n-1),
  ..., budget/2, budget) or evenly spaced (``linear``: budget/n, ..., budget)."""
  if not (budget > 0 and math.isfinite(budget)):
    raise ValueError(f"--flops {budget} must be a positive number of FLOPs, e.g. 1e15.")
  if points < 1:
    raise ValueError(f"--points {points} must be at least 1.")
  if spacing not in SPACINGS:
    raise ValueError(f"--spacing {spacing!r} must be one of {', '.join(SPACINGS)}.")
  if spacing == "log":
    return [budget / 2 ** (points - 1 - i) for i in range(points)]
  return [budget * (i + 1) / points for i in range(points)]


def steps_for(budget: float, step_flops: float) -> int:
  """Whole steps that fit in ``budget`` (rounded down), at least 1."""
  return max(1, int(budget // step_flops))


def data_key(config) -> str:
  """A directory name shared by configs that prepare the same data."""
  described = json.dumps({f: config.get(f) for f in _DATA_FIELDS}, sort_keys=True,
                         default=str)
  digest = hashlib.sha256(described.encode()).hexdigest()[:8]
  return f"{config.get('tokenizer')}-{config.get('vocab_size')}-{digest}"


# Fields that change where or how often a run writes, not what it computes.
_CADENCE_FIELDS = ("data_dir", "log_every_steps", "checkpoint_every_steps",
                   "keep_checkpoints", "prepare_workers", "prepare_block_mb",
                   "tokenizer_train_threads")


def config_digest(config) -> str:
  """sha256 of the config's fields, cadence and paths (``_CADENCE_FIELDS``) left out."""
  fields = {k: v for k, v in config.to_dict().items() if k not in _CADENCE_FIELDS}
  return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def plan_difference(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
  """The first entry of ``current`` (``Plan.describe``) that ``recorded`` does not
  match, or None. A record made before the config digest existed is compared
  without it."""
  for key, value in current.items():
    if key == "config_sha256" and key not in recorded:
      continue
    if recorded.get(key) != value:
      return key
  return None


def plan(configs: Mapping[str, ml_collections.ConfigDict], budget: float, workdir: str,
         *, points: int = 3, spacing: str = "log") -> list[Plan]:
  """Each objective's steps, budget points, workdir and data_dir; checks every
  config before anything is trained."""
  budgets = budget_points(budget, points, spacing)
  plans = []
  for name, original in configs.items():
    config = ml_collections.ConfigDict(original.to_dict())
    # Before the FLOPs, which a bad field (seq_len past the position table)
    # would turn into a misleading "raise --flops".
    _validate(name, config)
    per_step = flops_lib.step_flops(config)
    steps = [steps_for(b, per_step) for b in budgets]
    if len(set(steps)) < len(steps):
      raise ValueError(
          f"--flops {budget:.3g} gives {name} the steps {steps} at its {points} budget "
          f"points ({per_step:.3g} FLOPs per step): two points share a step; raise "
          "--flops or lower --points.")
    # The config's own warmup share of its steps, kept at the study's length.
    share = config.warmup_steps / max(config.num_train_steps, 1)
    config.warmup_steps = int(round(share * steps[-1]))
    config.num_train_steps = steps[-1]
    config.eval_every_steps = 0  # evaluated at the budget points instead
    key = data_key(config)
    if not config.get("data_dir"):
      config.data_dir = paths.join(paths.absolute(workdir), "data", key)
    _validate(name, config)
    plans.append(Plan(name=name, config=config, step_flops=per_step, budgets=budgets,
                      steps=steps, workdir=paths.join(paths.absolute(workdir), name,
                                                      "pretrain"),
                      data_key=key))
  _check_shared_data_dirs(plans)
  return plans


def _check_shared_data_dirs(plans: Sequence[Plan]) -> None:
  """Refuses one data_dir (a ``--set=data_dir``) for objectives that
  tokenize differently, before the first of them prepares it."""
  by_dir: dict[str, Plan] = {}
  for p in plans:
    first = by_dir.setdefault(str(p.config.data_dir), p)
    if first.data_key != p.data_key:
      differ = [f for f in _DATA_FIELDS if first.config.get(f) != p.config.get(f)]
      raise ValueError(
          f"{first.name} and {p.name} would share the data_dir {p.config.data_dir} "
          f"but prepare different data ({', '.join(differ)} "
          f"{'differs' if len(differ) == 1 else 'differ'}); leave data_dir "
          "unset so that each gets its own under <workdir>/data, or run them in "
          "studies of their own.")


def _validate(name: str, config) -> None:
  """``config_validation.validate`` and prepare's reading-only tokenizer
  check (before any objective prepares data), its message naming the
  objective and its fix spelt in this binary's flags (``--set``, not
  ``--config.``)."""
  from bertjax.data import tokenizer_fit
  try:
    config_validation.validate(config)
    tokenizer_fit.check_imported(config)
  except ValueError as e:
    message = re.sub(r"--config\.(\w+)", r"--set=\1", str(e))
    raise ValueError(f"{name}: {message}") from None


def _study_flags(message: str) -> str:
  """A fine-tuning message with its fix spelt in this binary's flags."""
  message = message.replace("--config.num_epochs", "--finetune_epochs").replace(
      "--config=configs/finetune.py:<task>", "--tasks")
  return re.sub(r"--config\.(\w+)", r"--finetune_set=\1", message)


def _check_tasks(tasks: Sequence[str], overrides: Sequence[str], epochs) -> None:
  """Checks every task's config and loads the task once, so bad fine-tuning
  input fails before any training."""
  from bertjax.finetune import checks
  from bertjax.finetune import tasks as tasks_lib
  for task in tasks:
    config = configs_lib.finetune_config(task, overrides, epochs)
    try:
      checks.check_config(config)
      loaded = tasks_lib.load(config)
      checks.check_metric_libraries(loaded.kind)
      if config.main_metric:
        checks.check_main_metric(config.main_metric, loaded.kind, loaded.num_outputs,
                                 tasks_lib.predicts_no_answer(config, loaded))
    except ValueError as e:
      raise ValueError(f"{task}: {_study_flags(str(e))}") from None
    if loaded.kind == "qa":
      # The longest question leaves seq_len - max_query_tokens - 4 context
      # tokens a window ([CLS] and up to three separators).
      room = config.seq_len - config.max_query_tokens - 4
      if not 1 <= config.doc_stride <= room:
        raise ValueError(
            f"{task}: doc_stride {config.doc_stride} must be between 1 and the {room} "
            f"context tokens that seq_len {config.seq_len} leaves beside a question of "
            f"max_query_tokens {config.max_query_tokens}; fix them with --finetune_set.")


def _heldout(record: Mapping[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in record.items()
          if k not in _COUNTS and isinstance(v, (int, float))}


def _latest_step(workdir: str) -> int | None:
  from bertjax import checkpointing
  if not paths.exists(paths.join(workdir, "checkpoints")):
    return None
  with checkpointing.quiet_read_only():
    checkpointer = checkpointing.Checkpointer(workdir, read_only=True)
    steps = checkpointer.all_steps()
    checkpointer.close()
  return max(steps) if steps else None


def _pretrain_to(p: Plan, step: int) -> dict[str, float]:
  """Trains ``p`` up to ``step`` (resuming) and returns the held-out metrics there."""
  from bertjax import evaluation
  from bertjax import train
  latest = _latest_step(p.workdir)
  if latest is not None and latest > step:
    # Fine-tuning reads the workdir's latest checkpoint, which must be this point's.
    raise ValueError(
        f"{p.name}'s pretraining in {p.workdir} is already at step {latest}, past the "
        f"unrecorded budget point at step {step} (fine-tuning tasks added since?); "
        "run the study again with a new --workdir.")
  record = train.train_and_evaluate(p.config, p.workdir, stop_at_step=step)
  if record is None or record.get("step") != step:
    record = evaluation.evaluate_checkpoint(p.config, p.workdir, step)
  return _heldout(record)


def finetune_unavailable(config) -> str | None:
  """Why ``bertjax.finetune`` cannot take this config's encoder (it reads one
  through its Hugging Face mapping, bertjax/convert), or None: such a model is
  pretrained and evaluated held-out, its fine-tuning scores left empty."""
  from bertjax import convert
  try:
    convert.mapping_for_config(config.to_dict())
  except ValueError as e:
    return str(e)
  return None


def _finetune(p: Plan, step: int, task: str, overrides, epochs, root: str) -> dict[str, Any]:
  """Fine-tunes ``p``'s checkpoint of ``step`` (its latest) on ``task``."""
  from bertjax import finetune
  unavailable = finetune_unavailable(p.config)
  if unavailable:
    return {"unavailable": unavailable}
  workdir = paths.join(root, p.name, "finetune", task, f"step_{step}")
  record = finetune.run(configs_lib.finetune_config(task, overrides, epochs), p.workdir,
                        workdir)
  main = record["main_metric"]
  scores = {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and k not in ("step", "epoch", "num_examples")}
  return {"main_metric": main, "score": float(record[main]), "metrics": scores,
          "best_epoch_score": float(record["best"][main]), "workdir": workdir}


def _load_result(p: Plan, path: str, finetuning: dict[str, Any]) -> dict[str, Any]:
  """The recorded result of ``p``, or a fresh one; refuses another study's."""
  if paths.exists(path):
    result = paths.read_json(path)
    differs = plan_difference(result.get("plan") or {}, p.describe())
    if differs == "config_sha256":
      differs = "pretraining config (--size or --set)"
    elif differs is None and result.get("finetuning") != finetuning:
      differs = f"fine-tuning ({result.get('finetuning')} then, {finetuning} now)"
    elif differs is not None:
      differs = (f"{differs} ({(result.get('plan') or {}).get(differs)} then, "
                 f"{p.describe()[differs]} now)")
    if differs:
      raise ValueError(
          f"{path} was recorded for another plan: its {differs} differs; use a new "
          "--workdir or the same --configs/--size/--flops/--points/--spacing/--set/"
          "--finetune_set/--finetune_epochs as before.")
    if "config_sha256" not in (result.get("plan") or {}):
      logging.warning(
          "%s was recorded before studies kept their config's hash, so a changed "
          "--set cannot be told from it: its results are reused as if --size and "
          "--set were as then (use a new --workdir if they are not).", path)
    return result
  return {"plan": p.describe(), "finetuning": finetuning, "points": []}


def run(configs: Mapping[str, ml_collections.ConfigDict], budget: float, workdir: str, *,
        points: int = 3, spacing: str = "log", tasks: Sequence[str] = DEFAULT_TASKS,
        finetune_overrides: Sequence[str] = (), finetune_epochs: float | None = None,
        size: str | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
  """Runs (or resumes) the study; writes and returns its table.

  Args:
    configs: ``{label: pretraining ConfigDict}`` (``load_configs``).
    budget: the FLOP budget of every objective (useful FLOPs, bertjax/flops.py).
    workdir: the study's directory (local or gs://).
    points: budget points along the way; spacing: ``log`` (doubling) or ``linear``.
    tasks: fine-tuning tasks (configs/finetune.py); empty to skip fine-tuning.
    finetune_overrides: ``FIELD=VALUE`` for every fine-tuning config.
    finetune_epochs: overrides the fine-tuning configs' num_epochs.
    size, overrides: ``load_configs``' arguments, for earlier runs' objectives (earlier.py).

  Returns:
    The study record written to ``study.json`` (bertjax/study/report.py).
  """
  from bertjax.study import earlier, report
  report.check_plotting()
  paths.require_directory(workdir, "--workdir")
  paths.require_bucket(workdir, "--workdir")
  paths.require_writable(workdir, "--workdir", "the study's workdir")
  root = paths.absolute(workdir)
  plans = plan(configs, budget, root, points=points, spacing=spacing)
  tasks = tuple(tasks)
  twice = sorted({t for t in tasks if tasks.count(t) > 1})
  if twice:
    raise ValueError(f"--tasks names {', '.join(twice)} twice; name each task once.")
  _check_tasks(tasks, finetune_overrides, finetune_epochs)
  # Every recorded result is held against this plan before anything is
  # prepared or trained (one of another plan refuses the study, not after
  # the objectives before it have trained).
  finetuning = {"overrides": list(finetune_overrides), "epochs": finetune_epochs}
  result_paths = {p.name: paths.join(root, p.name, "result.json") for p in plans}
  results = {p.name: _load_result(p, result_paths[p.name], finetuning) for p in plans}
  # Every prepare first: bad data fails before any training. The first config
  # of a data_dir makes its tokenizer and shards, the others reuse them (ERNIE
  # adds its knowledge-marked shards beside them).
  from bertjax.data import prepare
  for p in plans:
    prepare.prepare(p.config, p.config.data_dir)

  for p in plans:
    path, result = result_paths[p.name], results[p.name]
    done = {pt["step"] for pt in result["points"]
            if set(pt.get("finetune", {})) >= set(tasks)}
    result["points"] = [pt for pt in result["points"] if pt["step"] in done]
    for b, step in zip(p.budgets, p.steps):
      if step in done:
        continue
      logging.info("Study: %s to step %d (%.3g FLOPs).", p.name, step, step * p.step_flops)
      if not paths.exists(path):
        # The plan is recorded before its first step, so that a study killed
        # before its first point and run again with another budget or --set
        # is refused as another plan (its checkpoints are this plan's).
        paths.write_json(path, result, indent=1)
      point = {"budget": b, "step": step, "flops": step * p.step_flops,
               "over_budget": step * p.step_flops > b,
               "heldout": _pretrain_to(p, step), "finetune": {}}
      for task in tasks:
        point["finetune"][task] = _finetune(p, step, task, finetune_overrides,
                                            finetune_epochs, root)
      result["points"].append(point)
      result["points"].sort(key=lambda pt: pt["step"])
      paths.write_json(path, result, indent=1)
  rebuild = earlier.rebuilder(size, overrides, budget, root, points, spacing)
  record = earlier.record(root, plans, results, budget, tasks, finetuning, rebuild)
  report.write(root, record)
  return record

"""Checks of a fine-tuning run's config and directories, before any work.

Each check raises ValueError with one sentence naming the field and the fix,
before the task's files or the init's weights are read (``check_config``,
``check_directories``) or, for what depends on the task (its metrics, its
number of steps), right after the task's files are read and before the init
is loaded (``check_main_metric``, ``check_metric_libraries``, ``check_steps``);
``check_resume`` compares a workdir's checkpoint with the run's config before
the workdir is held or anything is placed on a device.
"""

from __future__ import annotations

import importlib.util

from bertjax import compat
from bertjax import config_validation
from bertjax import paths
from bertjax import workdir_lock
from bertjax.finetune import metrics as task_metrics
from bertjax.finetune import tasks as tasks_lib
from bertjax.models import heads

# The shortest row: [CLS], a token or two of each text and the separators.
MIN_SEQ_LEN = 8
# config.no_answer: QA may predict "no answer" when the task has unanswerable
# questions ('auto'), always ('on') or never ('off').
NO_ANSWER_MODES = ("auto", "on", "off")


# The libraries each task kind's metrics import (metrics.py): the finetune
# extra, not core dependencies. SQuAD's exact match and F1 are bertjax's own.
METRIC_LIBRARIES = {"classification": ("sklearn", "scikit-learn"),
                    "regression": ("scipy", "scipy"),
                    "tagging": ("seqeval", "seqeval")}


def check_metric_libraries(kind: str) -> None:
  """Refuses, before the init is loaded, a task whose metrics need a library
  that is not installed (without it the run failed at its first evaluation)."""
  module, package = METRIC_LIBRARIES.get(kind, (None, None))
  if module is not None and importlib.util.find_spec(module) is None:
    raise ValueError(
        f"The metrics of a {kind} task need {package}, which is not installed; "
        "install the finetune extra: pip install 'bertjax[finetune]' (in a "
        "checkout, pip install -e '.[finetune]').")


def _fail(field: str, value, want: str) -> None:
  raise ValueError(f"config.{field}={value!r} is invalid: {want}; set "
                   f"--config.{field}=... accordingly.")


def check_config(config) -> None:
  """Range and choice checks on the fields the fine-tuning loop relies on."""
  if "task" not in config or "num_epochs" not in config:
    raise ValueError(
        "--config is not a fine-tuning config (it has no 'task' or 'num_epochs'; a "
        "pretraining config such as configs/bert.py:tiny is for bertjax.main); pass "
        "--config=configs/finetune.py:<task>, e.g. configs/finetune.py:coherence.")
  if config.num_epochs <= 0:
    raise ValueError(f"num_epochs {config.num_epochs} must be positive; fix --config.num_epochs.")
  if not 0.0 < config.layer_decay <= 1.0:
    raise ValueError(f"layer_decay {config.layer_decay} must be in (0, 1]; 1 turns it off.")
  if not 0.0 <= config.warmup_fraction < 1.0:
    raise ValueError(f"warmup_fraction {config.warmup_fraction} must be in [0, 1).")
  # nonfinite, max_consecutive_skips and debug_nan_step: as in pretraining.
  config_validation.check_guards(config)
  if config.pooling not in heads.POOLINGS:
    raise ValueError(f"Unknown pooling {config.pooling!r}; set --config.pooling to one of "
                     f"{', '.join(heads.POOLINGS)}.")
  if config.get("head_activation", "tanh") not in heads.HEAD_ACTIVATIONS:
    _fail("head_activation", config.head_activation,
          f"it must be one of {', '.join(heads.HEAD_ACTIVATIONS)}")
  for field in ("batch_size", "log_every_steps", "checkpoint_every_steps",
                "keep_checkpoints", "doc_stride",
                "max_query_tokens", "max_answer_tokens"):
    if field in config and int(config[field]) < 1:
      _fail(field, config[field], "it must be a positive integer")
  for field in ("max_train_examples", "max_eval_examples", "max_answer_words"):
    if field in config and int(config[field]) < 0:
      _fail(field, config[field], "it must not be negative (0 = no limit)")
  config_validation.check_seeds(config)
  if config.seq_len < MIN_SEQ_LEN:
    _fail("seq_len", config.seq_len, f"it must be at least {MIN_SEQ_LEN} (and at most "
          "the encoder's position table)")
  # 0 is allowed: a head trained at rate 0 is the untrained baseline.
  if not 0 <= config.learning_rate < float("inf"):  # also refuses NaN
    _fail("learning_rate", config.learning_rate, "it must be a number, not negative")
  # Adam's moments and epsilon, weight decay, clipping: as in pretraining.
  config_validation.check_optimizer_numbers(config)
  if not 0.0 <= config.head_dropout < 1.0:
    _fail("head_dropout", config.head_dropout, "it must be in [0, 1)")
  if config.get("no_answer", "auto") not in NO_ANSWER_MODES:
    _fail("no_answer", config.no_answer, f"it must be one of {', '.join(NO_ANSWER_MODES)}")
  if not abs(float(config.get("no_answer_threshold", 0.0))) < float("inf"):
    _fail("no_answer_threshold", config.no_answer_threshold, "it must be a finite number")
  fraction = float(config.get("unanswerable_fraction", 0.0))
  if not 0.0 <= fraction < 1.0:
    _fail("unanswerable_fraction", fraction, "it must be in [0, 1)")
  if fraction and config.task != "cloze_qa":
    raise ValueError(f"config.unanswerable_fraction applies to the cloze_qa task only, "
                     f"not {config.task!r}; leave it at 0 (SQuAD 2.0 and local files "
                     "bring their own unanswerable questions).")
  import jax
  from bertjax import sharding
  sharding.parse_mesh_shape(config.mesh_shape, jax.device_count())


def check_positions(config, fields) -> None:
  """Rows no longer than the encoder's absolute position table, where it has
  one (XLNet and DeBERTa without absolute positions have none:
  ``models.position_table_rows``); ``fields``: the encoder's saved fields."""
  from bertjax import models
  if "max_position_embeddings" not in fields:
    return
  rows = models.position_table_rows(fields)
  if rows is not None and config.seq_len > rows:
    raise ValueError(f"seq_len {config.seq_len} exceeds the encoder's "
                     f"{rows} positions; lower --config.seq_len.")


def check_directories(config, workdir: str) -> None:
  """A file where a directory flag points is refused before any work."""
  if not workdir:
    raise ValueError("No --workdir; pass a directory for checkpoints and metrics.")
  paths.require_directory(workdir, "--workdir")
  paths.require_bucket(workdir, "--workdir")
  workdir_lock.check_writable(paths.absolute(workdir))
  if config.get("tfds_data_dir"):
    paths.require_directory(config.tfds_data_dir, "--config.tfds_data_dir")


def check_main_metric(main_metric: str, kind: str, num_labels: int,
                      no_answer: bool = False) -> None:
  """``main_metric`` must be one the task's evaluation reports (the best
  checkpoint is chosen by it), checked before any training step;
  ``no_answer``: QA decoding may answer "no answer" (SQuAD 2.0's metrics)."""
  names = (task_metrics.qa_names(no_answer) if kind == "qa"
           else task_metrics.names(kind, num_labels))
  if main_metric not in names:
    raise ValueError(f"config.main_metric={main_metric!r} is not a metric of this "
                     f"{kind} task; set --config.main_metric to one of "
                     f"{', '.join(names)} (or '' for the task's own).")


def check_steps(config, num_train: int) -> None:
  """At least one batch, and at least one step in all."""
  if num_train < config.batch_size:
    raise ValueError(f"The task has {num_train} training rows, fewer than one batch of "
                     f"{config.batch_size}; lower --config.batch_size.")
  steps = int(round(config.num_epochs * (num_train // config.batch_size)))
  if steps < 1:
    raise ValueError(
        f"num_epochs {config.num_epochs} of {num_train // config.batch_size} steps per "
        "epoch is no step at all; raise --config.num_epochs (or lower "
        "--config.batch_size).")



# Fields of the saved config that ``loop.run_config`` derives from the task and
# its data rather than takes from a flag: a refused resume never asks for them
# as --config flags (configs/finetune.py has no such field, or the task
# overrides it); it says what changed that derived them.
DERIVED = ("steps_per_epoch", "num_train_steps", "warmup_steps", "num_labels",
           "max_predictions_per_seq", "output_names")
# The fields that decide a task's labels: a change of one of them explains
# the labels' change, which is then not told again.
_LABEL_SOURCES = ("task", "task_kind", "label_names", "label_field")


def check_resume(saved, cfg, where: str, num_train: int) -> list:
  """``compat.check`` of a fine-tuning checkpoint's saved config against the
  run's (``loop.run_config``), with a refusal worded for fine-tuning: only
  fields the user sets are named as flags, with their saved values; a change
  of a derived field is told by what changed it (the training rows, the
  task's labels or kind). Fine-tuning has no ``allow_changes``: a run that is
  to go on with another config is given a new --workdir.

  Args:
    saved: the checkpoint's saved config (JSON); cfg: the run's config;
    where: 'The checkpoint at step ... in ...'; num_train: the run's training rows.

  Returns:
    ``compat.check``'s accepted changes.
  """
  was = str(saved.get("output_names") or "")  # recorded since output_names exists
  # The head's rows are these classes, in this order: other names (as many)
  # would resume with every class's row meaning another class.
  relabelled = bool(was) and was != str(cfg.get("output_names") or "")
  try:
    accepted = compat.check(saved, cfg, where)
    if not relabelled:
      return accepted
  except compat.IncompatibleCheckpoint:
    pass
  changes = compat.differences(saved, cfg)
  layout = [c for c in changes if c.kind == compat.LAYOUT or (
      relabelled and c.field == "output_names")]
  refused = layout or [c for c in changes if c.kind == compat.STREAM]
  fields = {c.field: c for c in refused}
  named = [c for c in refused if c.field not in DERIVED and not _derived_kind(c, cfg)]
  causes = []
  if "steps_per_epoch" in fields and "batch_size" not in fields:
    causes.append(f"the training data gives {num_train} rows now ({cfg.steps_per_epoch} "
                  f"steps of {cfg.batch_size} per epoch), where it gave "
                  f"{fields['steps_per_epoch'].saved} steps per epoch")
  kind = fields.get("task_kind")
  if kind is not None and kind not in named and "task" not in fields:
    causes.append(f"the task's files make a {kind.new} task now, not a {kind.saved} one")
  if (("num_labels" in fields or "output_names" in fields) and kind is None
      and not set(_LABEL_SOURCES) & {c.field for c in named}):
    causes.append(f"the task's labels are {_labels(cfg.output_names)} now, where they were "
                  f"{_labels(was)}" if was else f"the task has {cfg.num_labels} labels "
                  f"now, where it had {fields['num_labels'].saved}")
  said = [] if named or causes else ["was fine-tuned with another config"]
  if named:
    said.append(f"was fine-tuned with {_listing(named, 'saved')} but this run says "
                f"{_listing(named, 'new')}")
  if causes:
    said.append(("and " if named else "was fine-tuned on other data: ") + ", and ".join(causes))
  keep = [f"--config.{c.field}={compat.flag_value(c.saved) or repr('')}"
          for c in named if c.saved != compat.ABSENT]
  if causes:
    keep.append("the training data it was fine-tuned on")
  what = ("the saved state's layout" if layout
          else "the data stream or schedule of the resumed run")
  raise compat.IncompatibleCheckpoint(
      f"{where} {', '.join(said)}, which changes {what}; keep "
      f"{' and '.join(keep) or 'the config it was fine-tuned with'} to resume it as it "
      "was, or pass a new --workdir to fine-tune with the change.")


def _derived_kind(change, cfg) -> bool:
  """Whether a task_kind change is the task's doing (the format of its files,
  a TFDS task) rather than --config.task_kind's: only local tables read the flag."""
  tables = tasks_lib.TABLE_KINDS
  return change.field == "task_kind" and not (
      cfg.task == "local" and change.new in tables and change.saved in tables)


def _labels(names: str) -> str:
  return ", ".join(str(names).split("\t"))


def _listing(changes, side: str) -> str:
  return ", ".join(f"{c.field}={compat.show_value(getattr(c, side))}"
                   for c in changes)

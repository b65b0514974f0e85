r"""Pretrains several objectives to the same FLOP budget and compares them.

  python -m bertjax.study --configs=bert,roberta,albert,spanbert,ernie,electra \
      --flops=1e15 --size=tiny --points=3 --workdir=/tmp/study \
      --finetune_set=learning_rate=1e-3

Each objective trains once to the budget, stopping at ``--points`` budget
points along the way; at each the checkpoint is evaluated on the held-out split
and fine-tuned on every ``--tasks`` task. Writes ``study.json``, ``study.md``
and ``study.png`` into ``--workdir``; run again to resume (finished points are
not redone). Needs matplotlib (``pip install matplotlib``; in a checkout,
``pip install -e '.[study]'``).
"""

# Restart with malloc tunables that reuse XLA:CPU's per-step buffers before the heavy
# imports (bertjax/host_memory.py), then remember SIGTERM rather than die of it:
# the next run (pretraining or fine-tuning) stops before its first step, exit 75
# and one line, as bertjax.main; only when run as the program.
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables(hold_sigterm=True)

from bertjax import guards  # noqa: E402

if __name__ == "__main__":
  guards.catch_sigterm()

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import cli  # noqa: E402

_CONFIGS = flags.DEFINE_list(
    "configs", None, "Pretraining configs: names of configs/<name>.py (bertjax's own "
    "if not found here) or paths to config files.")
_FLOPS = flags.DEFINE_float("flops", None, "FLOP budget of each objective (useful "
                            "FLOPs, bertjax/flops.py), e.g. 1e15.")
_SIZE = flags.DEFINE_string("size", "tiny", "The argument of every config (a size).")
_POINTS = flags.DEFINE_integer("points", 3, "Budget points evaluated along the way.")
_SPACING = flags.DEFINE_enum("spacing", "log", ["log", "linear"],
                             "Budget points: log (doubling up to --flops) or linear.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The study's directory (gs:// works).")
_TASKS = flags.DEFINE_list("tasks", ["coherence", "cloze_qa"],
                           "Fine-tuning tasks (configs/finetune.py); empty to skip.")
_SET = flags.DEFINE_multi_string(
    "set", [], "FIELD=VALUE set on every pretraining config (repeatable).")
_FINETUNE_SET = flags.DEFINE_multi_string(
    "finetune_set", [], "FIELD=VALUE set on every fine-tuning config (repeatable).")
_FINETUNE_EPOCHS = flags.DEFINE_float(
    "finetune_epochs", None, "Fine-tuning epochs (default: the task config's).")
flags.mark_flags_as_required(["configs", "flops", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from bertjax.study import core
  from bertjax.study import report
  report.check_plotting()  # before any config is loaded or any data prepared
  configs = core.load_configs(_CONFIGS.value, _SIZE.value, _SET.value)
  record = core.run(configs, _FLOPS.value, _WORKDIR.value, points=_POINTS.value,
                    spacing=_SPACING.value, tasks=_TASKS.value,
                    finetune_overrides=_FINETUNE_SET.value,
                    finetune_epochs=_FINETUNE_EPOCHS.value, size=_SIZE.value,
                    overrides=_SET.value)
  print(report.markdown(record), flush=True)


if __name__ == "__main__":
  cli.run(main)

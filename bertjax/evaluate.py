r"""Evaluates a checkpoint on the held-out split.

  python -m bertjax.evaluate --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo [--step=N]

Restores the latest checkpoint (or ``--step``), runs the eval split with the
fixed masking seed ``config.eval_seed``, writes ``workdir/eval_<step>.json`` and
prints the same record as one JSON line, the last line of output.
"""

import json

from absl import app
from absl import flags

from bertjax import cli
from bertjax import config_files
from bertjax import evaluation

_CONFIG = config_files.define_config_flag(
    "Config file, e.g. configs/bert.py:tiny (bertjax's own if not found here).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Workdir holding the checkpoints.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  record = evaluation.evaluate_checkpoint(_CONFIG.value, _WORKDIR.value, _STEP.value)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  cli.run(main)

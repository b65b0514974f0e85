r"""Pretrains a BERT-family encoder.

  python -m bertjax.main --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo

Prepares the corpus and tokenizer into the workdir if they are missing, trains
(resuming from the workdir's latest checkpoint), then evaluates on the held-out
split. Override any config field with ``--config.FIELD=VALUE``.
"""

# Before the heavy imports: a SIGTERM during start-up ends the run with
# status 75 and a message, not with 143 (bertjax/guards.py). Only when run as
# the program: prepare's worker processes (multiprocessing 'spawn') import this
# module again as __mp_main__, and must die of the SIGTERM their pool sends.
if __name__ == "__main__":
  # First of all: restart with malloc tunables that reuse XLA:CPU's per-step buffers
  # (bertjax/host_memory.py); nothing has been done yet to be redone. SIGTERM
  # waits, blocked, across the restart for the handler.
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables(hold_sigterm=True)

from bertjax import guards  # noqa: E402

if __name__ == "__main__":
  guards.catch_sigterm()

import os  # noqa: E402
import sys  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax import config_files  # noqa: E402
from bertjax import multihost  # noqa: E402

_CONFIG = config_files.define_config_flag(
    "Config file, e.g. configs/bert.py:tiny (bertjax's own if not found here).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for data, checkpoints and metrics.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", None,
    "Call jax.distributed.initialize() (multi-host TPU pod slices; elsewhere "
    "set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID on each "
    "process). Default: on when JAX_COORDINATOR_ADDRESS is set or "
    "TPU_WORKER_HOSTNAMES lists several hosts.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  from bertjax import train  # imports JAX: after the SIGTERM handler is set
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    multihost.initialize(_DISTRIBUTED.value,
                         stop=guards.PreemptionWatcher.signalled)
  except multihost.StoppedWhileConnecting:
    # JAX's connect goes on in a thread nothing can stop, and interpreter
    # shutdown would wait on it: the process ends here, with nothing done.
    print(guards.Preempted.while_connecting(), flush=True)
    sys.stdout.flush()
    os._exit(guards.EXIT_PREEMPTED)
  except multihost.NotConnected as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(1)
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except guards.Preempted as e:
    print(str(e), flush=True)
    return e.exit_status


if __name__ == "__main__":
  cli.run(main)

r"""Evaluates a checkpoint on the held-out split.

  python -m bertjax.evaluate --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo [--step=N]

Restores the latest checkpoint (or ``--step``), runs the eval split with the
fixed masking seed ``config.eval_seed``, writes ``workdir/eval_<step>.json`` and
prints the same record as one JSON line, the last line of output. The record
holds every metric the config's objective reports (MLM, NSP/SOP, SBO, ELECTRA's
discriminator ...).

  python -m bertjax.evaluate --workdir=/tmp/bertjax-demo --fill_mask "The [MASK] statement returns a value."

prints, for each [MASK], the checkpoint's top-k fillings with their
probabilities (one JSON line); --config is not needed for it.
"""

# Restart with malloc tunables that reuse XLA:CPU's per-step buffers before the heavy
# imports (bertjax/host_memory.py), then remember SIGTERM rather than die of it
# (exit 75 and one line, as bertjax.main); only when run as the program.
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables(hold_sigterm=True)

from bertjax import guards  # noqa: E402

if __name__ == "__main__":
  guards.catch_sigterm()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax import config_files  # noqa: E402
from bertjax import evaluation  # noqa: E402
from bertjax import multihost  # noqa: E402

_CONFIG = config_files.define_config_flag(
    "Config file, e.g. configs/bert.py:tiny (bertjax's own if not found here).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Workdir holding the checkpoints.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
_FILL_MASK = flags.DEFINE_string(
    "fill_mask", None, 'Text with [MASK]: print the top-k fillings instead of evaluating.')
_TOP_K = flags.DEFINE_integer("top_k", 5, "Fillings printed per [MASK].")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", None,
    "Call jax.distributed.initialize(), as bertjax.main does: run it on every "
    "host of a pod (elsewhere with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES "
    "and JAX_PROCESS_ID set). Default: on when JAX_COORDINATOR_ADDRESS is set "
    "or TPU_WORKER_HOSTNAMES lists several hosts.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _FILL_MASK.value is not None:
    from bertjax import fill_mask
    fill_mask.check_top_k(_TOP_K.value)  # before the checkpoint is read
    import bertjax
    model = bertjax.load(_WORKDIR.value, _STEP.value)
    fillings = model.fill_mask(_FILL_MASK.value, _TOP_K.value)
    if guards.PreemptionWatcher.signalled():
      raise guards.Preempted(0, "Preempted before the fillings were printed; "
                                "nothing written, run the same command again.")
    for k, options in enumerate(fillings):
      print(f"[MASK] {k + 1}: " + "  ".join(
          f"{o['text']!r} {o['score']:.3f}" for o in options))
    print(json.dumps({"text": _FILL_MASK.value, "fillings": fillings}), flush=True)
    return
  if _CONFIG.value is None:
    raise ValueError("--config is required to evaluate; pass the config the workdir "
                     "was trained with, e.g. --config=configs/bert.py:tiny (only "
                     "--fill_mask does without).")
  try:
    multihost.initialize(_DISTRIBUTED.value, stop=guards.PreemptionWatcher.signalled)
  except multihost.StoppedWhileConnecting:
    # As bertjax.main: JAX's connect goes on in a thread nothing can stop.
    print(guards.Preempted.while_connecting(), flush=True)
    sys.stdout.flush()
    os._exit(guards.EXIT_PREEMPTED)
  except multihost.NotConnected as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(1)
  record = evaluation.evaluate_checkpoint(
      _CONFIG.value, _WORKDIR.value, _STEP.value,
      should_stop=guards.PreemptionWatcher.signalled)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  cli.run(main)

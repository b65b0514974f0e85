r"""Fine-tunes a pretrained encoder on a task.

  python -m bertjax.finetune --config=configs/finetune.py:coherence \
      --init=/tmp/bertjax-demo --workdir=/tmp/ft-coherence

``--init`` is a bertjax workdir (its latest checkpoint) or a Hugging Face model
directory; the tokenizer comes with it (a workdir that has fine-tuned before
remembers its own, so a rerun, say to predict new ``predict_files``, may leave
it out). Prints progress lines and, last, the final evaluation as one JSON
line; run again to resume.
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

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax import config_files  # noqa: E402

_CONFIG = config_files.define_config_flag(
    "Task config, e.g. configs/finetune.py:coherence (bertjax's own if not found here).")
_INIT = flags.DEFINE_string(
    "init", None, "bertjax workdir or Hugging Face model directory; a --workdir that "
    "has fine-tuned before defaults to the one it was started from.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from bertjax.finetune import loop
  loop.run(_CONFIG.value, _INIT.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)

r"""A checkpoint save of a replicated state: orbax's slice per replica, or whole.

  python bench/save_bench.py --config=configs/bert.py:tiny --devices=8 --rounds=5

Builds the config's train state replicated over ``--devices`` fake CPU
devices (a data mesh, as the tests have it), then saves it through an orbax
CheckpointManager with orbax's jax.Array handler in each of two forms,
interleaved, ``--saves`` saves a round (each waited for):

  sliced  ``use_replica_parallel=True``: orbax's default, each replicated
          array cut into a slice per replica, each written by its device.
  whole   ``use_replica_parallel=False``: each array written whole from its
          first replica, as bertjax's checkpoints are on CPU
          (``checkpointing._whole_array_writes_on_cpu``).

The first round of each form includes its one-time work (the slice programs'
compiles) and is reported apart. Prints one JSON line: per form the median
seconds of a save over the later rounds, the first round's, and the ratio of
the medians. A measurement, not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

if __name__ == "__main__":
  # The fake devices, before JAX is imported.
  _COUNT = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--devices=")), "8")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={_COUNT}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import config_files  # noqa: E402

_CONFIG = config_files.define_config_flag("Config file, e.g. configs/bert.py:tiny.")
_DEVICES = flags.DEFINE_integer("devices", 8, "Fake CPU devices to replicate over.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds per form.")
_SAVES = flags.DEFINE_integer("saves", 3, "Saves per round.")


def main(argv):
  del argv
  import jax
  import orbax.checkpoint as ocp
  from bertjax import models
  from bertjax import optim
  from bertjax import sharding
  from bertjax import state as state_lib

  config = _CONFIG.value
  mesh = sharding.make_mesh(f"{_DEVICES.value},1,1")
  model = models.get_model(config)
  state, _ = state_lib.create_train_state(model, optim.make_optimizer(config),
                                          config, mesh)
  default = ocp.type_handlers.get_type_handler(jax.Array)
  store = getattr(default, "_array_metadata_store", None)
  handlers = {form: ocp.type_handlers.ArrayHandler(
      use_replica_parallel=(form == "sliced"), array_metadata_store=store)
              for form in ("sliced", "whole")}
  times = {form: [] for form in handlers}
  scratch = tempfile.mkdtemp(prefix="save_bench-")
  try:
    for _ in range(_ROUNDS.value):
      for form, handler in handlers.items():
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
        directory = tempfile.mkdtemp(dir=scratch)
        manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
            item_names=("state",))
        start = time.perf_counter()
        for step in range(_SAVES.value):
          manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
          manager.wait_until_finished()
        times[form].append((time.perf_counter() - start) / _SAVES.value)
        manager.close()
        shutil.rmtree(directory)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    ocp.type_handlers.register_type_handler(jax.Array, default, override=True)
  median = {form: statistics.median(t[1:] or t) for form, t in times.items()}
  print(json.dumps({
      "config": f"{config.model}-{config.model_size}", "devices": _DEVICES.value,
      "state_mb": round(sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6, 1),
      "median_save_s": {f: round(v, 4) for f, v in median.items()},
      "first_round_save_s": {f: round(t[0], 4) for f, t in times.items()},
      "sliced_over_whole": round(median["sliced"] / median["whole"], 3),
  }))


if __name__ == "__main__":
  app.run(main)

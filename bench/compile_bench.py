r"""Times tracing, lowering and compiling the real train step on this host.

  python bench/compile_bench.py --config=configs/bert.py:large \
      --config.scan_layers=True --config.batch_size=8 --config.seq_len=128

Prints one JSON line: the model, layer count, scan_layers and remat, and the
seconds spent lowering (tracing to StableHLO) and compiling (XLA) the step
exactly as the train loop jits it (``train.make_train_step``), on abstract
arguments, so nothing runs and no memory for the model is allocated. With
``nn.scan`` over layers the compile time should not grow with depth; compare
``--config.scan_layers=False``. A benchmark, not a test.
"""

from __future__ import annotations

import json
import time

import jax
from absl import app
from absl import flags

from bertjax import aot
from bertjax import sharding
from bertjax.models import sizes

# bertjax.aot, a binary too, already defines --config (the train config file).
_CONFIG = aot._CONFIG


def compile_seconds(config) -> dict:
  """Lowers and compiles the train step of ``config`` on the local devices."""
  mesh = sharding.make_mesh(config.mesh_shape, jax.devices())
  with sharding.use_mesh(mesh):
    start = time.perf_counter()
    lowered = aot.lower_train_step(config, mesh)
    lowered_at = time.perf_counter()
    lowered.compile()
    done = time.perf_counter()
  return {
      "model": f"{config.model}-{config.model_size}",
      "num_layers": sizes.resolve(config).num_layers,
      "scan_layers": bool(config.scan_layers),
      "remat": str(config.remat),
      "batch_size": int(config.batch_size),
      "seq_len": int(config.seq_len),
      "devices": len(jax.devices()),
      "lower_seconds": round(lowered_at - start, 2),
      "compile_seconds": round(done - lowered_at, 2),
      "total_seconds": round(done - start, 2),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  print(json.dumps(compile_seconds(_CONFIG.value)), flush=True)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)

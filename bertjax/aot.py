r"""Ahead-of-time compile of the real train step for a TPU topology, on a CPU host.

  pip install libtpu   # the TPU compiler (a checkout's tpu extra); no TPU needed
  python -m bertjax.aot --config=configs/bert.py:large --topology=v5e:16x16 \
      --config.mesh_shape=1,-1,1

prints one JSON line: the topology, the mesh, per-chip HBM the compiled step
needs (arguments, temporaries, outputs), the compiled FLOPs per chip, and
whether it fits the chip's HBM. This proves a pod plan before anyone pays for
the pod: the step is lowered and compiled exactly as the train loop jits it
(``train.make_train_step``), with abstract state and batch carrying their
shardings on a mesh over the topology's devices.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

# The TPU here is only a compile target: keep the runtime on CPU, and tell
# libtpu it is a single, compile-only host so it does not probe for TPUs.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# Its one worker is this host: left unset, the worker list is a warning's
# text, which libtpu reports on every compile as a bad hostname.
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
# libtpu takes a machine-wide lock file when it loads; a compile-only process
# must not fail because another JAX process (a training run on this CPU host
# with the tpu extra installed) holds it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import batch as batch_lib  # noqa: E402
from bertjax import cli  # noqa: E402
from bertjax import config_files  # noqa: E402
from bertjax import config_validation  # noqa: E402
from bertjax import flops  # noqa: E402
from bertjax import models  # noqa: E402
from bertjax import objectives  # noqa: E402
from bertjax import optim  # noqa: E402
from bertjax import sharding  # noqa: E402
from bertjax import state as state_lib  # noqa: E402
from bertjax import train  # noqa: E402

GIB = 1024 ** 3
# HBM per chip by TPU generation (the part of --topology before ':').
HBM_BYTES: dict[str, int] = {
    "v4": 32 * GIB,
    "v5e": 16 * GIB,
    "v5litepod": 16 * GIB,
    "v5p": 95 * GIB,
    "v6e": 32 * GIB,
}


# A slice of each generation: its chips' grid has 2 axes (v5e, v6e) or up to
# 3 (v4, v5p: a 2-axis grid is one chip deep).
# Generations whose chips have two TensorCores run as one device.
_MEGACORE = ("v4", "v5p")
_EXAMPLES = {"v4": "v4:2x2x2", "v5e": "v5e:4x4", "v5litepod": "v5litepod:4x4",
             "v5p": "v5p:2x2x2", "v6e": "v6e:4x4"}


def get_topology_devices(topology: str) -> list[Any]:
  """The devices of a TPU ``topology`` such as 'v5e:16x16' or 'v5p:2x2x2'.

  Raises:
    ValueError: when the generation is unknown or libtpu is missing.
  """
  generation, _, grid = topology.partition(":")
  if generation not in HBM_BYTES:
    raise ValueError(
        f"Unknown TPU generation in --topology={topology!r}; use one of "
        f"{', '.join(HBM_BYTES)} followed by ':' and the chip grid, e.g. v5e:4x4.")
  axes = grid.split("x")
  most = len(_EXAMPLES[generation].split("x"))  # 2 (v5e, v6e) or 3 axes
  if not all(a.isdigit() and int(a) > 0 for a in axes) or not 2 <= len(axes) <= most:
    raise ValueError(
        f"--topology={topology!r} gives no chip grid of {generation}'s shape; "
        f"write it as {generation}:{'x'.join(['N'] * most)}, e.g. {_EXAMPLES[generation]}.")
  try:
    import libtpu  # noqa: F401  (the compiler behind the topology)
  except ImportError as e:
    raise ValueError(
        "AOT compilation for TPU needs libtpu; install it with "
        "pip install libtpu (in a checkout, the tpu extra).") from e
  from jax.experimental import topologies
  try:
    # JAX runs a v4 or v5p chip's two TensorCores as one device (megacore);
    # libtpu's default describes a v4 chip as two devices, which doubled the
    # chip count (v4:2x2x1 as 8) and halved each device's share. v5e and v6e
    # have one core a chip and no megacore config.
    options = ({"chip_config_name": "megacore"} if generation in _MEGACORE
               else {})
    return list(topologies.get_topology_desc(topology, "tpu", **options).devices)
  except Exception as e:  # libtpu's JaxRuntimeError: INVALID_ARGUMENT ...
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(
        f"libtpu has no {generation} slice of --topology={topology!r} ({reason}); "
        f"give a grid a {generation} slice has, e.g. {_EXAMPLES[generation]}.") from None


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree,
      shardings)


def abstract_batch(config, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """ShapeDtypeStructs of a global Batch (bertjax/batch.py), batch-sharded."""
  sh = sharding.batch_sharding(mesh)
  return {
      name: jax.ShapeDtypeStruct(
          batch_lib.field_shape(name, config.batch_size, config.seq_len), dtype,
          sharding=sh)
      for name, (dtype, _) in batch_lib.FIELDS.items()}


def lower_train_step(config, mesh) -> Any:
  """The train step of ``config`` traced and lowered for ``mesh``, unrun.

  Exactly what the train loop jits (``train.make_train_step``), applied to
  abstract state and batch that carry their shardings; call inside
  ``sharding.use_mesh(mesh)``. ``.compile()`` on the result compiles it for the mesh's devices.
  """
  model = models.get_model(config)
  objective = objectives.get_objective(config)
  tx = optim.make_optimizer(config)
  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  step_fn = train.make_train_step(
      model, objective, tx, shardings, mesh,
      microbatches=int(config.get("microbatches", 1)))
  rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                             sharding=sharding.replicated(mesh))
  return step_fn.lower(_abstract(abstract, shardings),
                       abstract_batch(config, mesh), rng)


def compile_for_topology(config, topology: str) -> dict[str, Any]:
  """Lowers and compiles the train step of ``config`` for ``topology``.

  Args:
    config: a train config (configs/*.py); mesh_shape lays the topology's
      chips out as data,fsdp,tensor; microbatches, scan_layers, remat and
      dtype apply as in training.
    topology: TPU generation and chip grid, e.g. 'v5e:16x16'.

  Returns:
    A JSON-able record: topology, num_chips, mesh, attention_impl, per-chip bytes
    (argument, output, temp, alias, code, total), hbm_bytes_per_chip,
    fits, compiled_flops_per_chip, useful_flops_per_step, compile_seconds.
    When the TPU compiler itself refuses the program for lack of HBM, the
    record says fits False with the sizes from its message
    (``compiler_oom``) instead of raising.
    compiled_flops_per_chip is XLA's cost analysis of the per-chip program:
    it counts the body of a loop once, so with scan_layers (and
    microbatches > 1) it is below the real per-step work; useful_flops_per_step
    (bertjax.flops, all chips together) is the figure to plan with.
  """
  import time
  devices = get_topology_devices(topology)
  mesh = sharding.make_mesh(config.mesh_shape, devices, f"in --topology={topology}")
  config_validation.check_sharded_dims(config, dict(mesh.shape))
  ways = sharding.batch_parallelism(mesh) * int(config.get("microbatches", 1))
  if config.batch_size % ways:
    raise ValueError(
        f"config.batch_size={config.batch_size} is not divisible by the "
        f"{ways} ways (microbatches x data x fsdp) of mesh {dict(mesh.shape)}; "
        "change --config.batch_size or --config.mesh_shape.")
  start = time.perf_counter()
  hbm = HBM_BYTES[topology.split(":")[0]]
  record = {
      "topology": topology,
      "num_chips": len(devices),
      "mesh": dict(mesh.shape),
      "model": f"{config.model}-{config.model_size}",
      "batch_size": int(config.batch_size),
      "seq_len": int(config.seq_len),
      "microbatches": int(config.get("microbatches", 1)),
      "attention_impl": str(config.get("attention_impl", "auto")),
      "hbm_bytes_per_chip": hbm,
      "useful_flops_per_step": flops.step_flops(config),
  }
  with sharding.use_mesh(mesh):
    lowered = lower_train_step(config, mesh)
    try:
      compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      oom = compiler_oom(str(e))
      if oom is None:
        raise
      return dict(record, **oom,
                  compile_seconds=round(time.perf_counter() - start, 2))
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  per_chip = {
      "argument": int(memory.argument_size_in_bytes),
      "output": int(memory.output_size_in_bytes),
      "temp": int(memory.temp_size_in_bytes),
      "alias": int(memory.alias_size_in_bytes),
      "code": int(memory.generated_code_size_in_bytes),
  }
  # Donated state aliases its outputs onto its arguments: counted once.
  per_chip["total"] = (per_chip["argument"] + per_chip["output"] - per_chip["alias"]
                       + per_chip["temp"] + per_chip["code"])
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return dict(
      record,
      bytes_per_chip=per_chip,
      gib_per_chip=round(per_chip["total"] / GIB, 3),
      fits=per_chip["total"] <= hbm,
      compiled_flops_per_chip=float(cost.get("flops", -1.0)),
      compile_seconds=round(seconds, 2))


# The TPU compiler refuses a program whose temporaries exceed the chip, e.g.
# "... HLO temporaries (145.65G) exceeds available HBM (15.75G) ...".
_OOM = re.compile(r"HbmOom.*?\(([\d.]+)([KMGT])\).*?available HBM \(([\d.]+)([KMGT])\)",
                  re.DOTALL)
_UNIT = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def compiler_oom(message: str) -> dict[str, Any] | None:
  """The sizes in the TPU compiler's out-of-HBM refusal, or None if it is not one.

  Returns:
    fits False, bytes_per_chip with the temporaries the compiler asked for
    (``total`` is that same figure: a lower bound, arguments come on top),
    gib_per_chip, usable_hbm_bytes_per_chip (what the compiler says it may
    use, below the datasheet HBM) and the compiler's first line.
  """
  match = _OOM.search(message)
  if match is None:
    return None
  need = float(match.group(1)) * _UNIT[match.group(2)]
  usable = float(match.group(3)) * _UNIT[match.group(4)]
  first = next((line for line in message.splitlines() if "HbmOom" in line),
               message.splitlines()[0])
  return {
      "fits": False,
      "bytes_per_chip": {"temp": int(need), "total": int(need)},
      "gib_per_chip": round(need / GIB, 3),
      "usable_hbm_bytes_per_chip": int(usable),
      "compiled_flops_per_chip": -1.0,
      "compiler_message": first.strip(),
  }


def describe(record: dict[str, Any]) -> str:
  """One human sentence on whether the plan fits, naming the numbers."""
  need = record["bytes_per_chip"]["total"] / GIB
  have = record["hbm_bytes_per_chip"] / GIB
  if record["fits"]:
    return (f"Fits: {need:.2f} GiB of {have:.0f} GiB HBM per chip on "
            f"{record['topology']}.")
  chip = record["topology"].split(":")[0]
  if "usable_hbm_bytes_per_chip" in record:
    usable = record["usable_hbm_bytes_per_chip"] / GIB
    return (f"Does NOT fit: the TPU compiler refused the step, whose "
            f"temporaries alone need {need:.2f} GiB per chip while a {chip} "
            f"chip can use {usable:.2f} of its {have:.0f} GiB HBM; raise "
            "--config.microbatches, shard more (fsdp) or use remat.")
  return (f"Does NOT fit: the step needs {need:.2f} GiB per chip (temporaries "
          f"{record['bytes_per_chip']['temp'] / GIB:.2f} GiB) but a "
          f"{record['topology'].split(':')[0]} chip has {have:.0f} GiB; raise "
          "--config.microbatches, shard more (fsdp) or use remat.")


_CONFIG = config_files.define_config_flag("Train config file, e.g. configs/bert.py:large.")
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:2x2", "TPU topology, e.g. v5e:16x16.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  record = compile_for_topology(_CONFIG.value, _TOPOLOGY.value)
  record["verdict"] = describe(record)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  cli.run(main)

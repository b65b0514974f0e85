"""The device mesh and the one table mapping logical axis names to mesh axes.

Mesh axes:
  data    pure data parallelism: parameters replicated, batch split.
  fsdp    data parallelism with parameters and optimizer state split as well
          (ZeRO-3 style): the batch is split over it too.
  tensor  tensor parallelism: attention heads, MLP and vocabulary split.

Every parameter of a bertjax model carries logical names (``vocab``, ``embed``,
``mlp``, ``heads``, ``kv``, ``position``, ``type``, ``layers``); activations use
``batch``, ``length`` and the same feature names. ``LOGICAL_RULES`` is the only
place that says where each goes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("position", None),
    ("type", None),
    ("layers", None),
)


def parse_mesh_shape(spec: str, num_devices: int,
                     where: str = "present") -> tuple[int, int, int]:
  """Parses ``config.mesh_shape`` ("data,fsdp,tensor", one entry may be -1).

  Raises:
    ValueError: if the string is malformed or does not multiply out to the
      number of devices.
  """
  try:
    dims = [int(x) for x in str(spec).split(",")]
  except ValueError:
    dims = []
  if len(dims) != len(MESH_AXES):
    raise ValueError(
        f"config.mesh_shape={spec!r} is not three sizes for "
        f"{','.join(MESH_AXES)}; set e.g. --config.mesh_shape=-1,1,1 "
        "(-1 = the remaining devices).")
  if dims.count(-1) > 1:
    raise ValueError(
        f"config.mesh_shape={spec!r} leaves more than one axis at -1; give "
        "every axis but one its size, e.g. --config.mesh_shape=-1,2,1.")
  if any(d == 0 or d < -1 for d in dims):
    raise ValueError(
        f"config.mesh_shape={spec!r} has a size below 1; give each axis a "
        "positive size, or -1 for the remaining devices.")
  known = math.prod(d for d in dims if d != -1)
  if -1 in dims:
    if num_devices % known:
      raise ValueError(
          f"config.mesh_shape={spec!r} does not divide the {num_devices} "
          "devices; choose sizes whose product divides the device count.")
    dims[dims.index(-1)] = num_devices // known
  if math.prod(dims) != num_devices:
    raise ValueError(
        f"config.mesh_shape={spec!r} uses {math.prod(dims)} devices but "
        f"{_devices(num_devices)} {where}; make the product equal the device "
        "count or use -1 for one axis.")
  return tuple(dims)  # type: ignore[return-value]


def _devices(count: int) -> str:
  return "1 device is" if count == 1 else f"{count} devices are"


def make_mesh(spec: str, devices: list[jax.Device] | None = None,
              where: str = "present") -> Mesh:
  """A Mesh with axes MESH_AXES over ``devices`` (default: all devices);
  ``where`` says where the devices are in a refusal ("in --topology=...")."""
  devices = list(jax.devices() if devices is None else devices)
  shape = parse_mesh_shape(spec, len(devices), where)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def batch_parallelism(mesh: Mesh) -> int:
  """How many ways the batch dimension is split on ``mesh``."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of every Batch field: leading (batch) dimension split."""
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


# The mesh of the step being traced (``with_rules``), read by ``constrain``.
_TRACING = threading.local()
# The mesh the traced code runs on (``use_mesh``), read by ``context_mesh``.
_RUNS_ON = threading.local()


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None):
  """Functions traced inside run on ``mesh``: the attention kernels read it
  (``context_mesh``) for the platform they compile for and to place a fused
  kernel in ``shard_map``.

  This replaces jax's ``with mesh:``, which is deprecated. Its successor,
  ``jax.set_mesh``, would also bind an abstract mesh, which turns on flax's
  constraints in parameter unboxing (wrong for DenseGeneral's flattened
  kernels); every array here carries an explicit ``NamedSharding``, so the
  traced code only needs to know the mesh.

  Like ``with_rules``' mesh, it is read when a function is traced and is not
  part of jax's trace cache key (``with mesh:`` was): a function traced
  outside is not traced again inside. The binaries build their steps afresh
  for each run; code of your own should jit a new function per mesh too.
  """
  previous = getattr(_RUNS_ON, "mesh", None)
  _RUNS_ON.mesh = mesh
  try:
    yield mesh
  finally:
    _RUNS_ON.mesh = previous


def context_mesh() -> Mesh | None:
  """The mesh of the enclosing ``use_mesh`` (or ``with_rules`` trace), or None."""
  return getattr(_RUNS_ON, "mesh", None)


def with_rules(fn: Any, mesh: Mesh | None) -> Any:
  """``fn``, whose tracing makes the models' ``constrain`` calls take effect
  on ``mesh`` (outside it they are no-ops: init, single-device use).

  The models pin activations and gathered kernels with ``constrain``
  (``layers.HIDDEN_AXES``, ``layers.gathered``), by logical axis names
  mapped through ``LOGICAL_RULES``. (flax's own ``with_logical_constraint``
  would need its axis rules and an abstract mesh bound, which also turns on
  constraints in flax's parameter unboxing, wrong for DenseGeneral's
  flattened kernels.)
  """
  @functools.wraps(fn)
  def traced(*args, **kwargs):
    previous = getattr(_TRACING, "mesh", None)
    _TRACING.mesh = mesh
    try:
      with use_mesh(mesh if mesh is not None else context_mesh()):
        return fn(*args, **kwargs)
    finally:
      _TRACING.mesh = previous
  return traced


def constrain(x: Any, logical_axes: tuple[str | None, ...]) -> Any:
  """``x`` constrained to the sharding of its logical axes on the traced
  step's mesh (``with_rules``); unchanged outside such a trace."""
  mesh = getattr(_TRACING, "mesh", None)
  if mesh is None:
    return x
  rules = dict(LOGICAL_RULES)
  used, entries = set(), []
  for name in logical_axes:
    axes = rules.get(name) if name else None
    group = (axes,) if isinstance(axes, str) else tuple(axes or ())
    if not group or used & set(group):  # a mesh axis splits one dimension only
      entries.append(None)                # (as flax's logical rules resolve)
    else:
      used.update(group)
      entries.append(axes)
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, PartitionSpec(*entries)))


def logical_to_sharding(spec_tree: Any, mesh: Mesh) -> Any:
  """Maps a tree of logical PartitionSpecs to NamedShardings on ``mesh``."""
  from flax import linen as nn  # local: keeps this module importable without flax
  return nn.logical_to_mesh_sharding(spec_tree, mesh, LOGICAL_RULES)

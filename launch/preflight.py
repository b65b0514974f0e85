"""Checks of the config against the slice, before a slice is paid for.

A mistake that the workers would only find after the slice was created and
bertjax installed on every host (a config file the commit lacks, a misspelt
``--config.FIELD``, a batch or mesh that does not fit the chips) costs an hour
of a pod; here it costs a second. Each check raises ``ValueError`` with one
sentence. The config checks load the config with bertjax, as the workers will;
where bertjax is not installed beside the launcher they are skipped.
"""

from __future__ import annotations

import math
import os
import subprocess
from typing import Sequence

from launch import topologies


def _git_ok(root: str, *args: str) -> bool:
  """Whether ``git -C root args`` succeeds (False without git)."""
  try:
    return subprocess.run(["git", "-C", root, *args], capture_output=True,
                          check=False).returncode == 0
  except OSError:
    return False


def _candidates(path: str) -> list[str]:
  """The repository paths a config spec's file may be: itself, or for the
  shipped forms (``bert``, ``bert.py``, ``configs/bert``) ``configs/bert.py``."""
  norm = os.path.normpath(path)
  found = [norm]
  parent, name = os.path.split(norm)
  if parent in ("", "configs"):
    stem = name[:-3] if name.endswith(".py") else name
    found.append(f"configs/{stem}.py")
  return found


def config_in_commit(root: str, config: str, rev: str) -> None:
  """Refuses a ``--config`` file that commit ``rev`` lacks (e.g. a new, untracked
  config): the workers run a fresh clone at ``rev``. Skipped when this checkout
  does not have ``rev``."""
  if not _git_ok(root, "cat-file", "-e", f"{rev}^{{commit}}"):
    return
  path = config.split(":", 1)[0]
  if any(_git_ok(root, "cat-file", "-e", f"{rev}:{p}") for p in _candidates(path)):
    return
  raise ValueError(
      f"--config={config!r}: {path} is not in commit {rev[:12]}, which the "
      "workers check out; commit and push it (git add, git commit, git push) "
      "or name a config of the repository such as configs/bert.py:large.")


def load_config(root: str, config: str, overrides: Sequence[str]):
  """The config the workers will train, overrides applied; None without bertjax.

  Raises:
    ValueError: for a config that does not load or an override that does not
      apply (an unknown field, a value of the wrong type).
  """
  try:
    from absl import flags
    from ml_collections import config_flags
    from bertjax import cli
    from bertjax import config_files
  except ImportError:
    return None
  path, sep, arg = config.partition(":")
  local = os.path.join(root, path)
  spec = (local if os.path.exists(local) else config_files.resolve_path(path)) + sep + arg
  argv = ["launch", f"--config={spec}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
  try:
    values(argv)
    return values.config
  except Exception as e:  # noqa: BLE001 — every parse failure gets one sentence.
    loaded = None
    try:
      loaded = config_files.load(spec)
    except Exception:  # noqa: BLE001 — the first error says why.
      pass
    for flag in overrides:
      field = flag[len("--config."):].split("=", 1)[0]
      message = loaded is not None and cli.unknown_field(
          loaded, field, hint=" (after '--').")
      if message:
        raise ValueError(message) from None
    raise ValueError(cli.explain(e)) from None


def batch_fits(config, slice_: topologies.Slice) -> None:
  """Refuses a mesh_shape that does not cover the slice's chips, or a batch that
  does not split over its data-parallel chips, microbatches and hosts."""
  from bertjax import sharding
  try:
    data, fsdp, _ = sharding.parse_mesh_shape(config.mesh_shape, slice_.chips)
  except ValueError as e:
    raise ValueError(f"On the {slice_.chips} chips of a {slice_.accelerator_type}: "
                     f"{e}") from None
  micro = int(config.get("microbatches", 1))
  unit = math.lcm(data * fsdp * micro, slice_.hosts)
  if config.batch_size % unit:
    raise ValueError(
        f"config.batch_size={config.batch_size} does not split over a "
        f"{slice_.accelerator_type}: it must be divisible by microbatches "
        f"({micro}) times the {data * fsdp} data-parallel chips of "
        f"mesh_shape={config.mesh_shape!r} and by its {slice_.hosts} hosts; "
        f"pass e.g. -- --config.batch_size={unit * max(1, config.batch_size // unit)}.")


def config_fits(config, slice_: topologies.Slice) -> None:
  """Runs the checks ``bertjax.main`` runs before any device work (field
  ranges, the objective's and model's fields, ``allow_changes``), with the
  mesh and batch checked against the slice's chips and hosts (a tensor axis
  that does not divide the model's heads, for one): a refusal the workers
  would print after the slice was created and bertjax installed."""
  import jax
  from bertjax import compat
  from bertjax import config_validation
  # The checks trace the model's shapes only; no accelerator is probed here.
  jax.config.update("jax_platforms", "cpu")
  try:
    config_validation.validate(config, variant=False, devices=slice_.chips,
                               hosts=slice_.hosts)
    compat.allowed(config)
    config_validation.check_variant(config)
    _local_text_named(config)
  except ValueError as e:
    raise ValueError(f"On a {slice_.accelerator_type} ({slice_.chips} chips): "
                     f"{e}") from None


def _local_text_named(config) -> None:
  """bertjax.main's refusal of local text named by no files (it needs the
  same text_files it was prepared from, also when the data is prepared)."""
  from bertjax.data import mixture
  from bertjax.data import text_sources
  inputs = [(c.dataset, c.text_files) for c in mixture.parse(config)] or [
      (config.dataset, config.get("text_files", ""))]
  for dataset, text_files in inputs:
    if dataset.partition("/")[0] == "bertjax_local_text":
      text_sources.check_local_text_named(dataset, text_files)

"""Cloud TPU accelerator types: chips, hosts, topology, software version.

One table, used by both the gcloud launcher (``launch/tpu.py``) and the GKE
manifest (``launch/gke.py``). An accelerator type is ``<generation>-<n>``;
what ``n`` counts differs by generation: TensorCores for v2, v3, v4 and v5p
(two per chip), chips for v5e (``v5litepod``) and v6e. Figures follow Google's
"TPU versions" and "Plan TPUs in GKE" pages; the software versions are the ones
Google's "TPU software versions" page lists for JAX.
"""

from __future__ import annotations

import dataclasses
import math
import re


@dataclasses.dataclass(frozen=True)
class Generation:
  cores_per_chip: int      # what the accelerator type's number counts, per chip
  host_chips: int          # chips per host of a multi-host slice
  max_single_host: int     # the largest slice (chips) that is one host
  runtime_version: str     # default TPU VM software version for JAX
  grid_dims: int           # 2-D (v5e, v6e) or 3-D (v4, v5p) chip grid
  gke_accelerator: str     # GKE node label cloud.google.com/gke-tpu-accelerator
  # The slice sizes (chips) Cloud TPU offers; () where any whole number of
  # hosts makes a slice (v4 and v5p take custom 3-D topologies).
  offered_chips: tuple[int, ...] = ()


# v5e and v6e: the 2-D slice shapes 1x1 to 16x16.
_SHAPES_2D = (1, 4, 8, 16, 32, 64, 128, 256)

GENERATIONS: dict[str, Generation] = {
    "v2": Generation(2, 4, 4, "tpu-ubuntu2204-base", 2, "", (4, 16, 64, 128, 256)),
    "v3": Generation(2, 4, 4, "tpu-ubuntu2204-base", 2, "",
                     (4, 16, 32, 64, 128, 256, 512, 1024)),
    "v4": Generation(2, 4, 4, "tpu-ubuntu2204-base", 3, "tpu-v4-podslice"),
    "v5p": Generation(2, 4, 4, "v2-alpha-tpuv5", 3, "tpu-v5p-slice"),
    "v5litepod": Generation(1, 4, 8, "v2-alpha-tpuv5-lite", 2,
                            "tpu-v5-lite-podslice", _SHAPES_2D),
    "v6e": Generation(1, 4, 8, "v2-alpha-tpuv6e", 2, "tpu-v6e-slice", _SHAPES_2D),
}

ACCELERATOR = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$")
# Names people use for a generation that the accelerator types spell otherwise.
ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6": "v6e"}


def _spelling(accelerator_type: str) -> str:
  """The accelerator type a misspelt one most likely means ('' if none)."""
  name, _, size = accelerator_type.strip().lower().partition("-")
  guess = f"{ALIASES.get(name, name)}-{size}"
  return guess if ACCELERATOR.match(guess) else ""

# The default (smallest-perimeter) chip grid for a chip count, as GKE's
# cloud.google.com/gke-tpu-topology label spells it.
GRID_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
           128: "8x16", 256: "16x16"}
GRID_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
           128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 1024: "8x8x16",
           2048: "8x16x16", 4096: "16x16x16"}


@dataclasses.dataclass(frozen=True)
class Slice:
  accelerator_type: str    # e.g. 'v5p-128'
  generation: str          # e.g. 'v5p'
  chips: int
  hosts: int
  chips_per_host: int
  topology: str            # chip grid, e.g. '4x4x4'; '' when there is no default
  runtime_version: str
  gke_accelerator: str

  @property
  def multi_host(self) -> bool:
    return self.hosts > 1


def parse(accelerator_type: str) -> Slice:
  """The slice an accelerator type such as 'v5p-128' or 'v5litepod-16' names.

  Raises:
    ValueError: for a name that is no Cloud TPU accelerator type.
  """
  match = ACCELERATOR.match(accelerator_type)
  if not match and _spelling(accelerator_type):
    raise ValueError(
        f"--accelerator_type={accelerator_type!r} is not a Cloud TPU type; "
        f"Cloud TPU spells it {_spelling(accelerator_type)}.")
  if not match:
    raise ValueError(
        f"--accelerator_type={accelerator_type!r} is not a Cloud TPU type; use "
        f"<generation>-<size> with a generation among {', '.join(GENERATIONS)}, "
        "e.g. v4-32, v5litepod-16, v5p-128 or v6e-8.")
  name, size = match.group(1), int(match.group(2))
  gen = GENERATIONS[name]
  if size % gen.cores_per_chip:
    raise ValueError(
        f"--accelerator_type={accelerator_type!r}: a {name} size counts "
        f"TensorCores, {gen.cores_per_chip} per chip, so it must be a multiple "
        f"of {gen.cores_per_chip} (e.g. {name}-{8 * gen.cores_per_chip}).")
  chips = size // gen.cores_per_chip
  if gen.offered_chips and chips not in gen.offered_chips:
    sizes = ", ".join(f"{name}-{c * gen.cores_per_chip}" for c in gen.offered_chips)
    raise ValueError(
        f"--accelerator_type={accelerator_type!r} is not a slice Cloud TPU offers; "
        f"pick one of {sizes}.")
  # v4 and v5p come in whole hosts only, the smallest slice being one host.
  if (not gen.offered_chips or chips > gen.max_single_host) and chips % gen.host_chips:
    below, above = chips // gen.host_chips, chips // gen.host_chips + 1
    sizes = " or ".join(f"{name}-{h * gen.host_chips * gen.cores_per_chip}"
                        for h in (below, above) if h)
    raise ValueError(
        f"--accelerator_type={accelerator_type!r}: a {name} slice is whole hosts "
        f"of {gen.host_chips} chips ({gen.host_chips * gen.cores_per_chip} "
        f"TensorCores), and {chips} {'chip is' if chips == 1 else 'chips are'} "
        f"not; pick {sizes}.")
  if chips <= gen.max_single_host:
    hosts, per_host = 1, chips
  else:
    hosts, per_host = math.ceil(chips / gen.host_chips), gen.host_chips
  grids = GRID_3D if gen.grid_dims == 3 else GRID_2D
  return Slice(accelerator_type=accelerator_type, generation=name, chips=chips,
               hosts=hosts, chips_per_host=per_host,
               topology=grids.get(chips, ""),
               runtime_version=gen.runtime_version,
               gke_accelerator=gen.gke_accelerator)

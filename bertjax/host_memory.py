"""Huge pages for the host memory of XLA:CPU steps (glibc's malloc tunable).

XLA:CPU allocates a step's temporaries afresh at every execution (BERT-base,
batch 8 x 128: 1.8 GB), and glibc's malloc serves blocks that large with new
``mmap`` regions. Every 4 KiB page of them then faults and is zeroed by the
kernel at first touch, every step: 450,000 page faults and about a quarter
of the base step's time on a 2-core CPU. glibc (2.35 and newer) can ask the
kernel for transparent huge pages (2 MiB) for the memory it maps
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``): the same step then takes about
1,100 faults, and the TLB covers its working set.

Tunables are read when the process starts, so ``reexec_with_huge_pages`` starts
the same command again (``execve``: same process id, arguments, standard
streams and environment, plus the tunable) before anything heavy is imported.
The training binaries (``bertjax.main``, ``finetune``, ``evaluate``, ``study``)
and the benchmarks call it first thing. It does nothing where it cannot help
or is not wanted:

  - not Linux, or glibc older than 2.35 (the tunable does not exist);
  - transparent huge pages are not in ``madvise`` mode (``always`` already
    gives them to every large mapping; ``never`` refuses them);
  - the tunable is already set (also what stops a second restart);
  - ``BERTJAX_HUGE_PAGES=0`` (opt out);
  - no command to restart (an interactive interpreter).

In a notebook or another program that imports bertjax, set the variable before
Python starts: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 jupyter lab``.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

TUNABLES = "GLIBC_TUNABLES"
HUGETLB = "glibc.malloc.hugetlb"
OPT_OUT = "BERTJAX_HUGE_PAGES"
_THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
_MIN_GLIBC = (2, 35)


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the C library, or None if it is not glibc."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (ValueError, OSError, AttributeError):
    return None


def thp_mode() -> str | None:
  """The kernel's transparent huge page mode ('always', 'madvise', 'never')."""
  try:
    with open(_THP_MODE_FILE, encoding="ascii") as f:
      text = f.read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def tunables_with_huge_pages(environ: Mapping[str, str], *, platform: str,
                             glibc: tuple[int, int] | None,
                             thp: str | None) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None to stay as is.

  Args:
    environ: the process environment.
    platform: ``sys.platform``.
    glibc: ``glibc_version()``.
    thp: ``thp_mode()``.
  """
  if platform != "linux" or glibc is None or glibc < _MIN_GLIBC:
    return None
  if environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
    return None
  if thp != "madvise":
    return None
  current = environ.get(TUNABLES, "")
  if any(item.split("=")[0] == HUGETLB for item in current.split(":")):
    return None
  return f"{current}:{HUGETLB}=1" if current else f"{HUGETLB}=1"


def reexec_with_huge_pages() -> None:
  """Restarts this process with glibc's huge-page tunable when it helps.

  Returns only when nothing is to be done (see the module doc); otherwise
  the process is replaced by the same command with ``GLIBC_TUNABLES`` set.
  Call it before importing JAX: what ran before is done again.
  """
  tunables = tunables_with_huge_pages(
      os.environ, platform=sys.platform, glibc=glibc_version(), thp=thp_mode())
  argv = list(getattr(sys, "orig_argv", []))
  if tunables is None or len(argv) < 2 or sys.flags.interactive:
    return
  env = dict(os.environ, **{TUNABLES: tunables})
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable] + argv[1:], env)

"""Host memory for XLA:CPU steps: buffers reused across steps, on huge pages.

XLA:CPU allocates a step's temporaries afresh at every execution (BERT-base,
batch 8 x 128: 1.8 GB) and frees them at its end. glibc's malloc serves
blocks that large with new ``mmap`` regions and unmaps them when freed, so
every 4 KiB page faults and is zeroed by the kernel again at every step:
450,000 page faults and a quarter or more of the base step on a 2-core CPU.
glibc's malloc tunables (``GLIBC_TUNABLES``) stop that:

  glibc.malloc.mmap_max=0            no block gets a mapping of its own ...
  glibc.malloc.arena_max=1           ... nor a thread arena (whose heaps are at
                                     most 64 MiB and map larger blocks anyway):
                                     everything comes from the main heap,
  glibc.malloc.trim_threshold=10**12 which is never given back to the kernel,
                                     so the next step reuses its pages (no
                                     faults, no zeroing; the process keeps its
                                     peak size, as any training process does);
  glibc.malloc.hugetlb=1             and that heap asks for transparent huge
                                     pages (glibc 2.35+, kernel THP mode
                                     ``madvise``): fewer TLB misses.

Measured (BERT-base 8 x 128, one process timing bertjax, HF Flax and PyTorch
interleaved, 2-core CPU): huge pages alone took the faults from 450,000 to
1,100 per step but left bertjax with 2.5 s of kernel time per step in that
process; all four give 0 faults and 0.02 s.

Tunables are read when the process starts, so ``reexec_with_malloc_tunables``
starts the same command again (``execve``: same process id, arguments,
standard streams and environment, plus the tunables) before anything heavy is
imported. The training binaries (``bertjax.main``, ``finetune``, ``evaluate``,
``study``) and the benchmarks call it first thing. It does nothing when:

  - not Linux with glibc 2.26 or newer (hugetlb is added from 2.35 only, and
    only in THP mode ``madvise``: ``always`` gives huge pages anyway);
  - every one of these tunables is already set (a value the user set is kept;
    this is also what stops a second restart);
  - ``BERTJAX_MALLOC_TUNABLES=0`` (opt out);
  - there is no command to restart (an interactive interpreter).

In a notebook or another program that imports bertjax, set the variable before
Python starts (``malloc_tunables`` gives the value).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

TUNABLES = "GLIBC_TUNABLES"
HUGETLB = "glibc.malloc.hugetlb"
OPT_OUT = "BERTJAX_MALLOC_TUNABLES"
_THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
_MIN_GLIBC_HUGETLB = (2, 35)


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


# Name -> value; hugetlb only where the kernel wants it asked (see above).
REUSE = {"glibc.malloc.mmap_max": "0", "glibc.malloc.arena_max": "1",
         "glibc.malloc.trim_threshold": str(10**12)}
_MIN_GLIBC_REUSE = (2, 26)


def malloc_tunables(environ: Mapping[str, str], *, platform: str,
                    glibc: tuple[int, int] | None,
                    thp: str | None) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None to stay as is.

  Tunables already in ``environ`` keep their values; the missing ones of
  ``REUSE`` (and ``HUGETLB`` where it applies) are appended.

  Args:
    environ: the process environment.
    platform: ``sys.platform``.
    glibc: ``glibc_version()``.
    thp: ``thp_mode()``.
  """
  if platform != "linux" or glibc is None or glibc < _MIN_GLIBC_REUSE:
    return None
  if environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
    return None
  wanted = dict(REUSE)
  if glibc >= _MIN_GLIBC_HUGETLB and thp == "madvise":
    wanted[HUGETLB] = "1"
  current = environ.get(TUNABLES, "")
  present = {item.split("=")[0] for item in current.split(":") if item}
  missing = [f"{k}={v}" for k, v in wanted.items() if k not in present]
  if not missing:
    return None
  return ":".join(([current] if current else []) + missing)


def reexec_with_malloc_tunables(*, hold_sigterm: bool = False) -> None:
  """Restarts this process with glibc's malloc tunables when they help.

  Returns only when nothing is to be done (see the module doc); otherwise
  the process is replaced by the same command with ``GLIBC_TUNABLES`` set.
  Call it before importing JAX: what ran before is done again.

  ``hold_sigterm``: SIGTERM is blocked across the restart, so one that comes
  while the new interpreter starts waits (``execve`` keeps the signal mask
  and pending signals) for the handler ``guards.catch_sigterm`` installs
  and then unblocks; only for a program that calls it next. Unblocked, it
  ended the process with status 143 (about 0.1 s of each start).
  """
  tunables = malloc_tunables(
      os.environ, platform=sys.platform, glibc=glibc_version(), thp=thp_mode())
  argv = list(getattr(sys, "orig_argv", []))
  if tunables is None or len(argv) < 2 or sys.flags.interactive:
    return
  env = dict(os.environ, **{TUNABLES: tunables})
  sys.stdout.flush()
  sys.stderr.flush()
  held = hold_sigterm and _block(True)
  try:
    os.execve(sys.executable, [sys.executable] + argv[1:], env)
  finally:  # execve failed: this process goes on as it was
    if held:
      _block(False)


def _block(block: bool) -> bool:
  """Blocks or unblocks SIGTERM for the calling thread; whether it could."""
  import signal
  if not hasattr(signal, "pthread_sigmask"):
    return False
  signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK,
                         {signal.SIGTERM})
  return True

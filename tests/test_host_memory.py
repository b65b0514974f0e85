"""Huge pages for XLA:CPU's buffers: when the restart happens, that it keeps
the command, and that it takes the page faults away (bertjax/host_memory.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bertjax import host_memory

HERE = {"platform": "linux", "glibc": (2, 36), "thp": "madvise"}


@pytest.mark.parametrize("environ,where,expected", [
    ({}, {}, "glibc.malloc.hugetlb=1"),
    # Other tunables are kept, ours appended.
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, {},
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    # Already set, whatever the value: no restart (and no loop of restarts).
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}, None),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}, {}, None),
    ({"BERTJAX_HUGE_PAGES": "0"}, {}, None),
    ({"BERTJAX_HUGE_PAGES": "off"}, {}, None),
    ({"BERTJAX_HUGE_PAGES": "1"}, {}, "glibc.malloc.hugetlb=1"),
    ({}, {"thp": "always"}, None),
    ({}, {"thp": "never"}, None),
    ({}, {"thp": None}, None),
    ({}, {"glibc": (2, 34)}, None),
    ({}, {"glibc": None}, None),
    ({}, {"platform": "darwin"}, None),
])
def test_restart_only_where_the_tunable_helps(environ, where, expected):
  assert host_memory.tunables_with_huge_pages(
      environ, **{**HERE, **where}) == expected


def _would_restart_here() -> bool:
  env = {k: v for k, v in os.environ.items()
         if k not in (host_memory.TUNABLES, host_memory.OPT_OUT)}
  return host_memory.tunables_with_huge_pages(
      env, platform=sys.platform, glibc=host_memory.glibc_version(),
      thp=host_memory.thp_mode()) is not None


needs_restart = pytest.mark.skipif(
    not _would_restart_here(),
    reason="no restart on this machine (not Linux with glibc >= 2.35 and "
    "transparent huge pages in madvise mode)")


def _child_env(**extra):
  env = {k: v for k, v in os.environ.items()
         if k not in (host_memory.TUNABLES, host_memory.OPT_OUT)}
  env.update(extra)
  return env


@needs_restart
def test_restart_keeps_process_arguments_and_environment(tmp_path):
  script = tmp_path / "probe.py"
  script.write_text(textwrap.dedent("""
      import json, os, sys
      print("started", flush=True)
      from bertjax import host_memory
      host_memory.reexec_with_huge_pages()
      print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:],
                        "tunables": os.environ.get("GLIBC_TUNABLES"),
                        "mine": os.environ.get("PROBE_VAR")}))
  """))
  proc = subprocess.Popen(
      [sys.executable, "-u", str(script), "a b", "--flag=1"],
      stdout=subprocess.PIPE, text=True, cwd=tmp_path,
      env=_child_env(PROBE_VAR="kept"))
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0
  lines = out.splitlines()
  # Once before the restart and once after it; the rest of the script once.
  assert lines[:2] == ["started", "started"]
  record = json.loads(lines[2])
  assert record == {"pid": proc.pid, "argv": ["a b", "--flag=1"],
                    "tunables": "glibc.malloc.hugetlb=1", "mine": "kept"}


_FAULTS = textwrap.dedent("""
    import json, resource
    from bertjax import host_memory
    host_memory.reexec_with_huge_pages()
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.sin(x) * 2.0)   # a fresh 64 MiB output per call
    x = jnp.ones((4096, 4096), jnp.float32)
    f(x).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
      f(x).block_until_ready()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(json.dumps({"faults": (after - before) / 4}))
""")


def _faults_per_call(tmp_path, **env) -> float:
  script = tmp_path / "faults.py"
  script.write_text(_FAULTS)
  out = subprocess.run([sys.executable, str(script)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300,
                       env=_child_env(JAX_PLATFORMS="cpu", **env), check=True)
  return json.loads(out.stdout.splitlines()[-1])["faults"]


@needs_restart
def test_huge_pages_take_away_the_page_faults_of_xla_buffers(tmp_path):
  # 64 MiB of fresh output per call is 16,384 faults of 4 KiB pages and 32 of
  # 2 MiB pages. Bounds with wide margins: at least half of the small-page
  # count without, and under a tenth of it with the tunable.
  small_pages = 64 * 2**20 / 4096
  without = _faults_per_call(tmp_path, BERTJAX_HUGE_PAGES="0")
  with_huge = _faults_per_call(tmp_path)
  assert without > 0.5 * small_pages, without
  assert with_huge < 0.1 * small_pages, (with_huge, without)

"""Malloc tunables for XLA:CPU's buffers: when the restart happens, that it
keeps the command, and that it takes the page faults away
(bertjax/host_memory.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bertjax import host_memory

HERE = {"platform": "linux", "glibc": (2, 36), "thp": "madvise"}
REUSE = ("glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:"
         "glibc.malloc.trim_threshold=1000000000000")
ALL = REUSE + ":glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ,where,expected", [
    ({}, {}, ALL),
    # Other tunables are kept, ours appended.
    ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}, {},
     "glibc.rtld.optional_static_tls=512:" + ALL),
    # A value the user set is kept; only the missing ones are added.
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {},
     "glibc.malloc.hugetlb=0:" + REUSE),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, {},
     "glibc.malloc.arena_max=4:glibc.malloc.mmap_max=0:"
     "glibc.malloc.trim_threshold=1000000000000:glibc.malloc.hugetlb=1"),
    # All set (also what a restarted process sees): no second restart.
    ({"GLIBC_TUNABLES": ALL}, {}, None),
    ({"BERTJAX_MALLOC_TUNABLES": "0"}, {}, None),
    ({"BERTJAX_MALLOC_TUNABLES": "off"}, {}, None),
    ({"BERTJAX_MALLOC_TUNABLES": "1"}, {}, ALL),
    # Huge pages only asked for in madvise mode, and from glibc 2.35.
    ({}, {"thp": "always"}, REUSE),
    ({}, {"thp": "never"}, REUSE),
    ({}, {"thp": None}, REUSE),
    ({}, {"glibc": (2, 34)}, REUSE),
    ({}, {"glibc": (2, 25)}, None),
    ({}, {"glibc": None}, None),
    ({}, {"platform": "darwin"}, None),
])
def test_restart_only_where_the_tunables_help(environ, where, expected):
  assert host_memory.malloc_tunables(
      environ, **{**HERE, **where}) == expected


def _would_restart_here() -> bool:
  env = {k: v for k, v in os.environ.items()
         if k not in (host_memory.TUNABLES, host_memory.OPT_OUT)}
  return host_memory.malloc_tunables(
      env, platform=sys.platform, glibc=host_memory.glibc_version(),
      thp=host_memory.thp_mode()) is not None


needs_restart = pytest.mark.skipif(
    not _would_restart_here(),
    reason="no restart on this machine (not Linux with glibc >= 2.26)")


def _malloc_tunables_here() -> str:
  return host_memory.malloc_tunables(
      _child_env(), platform=sys.platform, glibc=host_memory.glibc_version(),
      thp=host_memory.thp_mode())


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
      host_memory.reexec_with_malloc_tunables()
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
                    "tunables": _malloc_tunables_here(), "mine": "kept"}


@needs_restart
def test_a_sigterm_while_the_restarted_process_starts_waits_for_the_handler(tmp_path):
  # bertjax.main's handler is installed after the restart: a SIGTERM that came
  # while the new interpreter started ended the run with status 143.
  script = tmp_path / "probe.py"
  script.write_text(textwrap.dedent("""
      import os, signal
      from bertjax import host_memory
      host_memory.reexec_with_malloc_tunables(hold_sigterm=True)
      assert os.environ.get("GLIBC_TUNABLES")  # the restarted process
      os.kill(os.getpid(), signal.SIGTERM)  # before the handler, as a slow start
      from bertjax import guards
      guards.catch_sigterm()
      print(guards.PreemptionWatcher.signalled())
  """))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        cwd=tmp_path, env=_child_env(), timeout=120)
  assert (proc.returncode, proc.stdout) == (0, "True\n"), proc.stderr[-2000:]


_FAULTS = textwrap.dedent("""
    import json, resource
    from bertjax import host_memory
    host_memory.reexec_with_malloc_tunables()
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
def test_tunables_take_away_the_page_faults_of_xla_buffers(tmp_path):
  # 64 MiB of fresh output per call is 16,384 faults of 4 KiB pages. Bounds
  # with wide margins: at least half of that without the tunables, and under
  # a twentieth with them (the freed buffer's pages are reused: ~0).
  small_pages = 64 * 2**20 / 4096
  without = _faults_per_call(tmp_path, BERTJAX_MALLOC_TUNABLES="0")
  tuned = _faults_per_call(tmp_path)
  assert without > 0.5 * small_pages, without
  assert tuned < 0.05 * small_pages, (tuned, without)

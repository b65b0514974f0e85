"""Test set-up: 8 fake CPU devices (before JAX is imported) and shared fixtures."""

import atexit
import cProfile
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
# XLA:CPU's LLVM at -O1 instead of its -O2 for the tests' programs (and the
# binaries they start, which inherit XLA_FLAGS): compiles are most of the
# suite's time, and on three compile-heavy files together this took 129-135 s
# against 157-159 s (2026-12-07, Zen 1), their steps no slower. Results move
# by float rounding (a tiny BERT's loss after 6 steps: 10.1496506 against
# 10.1496515); every comparison a test makes is within one setting. Not added
# when XLA_FLAGS already names a level; users' runs keep XLA's default.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# jax's ``with mesh:`` is deprecated: bertjax traces on a mesh through
# ``sharding.use_mesh``, and any use left (here or in the binaries the tests
# start) fails instead of warning.
os.environ.setdefault("JAX_DISALLOW_MESH_CONTEXT_MANAGER", "true")
# One compilation cache for the session: a test that builds the same step
# again (a resumed run, a second mesh of the same shape) loads it instead of
# recompiling. A fresh directory, so no test reads another session's entries.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _jit_cache = tempfile.mkdtemp(prefix="bertjax-tests-jit-")
  atexit.register(shutil.rmtree, _jit_cache, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _jit_cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402

# BERTJAX_TEST_PROFILE=DIR: each test process writes where its time went
# (cProfile, DIR/<worker>.prof; read with pstats, e.g. sorted by cumulative
# time) -- how the README's account of the suite's time was made.
_PROFILE = cProfile.Profile() if os.environ.get("BERTJAX_TEST_PROFILE") else None


def _record_compiles(out):
  """Appends one JSON line per trace, lowering, compile and cache hit to OUT."""
  import json
  from jax import monitoring
  name = os.environ.get("PYTEST_XDIST_WORKER", "main")
  os.makedirs(out, exist_ok=True)
  log = open(os.path.join(out, f"{name}.jsonl"), "a", buffering=1)

  def on_duration(event, secs, **kwargs):
    log.write(json.dumps({
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "event": event,
        "fun": kwargs.get("fun_name", ""), "secs": secs}) + "\n")

  def on_event(event, **kwargs):
    if "compilation_cache" in event:
      on_duration(event, 0.0, **kwargs)

  monitoring.register_event_duration_secs_listener(on_duration)
  monitoring.register_event_listener(on_event)


def pytest_sessionstart(session):
  if _PROFILE is not None:
    _PROFILE.enable()
  # BERTJAX_TEST_COMPILES=DIR: each test process logs every trace, lowering,
  # XLA compile and compilation-cache hit with the test that caused it
  # (DIR/<worker>.jsonl) -- how the suite's compile time was counted.
  if os.environ.get("BERTJAX_TEST_COMPILES"):
    _record_compiles(os.environ["BERTJAX_TEST_COMPILES"])


def pytest_sessionfinish(session):
  if _PROFILE is not None:
    _PROFILE.disable()
    out = os.environ["BERTJAX_TEST_PROFILE"]
    os.makedirs(out, exist_ok=True)
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _PROFILE.dump_stats(os.path.join(out, f"{name}.prof"))


# The files that take longest, longest first (seconds on the 2-core Zen 3
# machine, 2026-11-28: 313 to 100). pytest-xdist hands out whole files
# (``--dist loadfile``) in collection order (``--no-loadscope-reorder``); with
# the long ones first, the two workers end within a short file of each other
# instead of one running a four-minute file alone at the end. A file missing
# here only runs later; a renamed one is simply not moved up.
_LONG_FILES = (
    "test_export_finetuned.py", "test_finetune.py", "test_resilience.py",
    "test_finetune_unanswerable.py", "test_gcs.py", "test_finetune_minilm.py",
    "test_multiprocess.py",
    "test_study.py", "test_notebooks.py", "test_attention_impl.py",
    "test_finetune_inputs.py", "test_interrupts.py", "test_electra.py",
    "test_resume_faults.py",
    "test_train.py", "test_xlnet_memory.py", "test_unilm.py", "test_install.py",
    "test_deberta.py", "test_electra_learning.py",
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_LONG_FILES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def demo_config():
  """The tiny BERT config, as `configs/bert.py:tiny` gives it."""
  from bertjax import config_files
  return config_files.shipped("bert").get_config("tiny")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory, demo_config):
  """The demo corpus prepared once for the whole session (PreparedData)."""
  from bertjax.data import prepare
  data_dir = tmp_path_factory.mktemp("demo_data")
  return prepare.prepare(demo_config, str(data_dir))

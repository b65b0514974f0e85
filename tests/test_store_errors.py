"""A gs:// path on a machine that cannot reach Cloud Storage, or whose
credentials it refuses, ends in one line, not gcsfs's traceback."""

import subprocess
import sys

import aiohttp
from google.auth import exceptions as auth_exceptions

from bertjax import cli


def test_store_failures_are_told_apart_from_other_errors():
  try:
    try:
      raise aiohttp.ClientConnectionError("Cannot connect to host storage.googleapis.com:443")
    except aiohttp.ClientConnectionError as e:
      raise RuntimeError("listing gs://bucket/run1 failed") from e
  except RuntimeError as e:
    wrapped = e
  said = cli.unreachable_store(wrapped)
  assert said.startswith("cannot reach the object store for a gs:// path (Cannot connect "
                         "to host storage.googleapis.com:443); check"), said
  assert "gcloud auth application-default login" in said
  assert cli.unreachable_store(auth_exceptions.DefaultCredentialsError("none found"))
  assert cli.unreachable_store(RuntimeError("something else")) is None
  assert cli.unreachable_store(OSError("disk")) is None


def test_a_binary_says_it_in_one_line_with_status_1(tmp_path):
  script = tmp_path / "main.py"
  script.write_text(
      "import logging\n"
      "import aiohttp\n"
      "from bertjax import cli\n"
      "def main(argv):\n"
      "  error = aiohttp.ClientConnectionError('Cannot connect to host "
      "storage.googleapis.com:443')\n"
      "  try:\n"
      "    raise error\n"
      "  except aiohttp.ClientConnectionError:\n"
      "    # As gcsfs's retry logs it, before it raises the error.\n"
      "    logging.getLogger('gcsfs').error('_request out of retries', exc_info=True)\n"
      "  raise error\n"
      "cli.run(main)\n")
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        cwd=tmp_path, timeout=120)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: cannot reach the object store for a gs:// path (Cannot connect"), proc.stderr


def test_prepare_says_it_in_one_line_with_status_1(tmp_path):
  """bertjax.prepare ran under absl's plain app.run: a gs:// workdir it could
  not reach ended in gcsfs's retry tracebacks and aiohttp's own, status 1
  with nothing saying what to check. The store is made unreachable where the
  real one failed (the workdir's bucket checked before anything is read)."""
  script = tmp_path / "prepare_unreachable.py"
  script.write_text(
      "import logging, runpy, sys\n"
      "import aiohttp\n"
      "from bertjax.data import layout\n"
      "def unreachable(*args, **kwargs):\n"
      "  error = aiohttp.ClientConnectionError('Cannot connect to host "
      "storage.googleapis.com:443')\n"
      "  try:\n"
      "    raise error\n"
      "  except aiohttp.ClientConnectionError:\n"
      "    logging.getLogger('gcsfs').error('_request out of retries', exc_info=True)\n"
      "  raise error\n"
      "layout.check_directories = unreachable\n"
      f"sys.argv = ['prepare', '--config=bert.py:tiny', '--workdir={tmp_path / 'w'}']\n"
      "runpy.run_module('bertjax.prepare', run_name='__main__', alter_sys=True)\n")
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        cwd=tmp_path, timeout=300)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: cannot reach the object store for a gs:// path (Cannot connect"), proc.stderr
  assert not (tmp_path / "w").exists()

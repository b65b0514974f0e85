r"""Runs a notebook of this directory top to bottom with nbclient.

  python notebooks/run.py notebooks/masking_explorer.ipynb --save_figures
  python notebooks/run.py notebooks/quickstart.ipynb --smoke --output=/tmp/qs.ipynb

A failing cell stops the run with nbclient's CellExecutionError (exit status 1).
``--save_figures`` writes the figures a notebook saves (``masking_explorer``:
``docs/masking_explorer.png``, the picture in the README) into ``docs/``;
``--smoke`` runs the few-step sizes the test suite uses. The notebook runs in a
fresh temporary directory with this checkout first on PYTHONPATH, so it uses
this tree's bertjax and nothing relies on the working directory.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from typing import Mapping

import nbclient
import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Draws figures to PNG without a display, as Jupyter's inline plots do.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def kernel_env(extra: Mapping[str, str] = ()) -> dict[str, str]:
  """The kernel's environment: this one, this checkout first on PYTHONPATH,
  headless matplotlib, one CPU device (the test suite's 8 fake devices are
  for its own process), plus ``extra``."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  env["MPLBACKEND"] = INLINE_BACKEND
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                            env.get("XLA_FLAGS", "")).strip()
  env.update(extra)
  return env


def execute(nb: nbformat.NotebookNode, env: Mapping[str, str] = (), *,
            cwd: str | None = None, timeout: int = 900) -> nbformat.NotebookNode:
  """Executes ``nb`` in place (kernel python3) and returns it with outputs.

  Raises:
    nbclient.exceptions.CellExecutionError: a cell raised.
  """
  cwd = cwd or tempfile.mkdtemp(prefix="bertjax-notebook-")
  client = nbclient.NotebookClient(
      nb, timeout=timeout, kernel_name="python3",
      resources={"metadata": {"path": cwd}})
  client.execute(env=kernel_env(env))
  return nb


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("notebook")
  parser.add_argument("--save_figures", action="store_true",
                      help="write the notebook's figures into docs/")
  parser.add_argument("--smoke", action="store_true", help="the tests' tiny sizes")
  parser.add_argument("--output", help="where to write the executed notebook")
  args = parser.parse_args()
  env = {}
  if args.save_figures:
    env.update(BERTJAX_SAVE_FIGURES="1", BERTJAX_FIGURES_DIR=os.path.join(ROOT, "docs"))
  if args.smoke:
    env["BERTJAX_NOTEBOOK_SMOKE"] = "1"
  nb = execute(nbformat.read(args.notebook, as_version=4), env)
  if args.output:
    nbformat.write(nb, args.output)


if __name__ == "__main__":
  main()

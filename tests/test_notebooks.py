"""Every notebook under notebooks/ runs top to bottom (shell lines skipped)."""

import glob
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def code_cells(path):
  with open(path, encoding="utf-8") as f:
    nb = json.load(f)
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      # Colab shell and magic lines (!pip, %cd) are for the notebook user only.
      yield "".join(line for line in cell["source"]
                    if not line.lstrip().startswith(("!", "%")))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch, demo_data):
  monkeypatch.setenv("BERTJAX_NOTEBOOK_STEPS", "8")
  monkeypatch.setenv("BERTJAX_NOTEBOOK_WORKDIR", str(tmp_path))
  monkeypatch.setenv("BERTJAX_NOTEBOOK_DATA_DIR", demo_data.data_dir)
  monkeypatch.chdir(ROOT)
  namespace = {"__name__": "__notebook__"}
  for source in code_cells(path):
    exec(compile(source, path, "exec"), namespace)  # our own notebook, not data
  # The quickstart ends with an evaluation of the trained checkpoint.
  if "again" in namespace:
    assert namespace["again"]["step"] == 8
    assert namespace["again"]["mlm_accuracy"] == pytest.approx(
        namespace["record"]["mlm_accuracy"], rel=1e-5)

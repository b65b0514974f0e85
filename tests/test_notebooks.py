"""Every notebook under notebooks/ runs top to bottom in a Jupyter kernel
(nbclient, tiny sizes via BERTJAX_NOTEBOOK_SMOKE, CPU), and a failing cell
fails the run. Committed notebooks carry no outputs."""

import glob
import importlib.util
import json
import math
import os

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
_spec = importlib.util.spec_from_file_location(
    "notebook_runner", os.path.join(ROOT, "notebooks", "run.py"))
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def read(name):
  return nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)


def _smoke_env(tmp_path, env):
  """The kernel's environment: the smoke sizes, and a TMPDIR under the test's
  tmp_path, so that the directories the notebooks make with tempfile (their
  workdirs, an HF export) go when pytest clears its tmp_paths instead of
  piling up in /tmp with every run."""
  tmp = tmp_path / "tmpdir"
  tmp.mkdir(exist_ok=True)
  return {"BERTJAX_NOTEBOOK_SMOKE": "1", "TMPDIR": str(tmp), **env}


def run(name, tmp_path, **env):
  """Executes a notebook with the smoke sizes in a directory outside the checkout."""
  cwd = tmp_path / f"cwd-{name}"
  cwd.mkdir()
  return runner.execute(read(name), _smoke_env(tmp_path, env), cwd=str(cwd))


def run_cells(name, indices, tmp_path, **env):
  """Runs the code cells ``indices`` of a notebook, in that order (repeats
  allowed; a string is a cell of the user's own), in one kernel, as a user
  re-running cells would; returns the stream text each run printed."""
  import nbclient
  nb = read(name)
  cwd = tmp_path / f"cells-{name}"
  cwd.mkdir(exist_ok=True)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(cwd)}})
  printed = []
  with client.setup_kernel(env=runner.kernel_env(_smoke_env(tmp_path, env))):
    for index in indices:
      if isinstance(index, str):  # the user's own cell
        cell, index = nbformat.v4.new_code_cell(index), len(nb.cells) - 1
      else:
        cell = nbformat.from_dict(dict(nb.cells[index], outputs=[]))
      client.execute_cell(cell, index)
      printed.append("".join(o.get("text", "") for o in cell.outputs
                             if o.output_type == "stream"))
  return printed


def text_of(nb):
  return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs if o.output_type == "stream")


def images(nb):
  return [c for c in nb.cells if c.cell_type == "code" for o in c.outputs
          if "image/png" in o.get("data", {})]


def test_notebooks_are_committed_without_outputs():
  assert {os.path.basename(p) for p in NOTEBOOKS} >= {
      "quickstart.ipynb", "masking_explorer.ipynb", "checkpoint_eval.ipynb"}
  for path in NOTEBOOKS:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
      if cell.cell_type == "code":
        assert cell.outputs == [] and cell.execution_count is None, path


def test_readme_badges_and_picture():
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  for path in NOTEBOOKS:
    badge = ("https://colab.research.google.com/github/bertjax/bertjax/blob/main/"
             f"notebooks/{os.path.basename(path)}")
    assert badge in readme
  assert "docs/masking_explorer.png" in readme
  size = os.path.getsize(os.path.join(ROOT, "docs", "masking_explorer.png"))
  assert 0 < size < 150_000


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, demo_data):
  tmp = tmp_path_factory.mktemp("quickstart")
  workdir = tmp / "workdir"
  nb = run("quickstart.ipynb", tmp, BERTJAX_NOTEBOOK_WORKDIR=str(workdir),
           BERTJAX_NOTEBOOK_DATA_DIR=demo_data.data_dir)
  return nb, workdir


def test_quickstart_trains_plots_evaluates_and_fills_masks(quickstart):
  nb, workdir = quickstart
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit()) == [10, 20]
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in rows if "loss" in r]
  assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
  assert len(images(nb)) == 1  # the loss / accuracy curves
  record = json.loads((workdir / "eval_20.json").read_text())
  assert 0 <= record["mlm_accuracy"] <= 1 and record["num_predictions"] > 0
  # The fill-mask cell prints five "score piece" lines, most probable first.
  out = text_of(nb)
  assert "MLM accuracy" in out
  fill = [c for c in nb.cells if c.cell_type == "code" and "fill_mask" in c.source][0]
  lines = fill.outputs[0]["text"].splitlines()
  scores = [float(l.split()[0]) for l in lines[:5]]
  assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
  assert "[MASK]" not in lines[5]


def test_checkpoint_eval_compares_two_steps(quickstart, tmp_path, demo_data):
  _, workdir = quickstart
  nb = run("checkpoint_eval.ipynb", tmp_path, BERTJAX_NOTEBOOK_WORKDIR=str(workdir),
           BERTJAX_NOTEBOOK_DATA_DIR=demo_data.data_dir)
  out = text_of(nb)
  assert "checkpoints at steps [10, 20]" in out
  for step in (10, 20):
    assert (workdir / f"eval_{step}.json").exists()
  assert len(images(nb)) == 1  # the similarity matrix
  # The HF export loads back to the same model.
  assert "largest difference from the workdir: 0.0" in out


def test_quickstart_config_cell_run_again_keeps_the_workdir(tmp_path):
  # Cell 4 picks the workdir; a second run of it must not start a new run
  # in a new temporary directory (the next cell would train from scratch).
  config_cell = [i for i, c in enumerate(read("quickstart.ipynb").cells)
                 if "mkdtemp" in c.source][0]
  _, first, second = run_cells("quickstart.ipynb", [2, config_cell, config_cell], tmp_path)
  assert first.split()[0] == second.split()[0]
  assert os.path.isdir(first.split()[0])


def test_checkpoint_eval_with_a_users_hf_directory(quickstart, tmp_path, demo_data):
  # A user's HF directory under /tmp is not the workdir's own export: the
  # notebook loads it without comparing it with the workdir's embeddings.
  from bertjax.convert import workdir as convert_workdir
  _, workdir = quickstart
  hf_dir = tmp_path / "my-hf-model"
  convert_workdir.export_hf(str(workdir), str(hf_dir))
  cells = [i for i, c in enumerate(read("checkpoint_eval.ipynb").cells)
           if c.cell_type == "code" and "evaluate_checkpoint" not in c.source]
  printed = run_cells("checkpoint_eval.ipynb", cells, tmp_path,
                      BERTJAX_NOTEBOOK_WORKDIR=str(workdir),
                      BERTJAX_NOTEBOOK_DATA_DIR=demo_data.data_dir,
                      BERTJAX_NOTEBOOK_HF_DIR=str(hf_dir))
  assert "config.json" in printed[-1]
  assert "largest difference" not in printed[-1]


def test_masking_explorer_draws_and_measures(tmp_path, demo_data):
  figures = tmp_path / "figures"
  figures.mkdir()
  nb = run("masking_explorer.ipynb", tmp_path, BERTJAX_NOTEBOOK_DATA_DIR=demo_data.data_dir,
           BERTJAX_SAVE_FIGURES="1", BERTJAX_FIGURES_DIR=str(figures))
  png = figures / "masking_explorer.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000
  assert len(images(nb)) == 2  # the strips, and XLNet's and UniLM's masks
  out = text_of(nb)
  stats = json.loads(out.split("MASKING_STATS ")[1].splitlines()[0])
  # 256 copies x ~3 chosen tokens: the 80/10/10 shares within ~3.5 sd.
  assert stats["bert_mask"] == pytest.approx(0.8, abs=0.05)
  assert stats["bert_random"] == pytest.approx(0.1, abs=0.04)
  assert stats["bert_kept"] == pytest.approx(0.1, abs=0.04)
  assert abs(stats["bert_chosen_per_row"] - 0.15 * stats["bert_candidates_per_row"]) <= 1
  assert stats["whole_word_split_words"] == 0
  assert stats["specials_chosen"] == 0
  assert stats["sbo_slots"] > 0 and stats["sbo_bad_slots"] == 0
  # The XLNet and UniLM cell asserts its matrices against their definitions.
  assert "xlnet: drawn" in out and "unilm: drawn" in out


def test_masking_explorer_cell_run_again_draws_its_strip_once(tmp_path, demo_data):
  cells = read("masking_explorer.ipynb").cells
  electra = [i for i, c in enumerate(cells) if "untrained generator" in c.source
             and c.cell_type == "code"][0]
  code = [i for i, c in enumerate(cells) if c.cell_type == "code" and i <= electra]
  printed = run_cells("masking_explorer.ipynb",
                      code + [electra, "print(json.dumps([s['title'] for s in strips]))"],
                      tmp_path, BERTJAX_NOTEBOOK_DATA_DIR=demo_data.data_dir)
  titles = json.loads(printed[-1])
  assert len(titles) == len(set(titles)) and titles[-1].startswith("ELECTRA")


def test_a_failing_cell_fails_the_run(tmp_path):
  nb = read("quickstart.ipynb")
  index = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"][1]
  nb.cells[index].source = "raise RuntimeError('deliberately failing cell')"
  with pytest.raises(Exception) as error:
    runner.execute(nb, {"BERTJAX_NOTEBOOK_SMOKE": "1"}, cwd=str(tmp_path))
  from nbclient.exceptions import CellExecutionError
  assert isinstance(error.value, CellExecutionError)
  assert "deliberately failing cell" in str(error.value)

"""``--from_hf`` refusals: a workdir that is (or lies in) the HF model
directory or another one, a base config whose objective cannot train the
imported model, and HF files that cannot be read. Each is one sentence that
names the file and the fix, and nothing is written."""

import json
import os
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from bertjax import config_files
from bertjax.convert import workdir as workdir_lib
from test_convert import hf_bert  # noqa: F401  (a fixture)
from tree_snapshot import tree_hash

torch = pytest.importorskip("torch", reason="these tests need torch (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy(hf_bert, tmp_path, name="hf"):
  """A copy of the tiny HF BERT in ``tmp_path/name``, to change."""
  out = tmp_path / name
  shutil.copytree(hf_bert[0], out)
  return out


def test_cli_refuses_the_hf_directory_as_its_own_workdir(hf_bert, tmp_path):
  hf = _copy(hf_bert, tmp_path)
  before = tree_hash(str(hf))
  run = subprocess.run(
      [sys.executable, "-m", "bertjax.convert", f"--from_hf={hf}", f"--workdir={hf}",
       "--config=configs/bert.py:tiny"],
      capture_output=True, text=True, cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={hf} is the --from_hf directory itself, which the import "
      "only reads and must not write into (its config.json would be replaced); "
      "pass --workdir a new directory outside it.")
  assert tree_hash(str(hf)) == before


def test_import_refuses_a_workdir_inside_the_hf_directory_or_another_one(
    hf_bert, tmp_path, demo_config):
  hf = _copy(hf_bert, tmp_path)
  other = _copy(hf_bert, tmp_path, "other_hf")  # holds HF's config.json
  before = {d: tree_hash(str(d)) for d in (hf, other)}
  with pytest.raises(ValueError, match=r"lies inside the --from_hf directory"):
    workdir_lib.import_hf(str(hf), str(hf / "bertjax"), demo_config)
  with pytest.raises(ValueError, match=(
      r"^--workdir=.*other_hf holds a config.json that bertjax did not write "
      r"\(a Hugging Face model directory\?\), which the import would replace; "
      r"pass --workdir a new directory.$")):
    workdir_lib.import_hf(str(hf), str(other), demo_config)
  # A symlink to the HF directory is the HF directory.
  os.symlink(hf, tmp_path / "link")
  with pytest.raises(ValueError, match="is the --from_hf directory itself"):
    workdir_lib.import_hf(str(hf), str(tmp_path / "link"), demo_config)
  assert {d: tree_hash(str(d)) for d in (hf, other)} == before
  assert sorted(os.listdir(tmp_path)) == ["hf", "link", "other_hf"]


def test_import_refuses_a_base_config_whose_objective_cannot_train_the_model(
    hf_bert, tmp_path):
  # ELECTRA's objective on the imported BERT failed in training, after data
  # and init, with "BertForPretraining object has no attribute generate".
  workdir = tmp_path / "wd"
  with pytest.raises(ValueError, match=(
      r"^--config has objective 'electra', which cannot train the imported 'bert' "
      r"model: it runs only with 'electra'; leave --config out, or pass a config "
      r"of that model's system \(e.g. --config=configs/bert.py:base\).$")):
    workdir_lib.import_hf(hf_bert[0], str(workdir), config_files.load("electra:tiny"))
  assert not workdir.exists()


class _Evil:
  def __reduce__(self):
    return (os.system, ("echo never run",))


def _refused(hf, words):
  with pytest.raises(ValueError, match=words) as refusal:
    workdir_lib.load_hf(str(hf))
  assert "\n" not in str(refusal.value)


@pytest.mark.parametrize("problem", ["cut_safetensors", "unsafe_pickle",
                                     "damaged_pickle", "invalid_json"])
def test_unreadable_hf_files_are_refused_naming_the_file(hf_bert, tmp_path, problem):
  # Each raised a traceback (SafetensorError, torch's 40-line UnpicklingError,
  # json's error without the file's name).
  hf = _copy(hf_bert, tmp_path)
  weights, legacy = hf / "model.safetensors", hf / "pytorch_model.bin"
  if problem == "cut_safetensors":
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    words = (rf"^{weights} cannot be read as safetensors \(.*\): it is damaged or "
             r"cut short; download or save it again.$")
  elif problem == "unsafe_pickle":
    weights.unlink()
    torch.save({"weight": _Evil()}, legacy)
    words = (rf"^{legacy} cannot be read as weights only: its pickle calls "
             r"posix.system, which bertjax does not run; convert it to "
             r"model.safetensors where you trust the file")
  elif problem == "damaged_pickle":
    weights.unlink()
    legacy.write_bytes(b"not a checkpoint")
    words = rf"^{legacy} cannot be read as a PyTorch checkpoint \(.*\): it is damaged"
  else:
    (hf / "config.json").write_text("{vocab_size: 150}")
    words = (rf"^{hf}/config.json is not valid JSON \(Expecting property name "
             r".*\); restore the file")
  _refused(hf, words)


def test_tensors_of_another_vocabulary_size_are_refused(hf_bert, tmp_path):
  hf = _copy(hf_bert, tmp_path)
  config = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**config, "vocab_size": 200}))
  _refused(hf, rf"^{hf}: HF tensor bert.embeddings.word_embeddings.weight has 150 "
           r"vocabulary rows but config.json's vocab_size is 200; set vocab_size "
           r"to 150 in config.json")

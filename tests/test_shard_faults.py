"""Damaged shards (issue 11.5): one line naming the shard and the fix, `--verify`, `--repair`.

Each test damages a copy of the session's demo data the way disks and copies
do: flipped bytes (same size) or a file truncated to half.
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import pipeline
from bertjax.data import prepare
from bertjax.data import shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOKENIZED = os.path.join("bertjax_tokenized", "bertjax_python_docs", "1.0.0")
_TEXT = os.path.join("bertjax_python_docs", "1.0.0")


def _shard(data_dir, dataset, split):
  name = dataset.split(os.sep)[0]
  return os.path.join(data_dir, dataset, f"{name}-{split}.array_record-00000-of-00001")


def _flip(path):
  """Inverts one byte in every 512 of the first half: records there break, the size stays."""
  data = bytearray(open(path, "rb").read())
  for k in range(100, len(data) // 2, 512):
    data[k] ^= 0xFF
  open(path, "wb").write(bytes(data))


def _truncate(path):
  data = open(path, "rb").read()
  open(path, "wb").write(data[:len(data) // 2])


def _snapshot(root):
  return {os.path.join(d, f): open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(root) for f in files}


@pytest.fixture
def data_copy(tmp_path, demo_data, demo_config):
  """(config pointing at a private copy of the demo data, that data_dir)."""
  data_dir = str(tmp_path / "data")
  shutil.copytree(demo_data.data_dir, data_dir)
  config = demo_config.copy_and_resolve_references()
  config.data_dir = data_dir
  return config, data_dir


def _run(module, *args, workdir):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run(
      [sys.executable, "-m", module, "--config=configs/bert.py:tiny",
       f"--workdir={workdir}", *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_truncated_shard_is_refused_in_one_line_before_training(data_copy, tmp_path):
  config, data_dir = data_copy
  shard = _shard(data_dir, _TOKENIZED, "train")
  _truncate(shard)
  with pytest.raises(shards.DamagedShardError) as error:
    prepare.prepare(config, data_dir)
  message = str(error.value)
  assert isinstance(error.value, ValueError) and "\n" not in message
  assert message.startswith(f"Shard {shard} of data_dir {data_dir} is damaged (")
  assert "bytes where prepare wrote" in message
  assert "python -m bertjax.prepare --repair" in message

  # Through the training binary: bertjax.cli prints it as its one error line.
  workdir = tmp_path / "run"
  proc = _run("bertjax.main", f"--config.data_dir={data_dir}", workdir=workdir)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
  assert last == f"error: {message}"
  checkpoints = workdir / "checkpoints"
  assert not checkpoints.exists() or not os.listdir(checkpoints)


def test_flipped_bytes_are_named_while_training_and_evaluating(data_copy):
  config, data_dir = data_copy
  for split in ("train", "validation"):
    _flip(_shard(data_dir, _TOKENIZED, split))
  prepared = prepare.prepare(config, data_dir)  # same sizes: only reading tells
  config.batch_size, config.seq_len, config.shuffle_window = 8, 64, 16
  batches = pipeline.make_train_iterator(config, prepared.source("train"),
                                         local_batch_size=8)
  with pytest.raises(shards.DamagedShardError) as error:
    next(batches)
  # str() is what bertjax.cli prints (grain only appends a note to the exception).
  assert re.fullmatch(
      rf"Shard {re.escape(_shard(data_dir, _TOKENIZED, 'train'))} of data_dir "
      rf"{re.escape(data_dir)} is damaged \(chunk \w+ hash mismatch at byte \d+\); "
      r"re-prepare it with `python -m bertjax.prepare --repair` and the same "
      r"--config and --workdir \(`--verify` lists every damaged shard\)\.",
      str(error.value))
  evaluation = pipeline.make_eval_batches(config, prepared.source("validation"),
                                          local_batch_size=8)
  with pytest.raises(shards.DamagedShardError) as error:
    list(evaluation)
  assert _shard(data_dir, _TOKENIZED, "validation") in str(error.value)


def test_verify_reports_and_repair_reprepares(data_copy, demo_data, tmp_path):
  config, data_dir = data_copy
  damaged = {_shard(data_dir, _TOKENIZED, "train"): _truncate,
             _shard(data_dir, _TEXT, "validation"): _flip}
  for path, damage in damaged.items():
    damage(path)
  before = _snapshot(data_dir)
  args = (f"--config.data_dir={data_dir}",)

  proc = _run("bertjax.prepare", *args, "--verify", workdir=tmp_path / "w")
  assert proc.returncode == 1, proc.stderr
  lines = [line for line in proc.stdout.splitlines() if line.strip()]
  verdicts = {line.split()[2]: line.split()[0] for line in lines[:-1]}
  assert len(verdicts) == 4  # train and validation of the text and the tokens
  assert {p for p, v in verdicts.items() if v == "DAMAGED"} == set(damaged)
  assert lines[-1].endswith(": 2 ok, 2 damaged")
  assert _snapshot(data_dir) == before  # --verify changes nothing

  # A config the data_dir's tokenizer does not fit is refused before any
  # damaged shard is removed (it used to remove them, then stop).
  proc = _run("bertjax.prepare", *args, "--config.vocab_size=4000", "--repair",
              workdir=tmp_path / "w")
  assert proc.returncode == 2, proc.stderr
  assert "set --config.vocab_size=8000" in proc.stderr.strip().splitlines()[-1]
  assert "removed damaged" not in proc.stdout and _snapshot(data_dir) == before

  proc = _run("bertjax.prepare", *args, "--repair", workdir=tmp_path / "w")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("removed damaged") == 2
  proc = _run("bertjax.prepare", *args, "--verify", workdir=tmp_path / "w")
  assert proc.returncode == 0 and "4 ok, 0 damaged" in proc.stdout
  # Re-prepared shards hold the same documents as the undamaged ones did.
  repaired = prepare.prepare(config, data_dir).source("train")
  original = demo_data.source("train")
  assert len(repaired) == len(original)
  for i in range(0, len(original), 37):
    assert np.array_equal(repaired[i]["tokens"], original[i]["tokens"])


def test_shards_without_manifest_are_verified_by_decoding(data_copy):
  """Shards prepared before manifests existed: no sizes to compare, decoding still tells."""
  config, data_dir = data_copy
  for dataset in (_TOKENIZED, _TEXT):
    os.remove(os.path.join(data_dir, dataset, shards.MANIFEST))
  _flip(_shard(data_dir, _TOKENIZED, "validation"))
  prepare.prepare(config, data_dir)  # nothing to compare sizes with
  reports = shards.verify(data_dir)
  assert not any(r.checksum for r in reports)
  bad = [r for r in reports if r.problem]
  assert [r.shard.path for r in bad] == [_shard(data_dir, _TOKENIZED, "validation")]
  assert "hash mismatch" in bad[0].problem


def test_repair_refuses_to_rebuild_local_text_from_changed_files(demo_config, tmp_path):
  """A damaged text dataset of the user's files is made again by --repair
  only from the files it was made from: from changed ones it would no longer
  be the text the run's tokenized shards (and any of their rebuilds) hold."""
  from bertjax.data import text_sources
  src = tmp_path / "src"
  src.mkdir()
  for n in range(3):
    (src / f"{n}.txt").write_text(f"Document {n} starts here. It has a second sentence.\n")
  config = demo_config.copy_and_resolve_references()
  config.dataset, config.text_files = "bertjax_local_text", f"{src}/*.txt"
  data_dir = str(tmp_path / "data")
  dataset_dir = text_sources._local_text(config, data_dir, text_sources.Engine())
  text_sources.check_rebuildable(dataset_dir)  # the same files: it may be rebuilt
  _flip(os.path.join(dataset_dir, "bertjax_local_text-train.array_record-00000-of-00001"))
  (src / "3.txt").write_text("A file added since. It was not read.\n")
  before = _snapshot(data_dir)

  args = (f"--config.data_dir={data_dir}", "--config.dataset=bertjax_local_text",
          f"--config.text_files={src}/*.txt")
  proc = _run("bertjax.prepare", *args, "--repair", workdir=tmp_path / "w")
  assert proc.returncode == 2, proc.stderr
  error = proc.stderr.strip().splitlines()[-1]
  assert re.fullmatch(
      rf"error: The files of --config.text_files='{re.escape(str(src))}/\*\.txt' have "
      rf"changed since {re.escape(dataset_dir)} was prepared from them \(1 added "
      rf"\({re.escape(str(src / '3.txt'))}\)\); put them back as they were to repair "
      r"it \(--repair makes it again from them\), or point --config\.data_dir at a "
      r"new directory to prepare them anew\.", error), error
  assert "removed damaged" not in proc.stdout
  assert _snapshot(data_dir) == before  # the damaged dataset is still there
  (src / "3.txt").unlink()
  text_sources.check_rebuildable(dataset_dir)  # put back: --repair may go on


def test_verify_reports_what_an_interrupted_prepare_left_unfinished(data_copy, tmp_path):
  """A prepare killed while tokenizing leaves its finished units in .staging
  and no tokenized dataset: every shard there is sound, but the config's
  data is not prepared, and --verify says so (status 1) with the fix."""
  config, data_dir = data_copy
  tokenized = os.path.join(data_dir, _TOKENIZED)
  shutil.rmtree(tokenized)
  os.makedirs(os.path.join(tokenized, ".staging"))
  args = (f"--config.data_dir={data_dir}",)
  proc = _run("bertjax.prepare", *args, "--verify", workdir=tmp_path / "w")
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert re.search(r"^MISSING +tokenized dataset " + re.escape(tokenized)
                   + r"  \(unfinished", proc.stdout, re.M), proc.stdout
  assert "2 ok, 0 damaged" in proc.stdout
  assert proc.stdout.strip().endswith(f"1 of what the config needs is not (fully) "
                                      f"prepared in {data_dir}")
  assert "run the same command without --verify" in proc.stderr
  prepare.prepare(config, data_dir)  # the fix
  proc = _run("bertjax.prepare", *args, "--verify", workdir=tmp_path / "w")
  assert proc.returncode == 0 and "MISSING" not in proc.stdout, proc.stdout

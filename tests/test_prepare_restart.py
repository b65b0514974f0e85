"""kill -9 during prepare, then rerun: the same shards as an uninterrupted prepare.

TFDS writes a dataset under an ``incomplete.*`` directory and renames it when
done, and the tokenizer is written to a temporary file and renamed, so a killed
prepare leaves nothing that a later run would trust.
"""

import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data import python_docs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COPIES = 6  # ~2 MB of text: prepare takes several seconds, room to kill it.


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("restart_texts")
  for copy in range(_COPIES):
    for name, paragraphs in python_docs.topic_documents():
      (root / f"{copy}_{name.split(':')[1]}.txt").write_text(
          "\n\n".join(f"{p} ({copy})" for p in paragraphs) + "\n")
  return root


def _command(corpus, workdir):
  return [sys.executable, "-m", "bertjax.prepare", "--config=configs/bert.py:tiny",
          f"--workdir={workdir}", "--config.dataset=bertjax_local_text/paragraphs",
          f"--config.text_files={corpus}/*.txt", "--config.vocab_size=400"]


def _env():
  # The subprocess imports this checkout's bertjax, not an installed one.
  return dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _shards(workdir):
  """What prepare made under workdir/data: tokenizer sha256 and decoded records.

  Records are compared decoded: TFDS serializes a record's features in an order
  that varies between processes (string hashing), so equal records may differ
  in bytes.
  """
  data = os.path.join(workdir, "data")
  out = {}
  for dirpath, _, files in os.walk(data):
    for f in files:
      path = os.path.join(dirpath, f)
      if f.endswith(".model"):
        with open(path, "rb") as fh:
          out[os.path.relpath(path, data)] = hashlib.sha256(fh.read()).hexdigest()
      elif f == "dataset_info.json" and "incomplete" not in dirpath:
        builder = tfds.builder_from_directory(dirpath)
        for split in builder.info.splits:
          source = builder.as_data_source(split)
          out[f"{os.path.relpath(dirpath, data)}:{split}"] = [
              {k: np.asarray(v).tolist() for k, v in source[i].items()}
              for i in range(len(source))]
  return out


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("whole")
  subprocess.run(_command(corpus, workdir), cwd=_ROOT, env=_env(), check=True,
                 capture_output=True)
  shards = _shards(workdir)
  assert any("bertjax_tokenized" in p for p in shards)
  return shards


# Kill while the text dataset is being written, and while the tokenized one is.
@pytest.mark.parametrize("kill_when", ["bertjax_local_text", "bertjax_tokenized"])
def test_kill_9_then_rerun_gives_the_same_shards(corpus, uninterrupted, tmp_path,
                                                  kill_when):
  watched = tmp_path / "data" / kill_when
  proc = subprocess.Popen(_command(corpus, tmp_path), cwd=_ROOT, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not watched.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.005)
  killed = proc.poll() is None
  if killed:
    os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert killed, f"prepare finished before {kill_when} appeared; enlarge the corpus"
  assert _shards(tmp_path) != uninterrupted  # it really stopped half-way
  subprocess.run(_command(corpus, tmp_path), cwd=_ROOT, env=_env(), check=True,
                 capture_output=True)
  got = _shards(tmp_path)
  assert sorted(got) == sorted(uninterrupted)
  assert [k for k in got if got[k] != uninterrupted[k]] == []

"""prepare at scale: the same shards from 1 or 2 workers, Beam, or after kill -9;
a uniform tokenizer sample; a huge one-line file read a block at a time."""

import hashlib
import os
import tempfile
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

import corpus_files

from bertjax.data import builders
from bertjax.data import prepare
from bertjax.data import shards
from bertjax.data import staged
from bertjax.data import units

_BLOCK_MB = 0.03  # ~10 units for the ~300 KB test corpus


def _config(demo_config, text_files, **overrides):
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = str(text_files)
  config.vocab_size = 600
  config.prepare_block_mb = _BLOCK_MB
  config.tokenizer_sample_sentences = 2000
  for k, v in overrides.items():
    config[k] = v
  return config


def _published(data_dir):
  """relative path -> sha256 of every published shard and the tokenizer."""
  out = {}
  for root, _, files in os.walk(data_dir):
    for name in files:
      if ".array_record-" in name or name.endswith(".model"):
        path = os.path.join(root, name)
        with open(path, "rb") as f:
          out[os.path.relpath(path, data_dir)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The pydoc topics, one file each, plus a file larger than a unit."""
  root = tmp_path_factory.mktemp("scale_texts")
  big = corpus_files.write_topic_files(root)[:400]
  (root / "zz_big.txt").write_text("\n\n".join(big) + "\n")
  return root


@pytest.fixture(scope="module")
def reference(corpus, demo_config, tmp_path_factory):
  """One in-process prepare (1 worker): data_dir and its published files."""
  data_dir = str(tmp_path_factory.mktemp("reference") / "data")
  config = _config(demo_config, f"{corpus}/*.txt", prepare_workers=1)
  prepared = prepare.prepare(config, data_dir)
  return data_dir, _published(data_dir), prepared


def test_many_units_and_shards(reference, corpus):
  data_dir, files, prepared = reference
  text_shards = [f for f in files if f.startswith("bertjax_local_text/")]
  token_shards = [f for f in files if f.startswith("bertjax_tokenized/")]
  assert len(text_shards) >= 5 and len(token_shards) >= 5
  # The large file was cut into several documents, all in one split.
  source = prepared.source("train")
  assert prepared.splits["train"] == len(source)
  builder_dir = os.path.join(data_dir, "bertjax_local_text", "files", "1.0.0")
  import tensorflow_datasets as tfds
  ids = {split: [r["id"].decode() for r in tfds.builder_from_directory(builder_dir)
                 .as_data_source(split)] for split in ("train", "validation")}
  pieces = {s: [i for i in v if i.startswith("zz_big.txt@")] for s, v in ids.items()}
  assert len(pieces["train"]) + len(pieces["validation"]) >= 3
  assert not pieces["train"] or not pieces["validation"]
  assert not os.path.exists(os.path.join(builder_dir, staged.STAGING))


def test_two_workers_give_the_same_bytes(reference, corpus, demo_config, tmp_path):
  _, want, _ = reference
  data_dir = str(tmp_path / "data")
  prepare.prepare(_config(demo_config, f"{corpus}/*.txt", prepare_workers=2), data_dir)
  assert _published(data_dir) == want


def test_beam_direct_runner_gives_the_same_bytes(reference, corpus, demo_config,
                                                  tmp_path):
  pytest.importorskip("apache_beam")
  _, want, _ = reference
  data_dir = str(tmp_path / "data")
  prepare.prepare(_config(demo_config, f"{corpus}/*.txt"), data_dir,
                  beam_runner="DirectRunner")
  assert _published(data_dir) == want


def test_kill_9_then_rerun_gives_the_same_bytes(reference, corpus, tmp_path):
  """A prepare killed (whole process group) once units are done resumes from them."""
  _, want, _ = reference
  workdir = tmp_path / "run"
  flags = [sys.executable, "-m", "bertjax.prepare", "--config=bert.py:tiny",
           f"--workdir={workdir}", "--config.dataset=bertjax_local_text",
           f"--config.text_files={corpus}/*.txt", "--config.vocab_size=600",
           f"--config.prepare_block_mb={_BLOCK_MB}",
           "--config.tokenizer_sample_sentences=2000", "--config.prepare_workers=2"]
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  proc = subprocess.Popen(flags, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True, env=env, cwd=str(tmp_path))
  staging = workdir / "data" / "bertjax_tokenized" / "bertjax_local_text" / "1.0.0" / (
      staged.STAGING)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if staging.exists() and any(p.suffix == ".json" for p in staging.iterdir()):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "prepare finished before it could be killed"
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  done = [p for p in staging.iterdir() if p.suffix == ".json"]
  assert done and not (staging.parent / "dataset_info.json").exists()
  rerun = subprocess.run(flags, capture_output=True, text=True, env=env,
                         cwd=str(tmp_path))
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  match = re.search(r"(\d+) units, (\d+) to do", rerun.stderr.split("Tokenizing")[-1])
  assert match and int(match.group(2)) < int(match.group(1))
  assert _published(str(workdir / "data")) == want


def test_an_empty_split_of_a_unit_stages_no_file(tmp_path):
  # Riegeli pads even an empty file to 128 KiB: a unit whose validation
  # split was empty used to stage one.
  serialize = staged.Serializer(builders.text_features())
  doc = lambda i: serialize({"id": f"d{i}", "sentences": [f"Sentence {i}."]})
  dataset_dir = tmp_path / "data" / "bertjax_local_text" / "files" / "1.0.0"
  stage = staged.Stage(str(dataset_dir), "bertjax_local_text", "plan")
  empty = stage.write_unit(0, {"train": [doc(0), doc(1)], "validation": iter(())}, {})
  assert empty["records"] == {"train": 2, "validation": 0}
  assert sorted(os.listdir(dataset_dir / staged.STAGING)) == [
      "unit-00000.json", "unit-00000.train.array_record"]
  # A rerun finds the unit done, and reads no record of its empty split.
  assert stage.receipt(0) == empty and list(stage.records(0, "validation")) == []
  stage.write_unit(1, {"train": [doc(2)], "validation": [doc(3)]}, {})
  assert list(stage.records(1, "validation")) == [doc(3)]
  stage.publish(2, ["train", "validation"], builders.text_features(), {}, "test")
  splits = tfds.builder_from_directory(str(dataset_dir)).info.splits
  assert (splits["train"].shard_lengths, splits["validation"].shard_lengths) == ([2, 1], [1])
  assert [r.problem for r in shards.verify(str(tmp_path / "data"))] == [None] * 3


def test_a_local_unit_leaves_nothing_in_the_temp_directory_while_written(
    tmp_path, monkeypatch):
  # A worker killed mid-unit used to leave an empty bertjax-unit-* directory
  # in /tmp, one per unit it was writing (only a gs:// dataset needs one).
  temp = tmp_path / "temp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  serialize = staged.Serializer(builders.text_features())
  seen = []

  def docs():
    for i in range(3):
      seen.append(os.listdir(temp))  # what a kill here would leave behind
      yield serialize({"id": f"d{i}", "sentences": [f"Sentence {i}."]})
  stage = staged.Stage(str(tmp_path / "data" / "x" / "1.0.0"), "x", "plan")
  assert stage.write_unit(0, {"train": docs()}, {})["records"] == {"train": 3}
  assert seen == [[], [], []] and os.listdir(temp) == []


def test_a_builder_of_an_unprepared_corpus_leaves_no_temporary_directory(
    tmp_path, monkeypatch):
  # TFDS looked in its bucket for the dataset's metadata (its GCS access off)
  # and left an empty /tmp/tmp*tfds directory each time: two a prepare.
  temp = tmp_path / "temp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  builder = builders.BertjaxPythonDocs(data_dir=str(tmp_path / "data"))
  assert builder.info.splits.total_num_examples == 0  # not prepared
  assert os.listdir(temp) == []


def test_tokenizer_sample_is_uniform_over_a_sorted_corpus(demo_config, tmp_path):
  """Sources sorted by name: the last one's words still get pieces.

  Three sources of 3000 sentences, each with its own invented words; the
  sample is 1500 sentences, so training on the first 1500 (the old way) would
  see only source A. Each source's share of the sample is checked against
  1/3 within 5 standard deviations of a binomial draw.
  """
  rng = np.random.default_rng(0)
  syllables = {"a": ["ka", "lo", "mi"], "b": ["tu", "ne", "sa"], "c": ["zor", "quib", "vex"]}
  words = {s: ["".join(rng.choice(syl, 4)) for _ in range(30)] for s, syl in syllables.items()}
  for source in "abc":
    lines = [" ".join(rng.choice(words[source], 8)).capitalize() + "." for _ in range(3000)]
    (tmp_path / f"{source}.txt").write_text("\n\n".join(
        " ".join(lines[i:i + 10]) for i in range(0, 3000, 10)) + "\n")
  config = _config(demo_config, f"{tmp_path}/*.txt", tokenizer_sample_sentences=1500,
                   vocab_size=420,
                   dataset="bertjax_local_text/paragraphs", prepare_workers=1)
  data_dir = str(tmp_path / "data")
  prepared = prepare.prepare(config, data_dir)
  tok = prepared.tokenizer()
  for source in "abc":
    pieces = np.mean([len(tok.encode(w)[0]) for w in words[source]])
    assert pieces <= 2.5, (source, pieces)  # whole invented words, not bytes

  # The sample itself: about 1500 sentences, each source by its share.
  sources = prepare.text_sources.text_sources(config, data_dir, prepare.engine_of(config))
  train = sources["train"]
  totals, kept = {s: 0 for s in "abc"}, {s: 0 for s in "abc"}
  docs = list(train.source.documents(0, train.num_docs))
  threshold = int(1500 / sum(len(sents) for _, (_, sents) in docs) * 2.0**64)
  for index, (doc_id, sents) in docs:
    keys = units.sentence_keys(0, index, len(sents))
    totals[doc_id[0]] += len(sents)
    kept[doc_id[0]] += int(np.count_nonzero(keys < np.uint64(threshold)))
  assert abs(sum(kept.values()) - 1500) < 5 * np.sqrt(1500)
  for source in "abc":
    share = totals[source] * 1500 / sum(totals.values())
    assert abs(kept[source] - share) < 5 * np.sqrt(share), (kept, totals)


def test_one_line_50mb_file_is_read_a_block_at_a_time(demo_config, tmp_path):
  """A 50 MB single line is read 4 MB (a block) at a time and cut into documents.

  The reads are watched by a spy on units.read_piece. Peak RSS is measured by
  bench/prepare_bench.py across corpus sizes rather than asserted here: one
  process's RSS after many large transient allocations depends on the
  allocator's arenas (50-300 MB of slack were seen for the same input).
  """
  rng = np.random.default_rng(1)
  letters = list("abcdefghijklmnopqrstuvwxyz")
  vocabulary = np.array(["".join(rng.choice(letters, 6)) for _ in range(200)])
  # The subprocess records the largest block read (a spy on units.read_piece).
  script = ("import resource, sys\n"
            "from bertjax import config_files\n"
            "from bertjax.data import prepare, units\n"
            "largest = [0]\n"
            "read = units.read_piece\n"
            "def spy(piece):\n"
            "  data = read(piece); largest[0] = max(largest[0], len(data)); return data\n"
            "units.read_piece = spy\n"
            "c = config_files.shipped('bert').get_config('tiny')\n"
            "c.dataset = 'bertjax_local_text'; c.text_files = sys.argv[1]\n"
            "c.vocab_size = 500; c.prepare_workers = 1; c.prepare_block_mb = 4\n"
            "c.tokenizer_sample_sentences = 3000\n"
            "p = prepare.prepare(c, sys.argv[2])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "sum(p.splits.values()), largest[0])\n")
  docs = {}
  for megabytes in (50,):
    sentences = np.array([" ".join(rng.choice(vocabulary, 9)).capitalize() + "."
                          for _ in range(2000)])
    count = megabytes * 1_000_000 // (len(sentences[0]) + 1)
    line = " ".join(sentences[rng.integers(0, len(sentences), count)])
    path = tmp_path / f"line{megabytes}.txt"
    path.write_text(line.strip())
    assert path.read_bytes().count(b"\n") == 0
    out = subprocess.run([sys.executable, "-c", script, str(path),
                          str(tmp_path / f"data{megabytes}")],
                         capture_output=True, text=True, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert out.returncode == 0, out.stderr[-2000:]
    _, count, largest = out.stdout.split()[-3:]
    docs[megabytes] = int(count)
    assert int(largest) <= 4 * 2**20 + 2**16  # a block and the cut window
    path.unlink()
  assert docs[50] >= 12  # cut into pieces of about 4 MB


@pytest.mark.parametrize("binary", ["prepare", "main"])
def test_sigterm_stops_workers_with_one_line_and_status_75(corpus, tmp_path, binary):
  """SIGTERM (to the prepare only, as a scheduler sends it) while tokenizing:
  the workers are stopped, one line says to rerun, status 75 (bertjax.main's).
  bertjax.main, preparing before it trains, stops there too, not once its
  preparation ends (a preempted VM has about 30 s), keeping the staged units."""
  workdir = tmp_path / "run"
  flags = [sys.executable, "-m", f"bertjax.{binary}", "--config=bert.py:tiny",
           f"--workdir={workdir}", "--config.dataset=bertjax_local_text",
           f"--config.text_files={corpus}/*.txt", "--config.vocab_size=600",
           f"--config.prepare_block_mb={_BLOCK_MB}",
           "--config.tokenizer_sample_sentences=2000", "--config.prepare_workers=2"]
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  proc = subprocess.Popen(flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=str(tmp_path))
  tokenized = workdir / "data" / "bertjax_tokenized" / "bertjax_local_text" / "1.0.0"
  staging = tokenized / staged.STAGING
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not staging.exists():
    time.sleep(0.05)
  assert proc.poll() is None, "prepare finished before it could be stopped"
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 75, stderr[-2000:]
  if binary == "prepare":
    assert stderr.strip().splitlines()[-1] == (
        "error: stopped by SIGTERM; run the same command again to go on from the "
        "units already prepared.")
  else:
    assert stdout.strip().splitlines()[-1] == (
        "Preempted while preparing the data (no checkpoint yet); run the same "
        "command again to go on from the units already prepared.")
  assert "Traceback" not in stderr and "leaked" not in stderr, stderr[-2000:]
  # Stopped midway: what was staged stays for the rerun, nothing is published.
  assert staging.is_dir() and not staged.is_published(tokenized)


@pytest.mark.parametrize("error, where", [
    ("OSError(28, 'No space left on device', '/full/disk/shard')", "/full/disk/shard"),
    ("RuntimeError('ArrayRecord write failed: No space left on device')", "DATA_DIR"),
])
def test_a_full_disk_is_one_line_naming_the_path_and_the_fix(error, where, tmp_path):
  """The writer's error (in its own process: absl's flags and logging stay
  untouched here) becomes one line naming the path and the fix, status 75."""
  script = f"""
import sys
from absl import app
from bertjax import cli
from bertjax import prepare as binary
def full(*args, **kwargs):
  raise {error}
binary.prepare.prepare = full
sys.argv = ["prepare", "--config=bert.py:tiny", "--workdir={tmp_path}"]
app.run(binary.main, flags_parser=cli.parse_flags)
"""
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, env=env, cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 75, proc.stderr[-2000:]
  where = where.replace("DATA_DIR", str(tmp_path / "data"))
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: no space left on the device while writing {where}; free space "
      f"there (or point --config.data_dir at a disk with room) and run the "
      f"same command again to resume.")
  assert "Traceback" not in proc.stderr

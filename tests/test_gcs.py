"""gs:// workdir and data_dir end to end, against a local GCS endpoint.

The endpoint is gcp-storage-emulator (tests/gcs_emulator.py) on 127.0.0.1,
reached by every client through its documented emulator settings: etils.epath
(gcsfs) for metrics, records, tokenizer and prepared data; tensorstore and
google-cloud-storage for orbax's checkpoints; google-cloud-storage for
TensorBoard's event files.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gcs_emulator import Emulator

STEPS = 24
FIELDS = dict(batch_size=8, seq_len=32, max_predictions_per_seq=5,
              num_train_steps=STEPS, warmup_steps=2, log_every_steps=1,
              checkpoint_every_steps=4, keep_checkpoints=10, eval_max_batches=2,
              shuffle_window=32)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  emulator = Emulator()
  saved = dict(os.environ)
  os.environ.update(emulator.environment())
  # The mirror of gs:// data goes to this test's own cache, not the user's.
  os.environ["BERTJAX_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
  yield emulator
  os.environ.clear()
  os.environ.update(saved)
  emulator.stop()


def config_for(demo_config, data_dir):
  c = demo_config.copy_and_resolve_references()
  c.data_dir = data_dir
  for k, v in FIELDS.items():
    c[k] = v
  return c


def steps_of(text):
  return {r["step"]: r for r in map(json.loads, text.splitlines()) if "loss" in r}


def test_gs_workdir_and_data_dir_prepare_train_kill_resume_evaluate(
    gcs, tmp_path, demo_config, demo_data):
  from etils import epath
  from bertjax import api
  from bertjax import evaluation
  from bertjax import train

  bucket = f"gs://{gcs.bucket}"
  workdir, data_dir = f"{bucket}/run", f"{bucket}/data"
  config = config_for(demo_config, data_dir)
  # The same run uninterrupted, on local disk with the locally prepared data.
  ref_dir = str(tmp_path / "reference")
  ref_record = train.train_and_evaluate(config_for(demo_config, demo_data.data_dir),
                                        ref_dir)
  with open(os.path.join(ref_dir, "metrics.jsonl")) as f:
    ref = steps_of(f.read())

  # bertjax.main from an unrelated directory: prepares into gs://, trains,
  # and is killed once the checkpoint of step 4 is committed (20 steps and
  # five checkpoint uploads before the end, so the kill lands mid-run).
  cwd = tmp_path / "elsewhere"
  cwd.mkdir()
  args = [sys.executable, "-m", "bertjax.main", "--config=bert.py:tiny",
          f"--workdir={workdir}", f"--config.data_dir={data_dir}"] + [
              f"--config.{k}={v}" for k, v in FIELDS.items()]
  proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  start = time.time()
  while "run/checkpoints/4/commit_success.txt" not in gcs.object_names():
    assert proc.poll() is None, proc.communicate()[0][-4000:]
    assert time.time() - start < 400, "no checkpoint 4 in time"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  names = gcs.object_names()
  killed = steps_of(epath.Path(workdir, "metrics.jsonl").read_text())
  assert 4 <= max(killed) < STEPS, sorted(killed)  # really cut short
  # Prepared data, tokenizer and checkpoints are in the bucket, nothing local.
  assert any(n.startswith("data/tokenizers/") and n.endswith(".model") for n in names)
  assert any(n.startswith("data/bertjax_tokenized/") and n.endswith("dataset_info.json")
             for n in names)
  assert any(n.startswith("run/tensorboard/events.out.tfevents") for n in names)
  assert os.listdir(cwd) == []

  # Resumed in this process; its rows are the uninterrupted run's, exactly.
  record = train.train_and_evaluate(config, workdir)
  got = steps_of(epath.Path(workdir, "metrics.jsonl").read_text())
  assert sorted(got) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    assert got[step]["batch_hash"] == ref[step]["batch_hash"], step
    assert got[step]["loss"] == ref[step]["loss"], step
  assert record == ref_record
  assert json.loads(epath.Path(workdir, f"eval_{STEPS}.json").read_text()) == record

  # Evaluating the gs:// checkpoint again gives the same record; the model
  # loads from the bucket with its tokenizer.
  assert evaluation.evaluate_checkpoint(config, workdir) == record
  model = api.load(workdir)
  local_model = api.load(ref_dir)
  text = ["Lists are mutable sequences.", "A tuple cannot be changed."]
  np.testing.assert_array_equal(model.embed(text), local_model.embed(text))

  # Hugging Face export into the bucket, and loading it back from there,
  # give what the same export on local disk gives.
  from bertjax.convert import workdir as workdir_lib
  exported = workdir_lib.export_hf(workdir, f"{bucket}/hf")
  assert workdir_lib.export_hf(ref_dir, str(tmp_path / "hf")) == exported
  assert {n for n in gcs.object_names() if n.startswith("hf/")} >= {
      "hf/config.json", "hf/model.safetensors", "hf/spiece.model"}
  np.testing.assert_array_equal(api.load(f"{bucket}/hf").embed(text),
                                api.load(str(tmp_path / "hf")).embed(text))


def _text_config(demo_config, text_files, **overrides):
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = text_files
  config.vocab_size = 500
  config.prepare_block_mb = 0.02  # several units, so several staged shards
  config.tokenizer_sample_sentences = 1000
  for k, v in overrides.items():
    config[k] = v
  return config


def _digests(root):
  """relative path -> sha256 of every published shard and tokenizer under root."""
  import hashlib
  from bertjax import paths
  return {rel: hashlib.sha256(paths.path(root, rel).read_bytes()).hexdigest()
          for rel, _ in paths.walk_files(root)
          if ".array_record-" in rel or rel.endswith(".model")}


def test_beam_workers_prepare_a_gs_data_dir_through_the_bucket(
    gcs, demo_config, tmp_path, monkeypatch):
  # What a Dataflow job does, on Beam's local runner: text files in the
  # bucket, units that read their inputs from the bucket and write their
  # staged shards into it; the published shards are those of a one-process
  # prepare of the same files on local disk, byte for byte.
  import corpus_files
  from etils import epath
  from bertjax.data import bucket_units
  from bertjax.data import prepare

  local_text = tmp_path / "text"
  local_text.mkdir()
  corpus_files.write_topic_files(local_text)
  names = sorted(os.listdir(local_text))[:40]
  bucket = f"gs://{gcs.bucket}"
  for name in names:
    epath.Path(f"{bucket}/text/{name}").write_bytes((local_text / name).read_bytes())
  for name in set(os.listdir(local_text)) - set(names):
    os.remove(local_text / name)

  local_dir = str(tmp_path / "data")
  prepare.prepare(_text_config(demo_config, f"{local_text}/*.txt",
                               prepare_workers=1), local_dir)
  want = _digests(local_dir)
  assert sum(".array_record-" in rel for rel in want) >= 6

  staged_in_bucket = []
  clean = bucket_units.clean

  def spy(remote_root):  # what the workers left in the bucket, before cleaning
    staged_in_bucket.extend(n for n in gcs.object_names() if "/.staging/" in n)
    clean(remote_root)

  monkeypatch.setattr(bucket_units, "clean", spy)
  from bertjax.data import workers
  run, sent = workers.run, []

  def spy_run(run_unit, tasks, **kwargs):  # what the Beam workers are handed
    sent.extend(tasks)
    return run(run_unit, tasks, **kwargs)

  monkeypatch.setattr(workers, "run", spy_run)
  cwd = tmp_path / "elsewhere"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  data_dir = f"{bucket}/beam"
  prepare.prepare(_text_config(demo_config, f"{bucket}/text/*.txt"), data_dir,
                  beam_runner="DirectRunner")
  assert _digests(data_dir) == want
  # The workers were handed bucket paths only, never the launcher's mirror.
  from bertjax import paths
  mirror = paths.local_mirror(data_dir)
  assert len(sent) >= 6 and mirror not in repr(sent)
  assert all(repr(t).count("gs://") >= 2 for t in sent)
  # The units' receipts and shards went through the bucket, and were removed
  # from it once published.
  for stage in ("bertjax_local_text", "bertjax_tokenized", "tokenizers"):
    assert any(n.startswith(f"beam/{stage}/") and n.endswith(".json")
               for n in staged_in_bucket), stage
  assert not [n for n in gcs.object_names() if "/.staging/" in n]
  assert os.listdir(cwd) == []


def test_distributed_beam_runner_refuses_local_text_for_a_gs_data_dir(
    demo_config, tmp_path, monkeypatch):
  # Its workers share nothing with this machine but the bucket: one
  # sentence, nothing written (not even a local "gs:" directory).
  from bertjax.data import prepare
  monkeypatch.chdir(tmp_path)
  config = _text_config(demo_config, "/corpus/*.txt")
  with pytest.raises(ValueError, match=r"DataflowRunner workers cannot read the "
                     r"local text files '/corpus/\*.txt'.*gs:// paths"):
    prepare.prepare(config, "gs://no-such-bucket/data", beam_runner="DataflowRunner")
  assert os.listdir(tmp_path) == []


def test_gs_metrics_are_uploaded_at_most_every_interval_and_at_checkpoints(gcs):
  from etils import epath
  from bertjax import metrics

  workdir = f"gs://{gcs.bucket}/ratelimited"
  uploaded = lambda: sorted(r["step"] for r in map(
      json.loads, epath.Path(workdir, "metrics.jsonl").read_text().splitlines()))
  writer = metrics.MetricWriter(workdir, remote_flush_seconds=3600)
  writer.write(1, {"loss": 1.0})  # the first row goes up at once
  writer.write(2, {"loss": 2.0})
  writer.write(3, {"loss": 3.0})
  assert uploaded() == [1]  # within the interval: rows 2 and 3 wait
  writer.flush_from_step(4)  # a checkpoint of step 4; its row comes a step late
  writer.write(4, {"loss": 4.0})
  assert uploaded() == [1, 2, 3, 4]
  writer.write(5, {"loss": 5.0})
  writer.write(6, {"eval_loss": 6.0}, flush=True)  # evaluations go up at once
  assert uploaded() == [1, 2, 3, 4, 5, 6]
  writer.write(7, {"loss": 7.0})
  assert uploaded() == [1, 2, 3, 4, 5, 6]
  writer.close()
  assert uploaded() == [1, 2, 3, 4, 5, 6, 7]
  assert any(n.startswith("ratelimited/tensorboard/events.out.tfevents")
             for n in gcs.object_names())
  # Every row at once with no interval (the default is REMOTE_FLUSH_SECONDS).
  writer = metrics.MetricWriter(workdir, remote_flush_seconds=0)
  writer.write(8, {"loss": 8.0})
  assert uploaded()[-1] == 8
  writer.close()

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
  from bertjax import mirror
  local = mirror.local_mirror(data_dir)
  assert len(sent) >= 6 and local not in repr(sent)
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


@pytest.fixture(scope="module")
def pretrained_in_bucket(gcs, tmp_path_factory, demo_config, demo_data):
  """(gs:// workdir, its local twin): a tiny BERT trained two steps locally,
  then copied into the bucket."""
  from bertjax import mirror
  from bertjax import train
  config = config_for(demo_config, demo_data.data_dir)
  config.num_train_steps = 2
  config.checkpoint_every_steps = 2
  config.eval_max_batches = 1
  local = str(tmp_path_factory.mktemp("pretrained"))
  train.train_and_evaluate(config, local)
  remote = f"gs://{gcs.bucket}/pretrained"
  mirror.push(local, remote)
  return remote, local


def test_finetune_from_a_gs_init_into_a_gs_workdir(gcs, pretrained_in_bucket, tmp_path,
                                                   monkeypatch):
  # --init=gs://... was taken for a local path (os.path.isdir) and refused as
  # "neither a bertjax workdir nor a Hugging Face model directory".
  from etils import epath
  from bertjax import config_files
  from bertjax.finetune import encoder_init
  from bertjax.finetune import loop
  remote, local = pretrained_in_bucket
  fields, params, _, step = encoder_init.load(remote)
  want = encoder_init.load(local)
  assert step == want[3] == 2 and fields == want[0]
  import jax
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, want[1])
  c = config_files.shipped("finetune").get_config("coherence")
  for k, v in dict(batch_size=8, seq_len=32, num_epochs=1.0, max_train_examples=16,
                   max_eval_examples=8, log_every_steps=1000).items():
    c[k] = v
  monkeypatch.chdir(tmp_path)
  workdir = f"gs://{gcs.bucket}/finetuned"
  result = loop.run(c, remote, workdir)
  assert result["step"] == 2
  record = json.loads(epath.Path(workdir, encoder_init.RECORD).read_text())
  assert record["init"] == remote and record["step"] == 2
  names = [n for n in gcs.object_names() if n.startswith("finetuned/")]
  assert "finetuned/checkpoints/2/commit_success.txt" in names
  assert not [n for n in names if n.endswith(".tmp")]
  assert os.listdir(tmp_path) == []  # nothing written locally instead
  # Resuming the finished run from the same init (moved: the local twin)
  # is accepted; the record is compared by hashes.
  assert loop.run(c, local, workdir)["step"] == 2


def test_from_hf_into_a_gs_workdir_keeps_what_it_moved(gcs, pretrained_in_bucket,
                                                       demo_config, tmp_path):
  # The staging directory's moves leave no object under it, and removing it
  # raised FileNotFoundError, which made the import delete the whole new
  # workdir and end in a traceback.
  from bertjax import api
  from bertjax.convert import workdir as workdir_lib
  _, local = pretrained_in_bucket
  hf_dir = str(tmp_path / "hf")
  workdir_lib.export_hf(local, hf_dir)
  workdir = f"gs://{gcs.bucket}/imported"
  report = workdir_lib.import_hf(hf_dir, workdir, demo_config)
  assert report.config.tokenizer_path == f"{workdir}/tokenizer"
  names = [n for n in gcs.object_names() if n.startswith("imported/")]
  assert "imported/checkpoints/0/commit_success.txt" in names
  assert "imported/config.json" in names
  assert not [n for n in names if workdir_lib.STAGING_PREFIX in n]
  text = ["Lists are mutable sequences."]
  np.testing.assert_array_equal(api.load(workdir).embed(text),
                                api.load(local).embed(text))
  # Continuing it (configs/hf.py:<workdir>) reads the imported tokenizer
  # from the bucket: it was refused as "not the imported tokenizer directory".
  from bertjax.data import tokenizer_fit
  tok = tokenizer_fit.tokenizer_for(report.config, None, "unused", [], None, "")
  assert tok.vocab_size == report.config.vocab_size
  assert tok.encode_batch(text)[0].tolist() == report.tokenizer.encode_batch(text)[0].tolist()


def test_a_missing_bucket_is_refused_before_any_work(gcs, demo_config, tmp_path,
                                                     monkeypatch):
  # A mistyped bucket surfaced as gcsfs's FileNotFoundError traceback, for
  # --workdir only at the first upload, after the data was prepared.
  from bertjax.convert import workdir as workdir_lib
  from bertjax.data import builders
  from bertjax.data import layout
  from bertjax.finetune import loop
  from bertjax import config_files
  monkeypatch.chdir(tmp_path)
  missing = "gs://no-such-bucket-xyz"
  with pytest.raises(ValueError, match=r"^--workdir=gs://no-such-bucket-xyz/run lies in "
                     r"the bucket gs://no-such-bucket-xyz, which does not exist; create it"):
    layout.check_directories(demo_config, f"{missing}/run")
  config = demo_config.copy_and_resolve_references()
  config.data_dir = f"{missing}/data"
  with pytest.raises(ValueError, match=r"^--config.data_dir=.* does not exist"):
    layout.check_directories(config, f"gs://{gcs.bucket}/run")
  with pytest.raises(ValueError, match=r"^--workdir=.* does not exist"):
    loop.run(config_files.shipped("finetune").get_config("coherence"),
             str(tmp_path / "no-init"), f"{missing}/ft")
  with pytest.raises(ValueError, match=r"^--to_hf=.* does not exist"):
    workdir_lib.export_hf(str(tmp_path), f"{missing}/hf")
  from bertjax import api
  with pytest.raises(ValueError, match=r"^path=gs://no-such-bucket-xyz/w lies in .* does not exist"):
    api.load(f"{missing}/w")
  # A glob in a missing bucket matches nothing, as a local one would.
  assert builders.resolve_text_files(f"{missing}/text/*.txt") == []
  # An empty bucket exists.
  layout.check_directories(demo_config, f"gs://{gcs.bucket}/new-run")
  assert os.listdir(tmp_path) == []


def test_verify_and_repair_of_a_gs_data_dir_check_the_bucket(gcs, demo_config, tmp_path):
  # --verify looked for shards on local disk only: for a gs:// data_dir it
  # said "No prepared shards", and --repair repaired nothing, though the
  # damaged-shard message sends users there.
  import corpus_files
  from etils import epath
  from bertjax import mirror
  from bertjax import paths
  from bertjax.data import prepare
  from bertjax.data import shards
  local_text = tmp_path / "text"
  local_text.mkdir()
  corpus_files.write_topic_files(local_text)
  config = _text_config(demo_config, f"{local_text}/[a-c]*.txt", prepare_workers=1)
  data_dir = f"gs://{gcs.bucket}/verified"
  assert [what for what, _ in prepare.unprepared(config, data_dir)] == [
      "text dataset bertjax_local_text", "tokenizer", "tokenized dataset"]
  prepare.prepare(config, data_dir)
  # --verify's list of what is missing: nothing (the tokenizer in the bucket
  # was looked for on local disk, so --verify said it was missing, status 1).
  assert prepare.unprepared(config, data_dir) == []
  reports = shards.verify(data_dir)
  assert len(reports) >= 4 and not [r for r in reports if r.problem]
  assert all(r.shard.path.startswith(f"{data_dir}/") and r.checksum for r in reports)
  # A flipped byte in the bucket's copy, the mirror's copy intact.
  target = next(r.shard for r in reports if r.shard.dataset_dir.endswith(
      "bertjax_tokenized/bertjax_local_text/1.0.0") and r.shard.split == "train")
  data = bytearray(epath.Path(target.path).read_bytes())
  data[len(data) // 2] ^= 0xFF
  epath.Path(target.path).write_bytes(bytes(data))
  damaged = [r for r in shards.verify(data_dir) if r.problem]
  assert [r.shard.path for r in damaged] == [target.path]
  assert "sha256 differs" in damaged[0].problem
  assert shards.remove_damaged(damaged) == [target.dataset_dir]
  assert not epath.Path(target.dataset_dir).exists()
  assert not os.path.exists(damaged[0].mirror_dataset_dir)
  # Prepared again (as --repair does), the bucket verifies whole.
  prepare.prepare(config, data_dir)
  assert not [r for r in shards.verify(data_dir) if r.problem]
  assert paths.exists(target.path)
  # A refusal names the bucket the user gave, not this machine's mirror.
  other = _text_config(demo_config, f"{local_text}/[d-f]*.txt", prepare_workers=1)
  with pytest.raises(ValueError, match="was prepared from --config.text_files=") as info:
    prepare.prepare(other, data_dir)
  assert f"{data_dir}/bertjax_local_text/files" in str(info.value)
  assert mirror.local_mirror(data_dir) not in str(info.value)


def test_prepare_binary_names_the_bucket_it_prepared_into(gcs, tmp_path):
  # It printed only the local mirror's paths, as if the data had stayed on
  # this machine.
  import corpus_files
  from etils import epath
  local_text = tmp_path / "text"
  local_text.mkdir()
  corpus_files.write_topic_files(local_text)
  bucket = f"gs://{gcs.bucket}"
  for name in sorted(os.listdir(local_text))[:12]:
    epath.Path(f"{bucket}/cli-text/{name}").write_bytes((local_text / name).read_bytes())
  cwd = tmp_path / "elsewhere"
  cwd.mkdir()
  out = subprocess.run(
      [sys.executable, "-m", "bertjax.prepare", "--config=bert.py:tiny",
       f"--workdir={bucket}/cli", "--config.dataset=bertjax_local_text",
       f"--config.text_files={bucket}/cli-text/*.txt", "--config.vocab_size=500",
       "--config.tokenizer_sample_sentences=1000", "--config.prepare_workers=1"],
      cwd=cwd, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert lines[0].startswith(f"Prepared bertjax_local_text in {bucket}/cli/data (local "
                             "mirror "), lines
  assert lines[1].startswith(
      f"  tokenizer: {bucket}/cli/data/tokenizers/bertjax_local_text.model ("), lines
  assert "cli/data/tokenizers/bertjax_local_text.model" in gcs.object_names()
  assert os.listdir(cwd) == []

"""The train loop end to end on the demo corpus: tracing, learning, resume."""

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax import checkpointing
from bertjax import models
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline

import variant_steps


def small_config(demo_config, demo_data, **overrides):
  c = demo_config.copy_and_resolve_references()
  c.data_dir = demo_data.data_dir
  c.batch_size = 16
  c.seq_len = 64
  c.max_predictions_per_seq = 10
  c.num_train_steps = 24
  c.warmup_steps = 4
  c.log_every_steps = 4
  c.checkpoint_every_steps = 8
  c.eval_max_batches = 2
  c.shuffle_window = 64
  for k, v in overrides.items():
    c[k] = v
  return c


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def event_files(workdir):
  """The run's TensorBoard event files, oldest first."""
  return sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*")),
                key=os.path.getmtime)


def read_scalars(event_file):
  """``{tag: {step: value}}`` of one event file, read record by record
  (length, its checksum, the Event proto, its checksum), checksums checked."""
  event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
  from tensorboardX.record_writer import masked_crc32c
  scalars = {}
  with open(event_file, "rb") as f:
    data = f.read()
  at = 0
  while at < len(data):
    header = data[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked_crc32c(header)
    body = data[at + 12:at + 12 + length]
    assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == (
        masked_crc32c(body))
    at += 16 + length
    event = event_pb2.Event.FromString(body)
    for value in event.summary.value:
      scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


def test_train_step_traces_once_and_loss_falls(demo_config, demo_data):
  config = small_config(demo_config, demo_data, learning_rate=2e-3,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
  mesh, state, step_fn = variant_steps.setup(config, "-1,1,1")
  it = pipeline.make_train_iterator(config, demo_data.source("train"),
                                    local_batch_size=config.batch_size)
  losses = []
  rng = jax.random.key(config.seed)
  with sharding.use_mesh(mesh):
    for _ in range(40):
      state, m = step_fn(state, train.to_global(next(it), mesh), rng)
      losses.append(float(m["mlm_loss"][0] / m["mlm_loss"][1]))
  assert step_fn._cache_size() == 1  # one trace and compile for 40 steps
  assert int(state.step) == 40
  # MLM loss starts near log(vocab) and must drop clearly within 40 steps.
  assert losses[0] > 0.8 * np.log(config.vocab_size)
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0


def test_same_losses_on_one_device_and_on_eight(demo_config, demo_data):
  config = small_config(demo_config, demo_data, dropout_rate=0.0,
                        attention_dropout_rate=0.0)
  batches = []
  it = pipeline.make_train_iterator(config, demo_data.source("train"),
                                    local_batch_size=config.batch_size)
  batches = [next(it) for _ in range(3)]
  results = {}
  for name, devices, shape in (("one", jax.devices()[:1], "1,1,1"),
                               ("dp8", jax.devices(), "8,1,1"),
                               ("fsdp", jax.devices(), "2,4,1")):
    mesh, state, step_fn = variant_steps.setup(config, shape, devices)
    losses = []
    with sharding.use_mesh(mesh):
      for b in batches:
        state, m = step_fn(state, train.to_global(b, mesh), jax.random.key(0))
        losses.append(float(m["loss"][0] / m["loss"][1]))
    results[name] = losses
  np.testing.assert_allclose(results["dp8"], results["one"], rtol=2e-5)
  np.testing.assert_allclose(results["fsdp"], results["one"], rtol=2e-5)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, demo_config, demo_data):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  record = train.train_and_evaluate(small_config(demo_config, demo_data), workdir)
  return workdir, record


def test_run_writes_metrics_checkpoints_and_eval(uninterrupted):
  workdir, record = uninterrupted
  rows = read_metrics(workdir)
  train_rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [4, 8, 12, 16, 20, 24]
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
              "tokens_per_sec"):
    assert all(np.isfinite(r[key]) for r in train_rows), key
  # keep_checkpoints=3 of the saves at 8, 16, 24.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["16", "24", "8"]
  with open(os.path.join(workdir, "eval_24.json")) as f:
    saved = json.load(f)
  assert saved == record
  for key in ("step", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "num_tokens",
              "baseline_mlm_accuracy"):
    assert key in record
  assert 0.0 < record["baseline_mlm_accuracy"] < 1.0
  assert record["num_tokens"] > 0 and record["step"] == 24
  # One event file for the run, the final evaluation's scalars in it too.
  pytest.importorskip("tensorboardX")
  (events,) = event_files(workdir)
  scalars = read_scalars(events)
  assert sorted(scalars["loss"]) == [4, 8, 12, 16, 20, 24]
  for key in ("mlm_loss", "mlm_accuracy", "nsp_accuracy"):
    assert scalars["eval_" + key] == {24: pytest.approx(record[key], rel=1e-6)}


def test_killed_run_resumes_to_identical_result(tmp_path, uninterrupted,
                                                demo_config, demo_data):
  ref_dir, ref_record = uninterrupted
  workdir = str(tmp_path)
  config = small_config(demo_config, demo_data)
  assert train.train_and_evaluate(config, workdir, stop_at_step=12) is None
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "12"))
  record = train.train_and_evaluate(config, workdir)
  assert record == ref_record
  # One event file per start: the resumed one holds the redone steps and the
  # final evaluation.
  if importlib.util.find_spec("tensorboardX"):
    first, resumed = map(read_scalars, event_files(workdir))
    assert sorted(first["loss"]) == [4, 8, 12]
    assert sorted(resumed["loss"]) == [16, 20, 24]
    assert resumed["eval_mlm_loss"] == {24: pytest.approx(record["mlm_loss"], rel=1e-6)}
  ref_losses = {r["step"]: r["loss"] for r in read_metrics(ref_dir) if "loss" in r}
  losses = {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}
  for step in (16, 20, 24):
    assert losses[step] == ref_losses[step]
  # Final parameters bit-identical.
  config_dict = config
  model = models.get_model(config_dict)
  tx = optim.make_optimizer(config_dict)
  mesh = sharding.make_mesh(config.mesh_shape)
  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  a, _ = checkpointing.Checkpointer(ref_dir).restore(24, abstract, shardings)
  b, _ = checkpointing.Checkpointer(workdir).restore(24, abstract, shardings)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_rerun_of_finished_run_does_not_train_again(uninterrupted, demo_config,
                                                    demo_data):
  workdir, record = uninterrupted
  before = len(read_metrics(workdir))
  events = event_files(workdir)
  again = train.train_and_evaluate(small_config(demo_config, demo_data), workdir)
  rows = read_metrics(workdir)
  assert not any("loss" in r for r in rows[before:])  # no new training rows
  assert again == record
  if importlib.util.find_spec("tensorboardX"):  # a start's file, with no scalars
    added = sorted(set(event_files(workdir)) - set(events))
    assert len(added) == 1 and read_scalars(added[0]) == {}


def test_evaluate_binary_prints_record_as_last_line(uninterrupted, demo_data):
  workdir, record = uninterrupted
  os.remove(os.path.join(workdir, "eval_24.json"))
  events = {f: os.path.getsize(f) for f in event_files(workdir)}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.evaluate", "--config=configs/bert.py:tiny",
       f"--config.data_dir={demo_data.data_dir}", "--config.batch_size=16",
       "--config.seq_len=64", "--config.max_predictions_per_seq=10",
       "--config.eval_max_batches=2", f"--workdir={workdir}"],
      cwd=root, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  printed = json.loads(proc.stdout.strip().splitlines()[-1])
  with open(os.path.join(workdir, "eval_24.json")) as f:
    assert json.load(f) == printed
  assert printed["step"] == 24
  assert set(printed) == set(record)
  for key, value in record.items():
    assert printed[key] == pytest.approx(value, rel=1e-5), key
  # Its record is eval_24.json only: the run's event files stay as they were.
  assert {f: os.path.getsize(f) for f in event_files(workdir)} == events


def test_a_stop_during_a_periodic_evaluation_is_evaluated_on_resume(
    demo_config, demo_data, tmp_path, monkeypatch):
  # SIGTERM during step 2's periodic evaluation: the checkpoint of step 2 is
  # saved and the evaluation abandoned; the resumed run used to go on to
  # step 3 with no evaluation of step 2 in its log.
  from bertjax import evaluation, guards
  config = small_config(demo_config, demo_data, num_train_steps=4, eval_every_steps=2,
                        log_every_steps=1, checkpoint_every_steps=4, eval_max_batches=1,
                        batch_size=8, seq_len=32, max_predictions_per_seq=5)
  real = evaluation.evaluate_params

  def stopped(*args, **kwargs):
    guards._SIGTERM.set()  # as the handler does, while the evaluation runs
    return real(*args, **kwargs)

  monkeypatch.setattr(evaluation, "evaluate_params", stopped)
  try:
    with pytest.raises(guards.Preempted, match="^Preempted at step 2; a checkpoint"):
      train.train_and_evaluate(config, str(tmp_path))
  finally:
    guards._SIGTERM.clear()
  assert checkpointing.Checkpointer(str(tmp_path)).all_steps() == [2]
  assert not any(k.startswith("eval_") for r in read_metrics(tmp_path) for k in r)
  monkeypatch.undo()
  record = train.train_and_evaluate(config, str(tmp_path))
  rows = read_metrics(tmp_path)
  evaluated = lambda rows: [r["step"] for r in rows if any(k.startswith("eval_") for k in r)]
  assert evaluated(rows) == [2, 4]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  assert record["step"] == 4
  # Resumed again at its end, nothing is evaluated twice.
  assert train.train_and_evaluate(config, str(tmp_path)) == record
  assert evaluated(read_metrics(tmp_path)) == [2, 4]

"""The workdir: one run at a time (issue 11.4), one line when it cannot be
written (18.4), and a quiet ``bertjax.load`` that takes no lock (11.8)."""

import contextlib
import json
import logging
import os
import signal
import subprocess
import types
import warnings

import pytest
from absl import logging as absl_logging

import bertjax
from bertjax import checkpointing
from bertjax import models
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax import workdir_lock

from test_resilience import cli_args, wait_for
from test_resume_faults import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_second_run_on_a_workdir_is_refused_and_kill9_frees_it(
    tmp_path, demo_config, demo_data):
  workdir = str(tmp_path / "work")
  config = tiny(demo_config, demo_data, num_train_steps=400, log_every_steps=1,
                checkpoint_every_steps=1000)
  first = subprocess.Popen(cli_args(config, workdir), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    metrics = os.path.join(workdir, "metrics.jsonl")
    wait_for(lambda: os.path.exists(metrics) and len(open(metrics).readlines()) >= 2,
             first)
    second = subprocess.run(cli_args(config, workdir), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    lines = [l for l in second.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith(f"error: Another bertjax run (pid {first.pid} on host ")
    assert "Traceback" not in second.stderr
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  steps = [json.loads(l)["step"] for l in open(metrics)]
  assert len(steps) == len(set(steps))  # nobody else appended
  # The dead run's lock went with it: the next run takes the workdir at once.
  with workdir_lock.WorkdirLock(workdir):
    pass


@contextlib.contextmanager
def unable_to_write(path):
  """``path`` made read-only, also for root (whose effective uid is dropped)."""
  os.chmod(path, 0o555)
  root = os.geteuid() == 0
  try:
    if root:
      os.seteuid(65534)
    yield
  finally:
    if root:
      os.seteuid(0)
    os.chmod(path, 0o755)


@pytest.fixture
def no_device_work(monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("device work started before the refusal")
  monkeypatch.setattr(state_lib, "state_shardings", forbidden)


def test_workdir_that_is_a_file_gets_one_line(tmp_path, demo_config, demo_data,
                                              no_device_work):
  path = tmp_path / "a_file"
  path.write_text("x")
  for workdir in (path, path / "below"):
    with pytest.raises(ValueError, match=r"(is a file|lies under the file "
                       r".*a_file), not a directory") as e:
      train.train_and_evaluate(tiny(demo_config, demo_data), str(workdir))
    assert "\n" not in str(e.value)
  assert path.read_text() == "x"


def test_read_only_workdir_gets_one_line(tmp_path, demo_config, demo_data,
                                         no_device_work):
  workdir = tmp_path / "ro"
  workdir.mkdir()
  with unable_to_write(workdir):
    with pytest.raises(ValueError, match="Cannot write to the workdir .* "
                       r"\(permission denied\); make it writable"):
      train.train_and_evaluate(tiny(demo_config, demo_data), str(workdir))
  assert os.listdir(workdir) == []


@pytest.fixture(scope="module")
def saved_workdir(tmp_path_factory, demo_config, demo_data):
  """A workdir with one checkpoint (step 0), written without training."""
  workdir = str(tmp_path_factory.mktemp("saved"))
  config = tiny(demo_config, demo_data)
  mesh = sharding.make_mesh(config.mesh_shape)
  state, _ = state_lib.create_train_state(models.get_model(config),
                                          optim.make_optimizer(config), config, mesh)
  saver = checkpointing.Checkpointer(workdir)
  saver.save(0, state, {}, config, demo_data.fingerprint)
  saver.close()
  return workdir


def test_load_is_quiet_and_takes_no_lock(saved_workdir, caplog):
  caplog.set_level(logging.WARNING)
  with workdir_lock.WorkdirLock(saved_workdir):  # a run is training there
    with warnings.catch_warnings(record=True) as raised:
      warnings.simplefilter("always")
      model = bertjax.load(saved_workdir)
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
  assert [str(w.message) for w in raised] == []
  assert model.encode(["Quiet, please."])["hidden"].shape[0] == 1


def test_quiet_read_only_keeps_real_warnings(caplog):
  caplog.set_level(logging.WARNING)
  with checkpointing.quiet_read_only():
    absl_logging.warning("Given directory is read only=%s", "/somewhere")
    absl_logging.warning("Checkpoint step 7 is missing a file.")
  assert [r.getMessage() for r in caplog.records] == [
      "Checkpoint step 7 is missing a file."]
  absl_logging.warning("Given directory is read only=%s", "/elsewhere")
  assert len(caplog.records) == 2  # hidden only inside the scope


@pytest.fixture
def open_dir():
  """A directory everyone may enter and write (pytest's own are the owner's
  only), for runs made as the user nobody."""
  import shutil
  import tempfile
  path = tempfile.mkdtemp(prefix="bertjax-perm-")
  os.chmod(path, 0o777)
  yield path
  for root, dirs, _ in os.walk(path):  # what a test made read-only, too
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o777)
  shutil.rmtree(path)


@contextlib.contextmanager
def as_nobody():
  """Runs the block with nobody's effective uid where the tests run as root
  (whose permission checks would pass)."""
  root = os.geteuid() == 0
  if root:
    os.seteuid(65534)
  try:
    yield
  finally:
    if root:
      os.seteuid(0)


def _tree(root):
  return sorted((os.path.relpath(os.path.join(r, n), root),
                 os.stat(os.path.join(r, n)).st_size, os.stat(os.path.join(r, n)).st_mode)
                for r, dirs, files in os.walk(root) for n in dirs + files)


@pytest.mark.parametrize("read_only", ["checkpoints", "checkpoints/0", "metrics.jsonl",
                                       ".bertjax.lock"])
def test_read_only_entry_of_a_workdir_is_refused_before_device_work(
    read_only, saved_workdir, open_dir, demo_config, demo_data, no_device_work):
  # A read-only checkpoints/ let the run train on until its first checkpoint,
  # then fail with orbax's TimeoutError traceback after a minute's wait.
  import shutil
  workdir = os.path.join(open_dir, "work")
  shutil.copytree(saved_workdir, workdir)
  for name in ("metrics.jsonl", ".bertjax.lock"):
    with open(os.path.join(workdir, name), "w") as f:
      f.write('{"step": 0}\n')
  os.chmod(workdir, 0o777)
  for root, dirs, files in os.walk(workdir):
    for name in dirs + files:
      os.chmod(os.path.join(root, name), 0o777)
  os.chmod(os.path.join(workdir, read_only), 0o555)
  before = _tree(workdir)
  with as_nobody():
    with pytest.raises(ValueError, match=(
        rf"^Cannot write to the workdir {workdir}: {workdir}/{read_only} is read-only "
        rf"\(permission denied\); make it writable \(chmod -R u\+w .*\) or pass "
        r"another --workdir\.$")):
      train.train_and_evaluate(tiny(demo_config, demo_data, num_train_steps=2), workdir)
  assert _tree(workdir) == before


def test_finetune_prepare_convert_and_study_refuse_a_read_only_parent(
    open_dir, demo_config, saved_workdir):
  # Each ended in a PermissionError traceback from os.makedirs, finetune only
  # after reading its init and building the task's features.
  from bertjax import config_files
  from bertjax.convert import workdir as workdir_lib
  from bertjax.data import prepare
  from bertjax.finetune import loop
  from bertjax.study import core
  # Imported while still root: where the packages live under a directory only
  # root may read (CI's /root/.pyenv), nobody could not import them later.
  import matplotlib.backends.backend_agg  # noqa: F401
  import matplotlib.figure  # noqa: F401
  parent = os.path.join(open_dir, "ro")
  os.mkdir(parent, 0o555)
  os.chmod(parent, 0o555)
  denied = (r"\(permission denied: .*/ro, where it would be created, is read-only\); "
            r"make it writable or pass another ")
  with as_nobody():
    with pytest.raises(ValueError, match=r"^Cannot write to the workdir .*/ro/ft " + denied):
      loop.run(config_files.shipped("finetune").get_config("coherence"),
               os.path.join(open_dir, "no-init"), os.path.join(parent, "ft"))
    with pytest.raises(ValueError, match=r"^Cannot write to the data_dir .*/ro/data "
                       r"\(permission denied: .*/ro is read-only and prepare has to "
                       r"create .*/ro/data/tokenizers under it\)"):
      prepare.prepare(demo_config, os.path.join(parent, "data"))
    with pytest.raises(ValueError, match=r"^Cannot write to the export directory .*/ro/hf " + denied
                       + "--to_hf"):
      workdir_lib.export_hf(saved_workdir, os.path.join(parent, "hf"))
    with pytest.raises(ValueError, match=r"^Cannot write to the workdir .*/ro/imp " + denied):
      workdir_lib.import_hf(os.path.join(open_dir, "no-hf"), os.path.join(parent, "imp"),
                            demo_config)
    with pytest.raises(ValueError, match=r"^Cannot write to the study.s workdir .*/ro/study " + denied):
      core.run([demo_config], 1e10, os.path.join(parent, "study"), tasks=())
  assert os.listdir(parent) == []


def test_evaluate_prints_but_does_not_write_into_a_read_only_workdir(
    saved_workdir, demo_config, demo_data, monkeypatch, caplog):
  # It evaluated, then died with a PermissionError traceback writing
  # eval_<step>.json.
  from bertjax import evaluation
  from bertjax import paths
  monkeypatch.setattr(paths, "unwritable", lambda p: p)  # as a read-only workdir is
  caplog.set_level(logging.WARNING)
  before = sorted(os.listdir(saved_workdir))
  record = evaluation.evaluate_checkpoint(tiny(demo_config, demo_data), saved_workdir)
  assert record["step"] == 0 and record["num_predictions"] > 0
  assert sorted(os.listdir(saved_workdir)) == before
  assert any("is read-only, so this evaluation is printed but not written to "
             "eval_0.json" in r.getMessage() for r in caplog.records)


def test_an_unreadable_text_file_is_refused_before_prepare_starts(open_dir, demo_config):
  # A worker met it mid-prepare: a PermissionError traceback.
  from bertjax.data import prepare
  for name in ("a.txt", "b.txt"):
    with open(os.path.join(open_dir, name), "w") as f:
      f.write("Some text to read. And more of it.\n")
  os.chmod(os.path.join(open_dir, "b.txt"), 0)
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = os.path.join(open_dir, "*.txt")
  data_dir = os.path.join(open_dir, "data")
  with as_nobody():
    with pytest.raises(ValueError, match=(
        rf"^Cannot read {open_dir}/b.txt \(permission denied\), one of "
        r"--config.text_files; make it readable or leave it out")):
      prepare.prepare(config, data_dir)
  assert not os.path.exists(os.path.join(data_dir, "bertjax_local_text"))


def test_repair_of_a_read_only_data_dir_is_refused_and_removes_nothing(open_dir):
  # shutil.rmtree met the read-only directory: a PermissionError traceback,
  # possibly after removing part of a dataset.
  from bertjax.data import shards
  parent = os.path.join(open_dir, "data", "bertjax_tokenized")
  dataset = os.path.join(parent, "1.0.0")
  os.makedirs(dataset)
  with open(os.path.join(dataset, "shard"), "w") as f:
    f.write("x")
  os.chmod(parent, 0o555)
  report = shards.Report(shards.Shard(dataset, "train", os.path.join(dataset, "shard"), 1),
                         "sha256 differs from what prepare recorded", True)
  try:
    with as_nobody():
      with pytest.raises(ValueError, match=(
          rf"^Cannot remove the damaged dataset {dataset}: {parent} is read-only "
          r"\(permission denied\); make the data_dir writable")):
        shards.remove_damaged([report])
  finally:
    os.chmod(parent, 0o755)
  assert os.listdir(dataset) == ["shard"]


def test_text_files_matching_nothing_are_refused_before_the_workdir_is_made(
    tmp_path, demo_config, demo_data, no_device_work):
  config = tiny(demo_config, demo_data)
  config.dataset = "bertjax_local_text"
  config.text_files = str(tmp_path / "nowhere" / "*.txt")
  config.data_dir = ""  # prepared under the workdir, which must not appear
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"^--config\.text_files='.*\*\.txt' "
                     r"matches no files; pass comma-separated paths or globs"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()  # no checkpoints/, data/ or lock left behind


def test_reading_checkpoints_from_a_file_says_it_is_a_file(tmp_path):
  path = tmp_path / "eval.json"
  path.write_text("{}")
  with pytest.raises(ValueError, match=r"eval\.json is a file, not a workdir; "
                     r"pass the directory a run wrote"):
    checkpointing.Checkpointer(str(path), read_only=True)
  os.mkdir(tmp_path / "empty")
  with pytest.raises(ValueError, match=r"^No checkpoints under .*/empty/checkpoints"):
    checkpointing.Checkpointer(str(tmp_path / "empty"), read_only=True)


def test_a_read_only_filesystem_is_named_as_such(tmp_path, monkeypatch):
  from bertjax import paths
  target = tmp_path / "ro"
  target.mkdir()
  assert paths.denial(str(target)) == "permission denied"  # tmp_path is writable
  # A read-only mount, as statvfs reports one.
  monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_flag=os.ST_RDONLY))
  monkeypatch.setattr(paths, "unwritable", lambda p: str(target))
  with pytest.raises(ValueError, match=r"^Cannot write to the workdir .*/ro/run "
                     r"\(read-only filesystem: .*/ro, where it would be created, "
                     r"is read-only\)"):
    paths.require_writable(str(target / "run"), "--workdir", "the workdir")


def test_the_best_checkpoint_log_names_the_metric_offered(tmp_path, caplog):
  """Fine-tuning offers its accuracy negated (lower is kept); the log must
  say the accuracy, not a negative 'held-out loss'."""
  import ml_collections
  import numpy as np
  best = checkpointing.BestCheckpoint(str(tmp_path), metric="held-out accuracy",
                                      sign=-1.0)
  config = ml_collections.ConfigDict({"model": "bert"})
  with caplog.at_level(logging.INFO):
    assert best.offer(3, -0.42, {"w": np.zeros(2, np.float32)}, {}, config, "f")
  assert "New best held-out accuracy 0.4200 at step 3." in caplog.text
  assert "-0.42" not in caplog.text
  assert not best.offer(4, -0.40, {"w": np.ones(2, np.float32)}, {}, config, "f")

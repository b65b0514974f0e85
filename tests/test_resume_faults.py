"""Nothing lost, part two: faults injected into a real tiny run's checkpoints.

Each fault ends in one exact outcome: the right checkpoint restored with a
bit-identical state (damaged newer ones set aside, one warning line each), or
a one-line refusal that leaves the workdir byte-for-byte unchanged.
"""

import logging
import os
import shutil
import subprocess

import jax
import numpy as np
import pytest

from bertjax import checkpoint_manifest
from bertjax import checkpointing
from bertjax import compat
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train

from test_resilience import assert_states_equal, cli_args, restore
from test_train import read_metrics, small_config
from tree_snapshot import tree_hash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(demo_config, demo_data, **overrides):
  base = dict(num_train_steps=20, checkpoint_every_steps=10, log_every_steps=10,
              batch_size=8, seq_len=32, max_predictions_per_seq=5,
              keep_checkpoints=10, eval_max_batches=1)
  base.update(overrides)
  return small_config(demo_config, demo_data, **base)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_config, demo_data):
  """A finished 20-step run with checkpoints at steps 10 and 20."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  train.train_and_evaluate(tiny(demo_config, demo_data), workdir)
  return workdir


@pytest.fixture
def workdir(tmp_path, trained):
  path = str(tmp_path / "work")
  shutil.copytree(trained, path)
  return path


def ckpt(workdir, step):
  return os.path.join(workdir, "checkpoints", str(step))


def array_files(step_dir):
  return sorted(os.path.join(d, n) for d, _, names in os.walk(
      os.path.join(step_dir, "state")) for n in names
      if os.sep + "d" + os.sep in os.path.join(d, n) + os.sep and
      os.path.getsize(os.path.join(d, n)) > 1024)


@pytest.fixture
def restored(monkeypatch):
  """Records what train_and_evaluate's restore_latest returned."""
  seen = []
  original = checkpointing.Checkpointer.restore_latest

  def spy(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    seen.append(result)
    return result

  monkeypatch.setattr(checkpointing.Checkpointer, "restore_latest", spy)
  return seen


@pytest.fixture
def no_device_work(monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("device work started before the refusal")
  monkeypatch.setattr(state_lib, "state_shardings", forbidden)
  monkeypatch.setattr(state_lib, "create_train_state", forbidden)


def unusable_warnings(caplog):
  return [r for r in caplog.records
          if r.levelno >= logging.WARNING and "is unusable" in r.getMessage()]


def resume_and_check(config, workdir, trained, restored, caplog, step):
  """Resumes without training; the state must be checkpoint ``step``'s."""
  caplog.set_level(logging.INFO)
  train.train_and_evaluate(config, workdir, stop_at_step=step)
  got_step, state, _ = restored[-1]
  assert got_step == step
  mesh = sharding.make_mesh(config.mesh_shape)
  assert_states_equal(state, restore(trained, step, config, mesh))
  assert not any(r.exc_info for r in caplog.records)


# --- damage: detected by checksums, set aside, previous one restored --------

def flip_bytes(step_dir):
  path = array_files(step_dir)[0]
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    f.write(np.random.default_rng(0).bytes(64))


def truncate_array(step_dir):
  path = array_files(step_dir)[0]
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 100)


def delete_config(step_dir):
  os.remove(os.path.join(step_dir, "config", "metadata"))


def delete_data(step_dir):
  os.remove(os.path.join(step_dir, "data", "metadata"))


def truncate_config(step_dir):
  path = os.path.join(step_dir, "config", "metadata")
  with open(path, "r+b") as f:
    f.truncate(285)


@pytest.mark.parametrize("damage,reason", [
    (flip_bytes, "does not match its checksum"),
    (truncate_array, "bytes, the manifest says"),
    (delete_config, "config/metadata is missing"),
    (delete_data, "data/metadata is missing"),
    (truncate_config, "config/metadata is unreadable"),
])
def test_damaged_newest_is_set_aside_and_previous_restored(
    workdir, trained, restored, caplog, demo_config, demo_data, damage, reason):
  damage(ckpt(workdir, 20))
  resume_and_check(tiny(demo_config, demo_data), workdir, trained, restored,
                   caplog, 10)
  warnings = unusable_warnings(caplog)
  assert len(warnings) == 1 and reason in warnings[0].getMessage()
  assert "\n" not in warnings[0].getMessage()
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
      "10", "20.unreadable"]


def test_set_aside_never_clobbers_an_earlier_copy(workdir, trained, restored,
                                                  caplog, demo_config, demo_data):
  os.makedirs(ckpt(workdir, 20) + ".unreadable")  # an earlier set-aside 20
  flip_bytes(ckpt(workdir, 20))
  resume_and_check(tiny(demo_config, demo_data), workdir, trained, restored,
                   caplog, 10)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
      "10", "20.unreadable", "20.unreadable.1"]
  assert checkpointing.Checkpointer(workdir).all_steps() == [10]


def test_every_checkpoint_damaged_stops_and_says_what_was_set_aside(
    workdir, demo_config, demo_data, no_device_work):
  flip_bytes(ckpt(workdir, 20))
  delete_config(ckpt(workdir, 10))
  config = tiny(demo_config, demo_data)
  with pytest.raises(checkpointing.NoUsableCheckpoint) as e:
    train.train_and_evaluate(config, workdir)
  message = str(e.value)
  assert "20 -> 20.unreadable (" in message and "10 -> 10.unreadable (" in message
  assert "--config.restart_from_scratch=True" in message and "\n" not in message
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "0"))
  # A second run does not take the emptied directory for a fresh start.
  with pytest.raises(checkpointing.NoUsableCheckpoint,
                     match="set aside by an earlier run: 20.unreadable, 10.unreadable"):
    train.train_and_evaluate(config, workdir)


def test_restart_from_scratch_on_purpose(workdir, demo_config, demo_data):
  flip_bytes(ckpt(workdir, 20))
  flip_bytes(ckpt(workdir, 10))
  config = tiny(demo_config, demo_data, restart_from_scratch=True)
  train.train_and_evaluate(config, workdir, stop_at_step=1)
  assert checkpointing.Checkpointer(workdir).all_steps() == [1]


def test_nonfinite_checkpoint_is_caught_at_restore(workdir, trained, restored,
                                                   caplog, demo_config, demo_data):
  # A checkpoint whose checksums match but whose Adam moments hold NaN, saved
  # as step 30 of a 30-step run (a 20-step one would be refused as past its end).
  config = tiny(demo_config, demo_data, num_train_steps=30)
  mesh = sharding.make_mesh(config.mesh_shape)
  state = restore(trained, 20, config, mesh)
  nu = state.opt_state[1][0].nu
  word = nu["embeddings"]["word_embeddings"]
  word["embedding"] = word["embedding"].at[3, 5].set(np.nan)
  saver = checkpointing.Checkpointer(workdir, keep=10)
  saver.save(30, state, {}, config, demo_data.fingerprint)
  saver.close()
  assert checkpoint_manifest.verify(ckpt(workdir, 30)).status == "ok"
  resume_and_check(config, workdir, trained, restored, caplog, 20)
  (warning,) = unusable_warnings(caplog)
  assert "Checkpoint 30" in warning.getMessage()
  assert "NaN/Inf in .opt_state[1][0].nu['embeddings']['word_embeddings']" in (
      warning.getMessage())


def test_checkpoint_without_checksums_still_restores(workdir, trained, restored,
                                                     caplog, demo_config,
                                                     demo_data):
  # As written by an older bertjax.
  os.remove(os.path.join(ckpt(workdir, 20), checkpoint_manifest.MANIFEST))
  resume_and_check(tiny(demo_config, demo_data), workdir, trained, restored,
                   caplog, 20)
  assert "no checksums to verify" in caplog.text


def test_a_state_of_another_shape_is_refused_before_any_array_is_read(
    trained, demo_config, demo_data):
  # The checkpoint's own metadata (names and shapes) decides; orbax's restore
  # is never started, so no read is left in flight when it is refused.
  from bertjax import models, optim
  from bertjax.models import sizes
  config = tiny(demo_config, demo_data)
  mesh = sharding.make_mesh(config.mesh_shape)
  checkpointer = checkpointing.Checkpointer(trained, read_only=True)

  def abstract(c):
    return state_lib.state_shardings(models.get_model(c), optim.make_optimizer(c), c, mesh)

  same, _ = abstract(config)
  checkpointer.check_fits(20, same)  # the config it was trained with fits

  def forbidden(*args, **kwargs):
    raise AssertionError("orbax's restore started")
  checkpointer._manager.restore = forbidden
  wider = tiny(demo_config, demo_data, vocab_size=config.vocab_size + 64)
  other, other_shardings = abstract(wider)
  with pytest.raises(checkpointing.StateMismatch) as e:
    checkpointer.restore(20, other, other_shardings)
  hidden = sizes.get_size(config.model_size).hidden_size
  message = str(e.value)
  assert message.startswith(f"The checkpoint at step 20 in {trained}"), message
  assert (f"does not fit the state this config builds: params.embeddings."
          f"word_embeddings.embedding is ({config.vocab_size}, {hidden}) in the "
          f"checkpoint but ({wider.vocab_size}, {hidden}) in this config") in message
  assert "more); resume it with the config it was trained with" in message
  # A parameter more, or one fewer: the leaf is named.
  extra = jax.ShapeDtypeStruct((3,), np.float32)
  with pytest.raises(checkpointing.StateMismatch,
                     match=r"params\.probe is missing from the checkpoint;"):
    checkpointer.check_fits(20, same.replace(params={**same.params, "probe": extra}))
  fewer = {k: v for k, v in same.params.items() if k != "embeddings"}
  with pytest.raises(checkpointing.StateMismatch,
                     match=r"params\.embeddings\.\S+ is in the checkpoint but not in this config"):
    checkpointer.check_fits(20, same.replace(params=fewer))
  checkpointer.close()


def test_damage_fallback_prints_one_line_through_the_cli(workdir, demo_config,
                                                         demo_data):
  truncate_array(ckpt(workdir, 20))
  # Resumed from step 10 and trained to 20 again (num_train_steps=10 would
  # be refused: the workdir went past it, its newest checkpoint damaged or not).
  config = tiny(demo_config, demo_data)
  proc = subprocess.run(cli_args(config, workdir), cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  warnings = [l for l in proc.stderr.splitlines() if "is unusable" in l]
  assert len(warnings) == 1 and "Checkpoint 20" in warnings[0]
  assert len(proc.stderr.splitlines()) < 40
  assert '"step": 20' in proc.stdout.splitlines()[-1]


# --- compatibility: decided from the saved config, before anything ---------

@pytest.mark.parametrize("field,value,saved", [
    ("optimizer", "lamb", "adamw"),
    ("scan_layers", True, "False"),
    ("objective", "albert", "bert"),
    ("vocab_size", 4000, "8000"),
])
def test_layout_change_is_refused_and_workdir_unchanged(
    workdir, demo_config, demo_data, no_device_work, field, value, saved):
  before = tree_hash(workdir)
  config = tiny(demo_config, demo_data, **{field: value})
  with pytest.raises(compat.IncompatibleCheckpoint) as e:
    train.train_and_evaluate(config, workdir)
  message = str(e.value)
  assert f"config says {field}={value!r}" in message, message
  if saved is not None:
    assert f"keep --config.{field}={saved}" in message
  assert "new --workdir" in message and "allow_changes" not in message
  assert tree_hash(workdir) == before


@pytest.mark.parametrize("field,value", [
    ("seq_len", 64), ("batch_size", 16), ("seed", 1), ("masking", "dynamic"),
    ("learning_rate", 1e-3)])
def test_stream_change_is_refused_unless_allowed(workdir, demo_config, demo_data,
                                                 no_device_work, field, value):
  before = tree_hash(workdir)
  config = tiny(demo_config, demo_data, **{field: value})
  with pytest.raises(compat.IncompatibleCheckpoint,
                     match=f"pass --config.allow_changes={field} to resume"):
    train.train_and_evaluate(config, workdir)
  assert tree_hash(workdir) == before


def test_num_train_steps_below_the_checkpoint_is_refused(workdir, demo_config,
                                                         demo_data, no_device_work):
  # Lowered below the newest checkpoint (step 20), the run used to evaluate
  # that checkpoint again and end as if it had trained 15 steps.
  before = tree_hash(workdir)
  config = tiny(demo_config, demo_data, num_train_steps=15)
  with pytest.raises(compat.IncompatibleCheckpoint) as e:
    train.train_and_evaluate(config, workdir)
  message = str(e.value)
  assert "at step 20" in message and "num_train_steps=15" in message, message
  assert "--config.num_train_steps=20" in message and "new --workdir" in message
  assert tree_hash(workdir) == before


def test_allowed_and_safe_changes_apply_with_a_log_line(
    workdir, trained, restored, caplog, demo_config, demo_data):
  config = tiny(demo_config, demo_data, seq_len=64, allow_changes="seq_len",
                num_train_steps=40, mesh_shape="2,4,1")
  resume_and_check(config, workdir, trained, restored, caplog, 20)
  assert "Resuming with seq_len 32 -> 64 (allowed by --config.allow_changes)" in (
      caplog.text)
  assert "num_train_steps 20 -> 40 (safe to change)" in caplog.text
  # The FSDP mesh got the parameters bit for bit (checked above) on its own layout.
  leaf = restored[-1][1].params["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]
  assert dict(leaf.sharding.mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}


def test_allow_changes_naming_no_field_is_refused(workdir, demo_config, demo_data,
                                                  no_device_work):
  config = tiny(demo_config, demo_data, allow_changes="seqlen")
  with pytest.raises(ValueError, match="allow_changes names 'seqlen'"):
    train.train_and_evaluate(config, workdir)


def test_layout_refusal_through_the_cli_is_one_line(workdir, demo_config,
                                                    demo_data):
  before = tree_hash(workdir)
  args = cli_args(tiny(demo_config, demo_data), workdir) + ["--config.optimizer=lamb"]
  proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1].startswith("error: The checkpoint at step 20 in ")
  assert "optimizer='adamw'" in lines[-1] and "Traceback" not in proc.stderr
  assert tree_hash(workdir) == before


# --- a kill right after a checkpoint commits ---------------------------------

class Killed(BaseException):
  """Stands for SIGKILL: nothing of the run's own handles it."""


def test_a_kill_right_after_a_checkpoint_commits_loses_no_row(
    tmp_path, trained, demo_config, demo_data, monkeypatch):
  config = tiny(demo_config, demo_data)
  workdir = str(tmp_path)
  metrics = os.path.join(workdir, "metrics.jsonl")
  left = []
  original = checkpointing.Checkpointer.save

  def save_then_die(self, step, *args, **kwargs):
    original(self, step, *args, **kwargs)
    self.wait()  # committed: checkpoints/<step> is there
    # What a kill leaves is what is on disk now; the finally blocks the
    # exception runs must not count.
    left.append(open(metrics, "rb").read() if os.path.exists(metrics) else b"")
    raise Killed

  monkeypatch.setattr(checkpointing.Checkpointer, "save", save_then_die)
  with pytest.raises(Killed):
    train.train_and_evaluate(config, workdir)
  monkeypatch.undo()
  assert checkpointing.Checkpointer(workdir).all_steps() == [10]
  with open(metrics, "wb") as f:
    f.write(left[0])

  train.train_and_evaluate(config, workdir)
  timing = {"tokens_per_sec", "mfu"}  # wall-clock rates, never reproducible
  got, want = ([{k: v for k, v in r.items() if k not in timing}
                for r in read_metrics(w) if "loss" in r] for w in (workdir, trained))
  assert [r["step"] for r in got] == [10, 20]  # each step once, 10 included
  assert got == want

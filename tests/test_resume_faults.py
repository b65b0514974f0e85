"""Nothing lost, part two: faults injected into a real tiny run's checkpoints.

Each fault ends in one exact outcome: the right checkpoint restored with a
bit-identical state (damaged newer ones set aside, one warning line each), or
a one-line refusal that leaves the workdir byte-for-byte unchanged.
"""

import importlib
import logging
import os
import pkgutil
import shutil
import subprocess

import jax
import numpy as np
import pytest

import configs
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


def _shipped_configs():
  for info in pkgutil.iter_modules(configs.__path__):
    module = importlib.import_module(f"configs.{info.name}")
    try:
      yield info.name, module.get_config("tiny")
    except ValueError:  # configs/hf.py needs an import's workdir
      continue


def test_every_config_field_is_in_the_compatibility_table():
  unclassified = sorted((name, field) for name, config in _shipped_configs()
                        for field in compat.field_names(config)
                        if compat.kind_of(field) is None)
  assert not unclassified, unclassified
  # What an HF import adds (bertjax/convert/workdir.py) is classified too.
  for field in ("tokenizer_path", "hf_special_ids", "hf_kept_tensors",
                "hf_model_type", "hf_position_offset", "num_layers",
                "single_segment", "pair_separators"):
    assert compat.kind_of(field) is not None, field


def _state_shapes(config):
  """Shape and dtype of every leaf of the train state ``config`` builds
  (parameters, optimizer state, carry), from eval_shape: nothing allocated."""
  from flax import linen as nn
  from bertjax import models
  from bertjax import optim
  model = models.get_model(config)
  params = nn.meta.unbox(jax.eval_shape(
      lambda r: state_lib._init_params(model, config, r), jax.random.key(0)))
  tree = {"params": params,
          "opt_state": jax.eval_shape(optim.make_optimizer(config).init, params),
          "carry": state_lib.carry_shapes(model, config)}
  return {jax.tree_util.keystr(path): (leaf.shape, leaf.dtype)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_no_field_a_resume_may_change_changes_the_state_shapes(monkeypatch):
  # sbo_max_offset was a stream field, but the SBO head's offset table has
  # sbo_max_offset + 1 rows: with --config.allow_changes=sbo_max_offset the
  # run prepared its data and then failed at restore on the table's shape.
  # Each integer or boolean field that building the state reads and that a
  # resume may change (stream or safe), changed by one, must build the same
  # state's shapes.
  import ml_collections
  read = set()
  getitem = ml_collections.ConfigDict.__getitem__

  def recording(self, key):
    read.add(key)
    return getitem(self, key)

  moved, tried, seen = [], set(), set()
  for name, config in _shipped_configs():
    if name == "finetune":  # its head is built by bertjax.finetune, not models
      continue
    config.seq_len, config.max_predictions_per_seq, config.batch_size = 32, 5, 4
    read.clear()
    with monkeypatch.context() as patch:
      patch.setattr(ml_collections.ConfigDict, "__getitem__", recording)
      before = _state_shapes(config)
    seen |= read
    for field in sorted(read):
      value = config.get(field)
      if (compat.kind_of(field) == compat.LAYOUT
          or not isinstance(value, (int, bool)) or field in ("model_size",)):
        continue
      changed = config.copy_and_resolve_references()
      changed[field] = (not value) if isinstance(value, bool) else value + 1
      tried.add(field)
      try:
        after = _state_shapes(changed)
      except ValueError:  # a value the model refuses: not a resume anyway
        continue
      if after != before:
        moved.append((name, field))
  assert {"sbo_max_offset", "mem_len"} <= seen and {"seq_len", "batch_size"} <= tried
  assert not moved, f"these change the state's shapes but are not layout fields: {moved}"


def test_allow_changes_naming_a_layout_field_is_refused():
  # It was accepted and then meant nothing: a layout change is refused
  # whatever allow_changes says.
  from bertjax import config_files
  config = config_files.shipped("spanbert").get_config("tiny")
  config.allow_changes = "seq_len,sbo_max_offset"
  with pytest.raises(ValueError, match=(
      r"^config\.allow_changes names 'sbo_max_offset', which sets the saved "
      r"state's layout and cannot change on resume")):
    compat.allowed(config)
  config.allow_changes = "seq_len,num_train_steps"
  assert compat.allowed(config) == {"seq_len", "num_train_steps"}


def test_sbo_max_offset_change_is_refused_even_when_allowed():
  from bertjax import config_files
  saved = compat.as_json(config_files.shipped("spanbert").get_config("tiny"))
  config = config_files.shipped("spanbert").get_config("tiny")
  config.sbo_max_offset, config.allow_changes = 15, "sbo_max_offset"
  with pytest.raises(compat.IncompatibleCheckpoint, match=(
      r"config says sbo_max_offset=15, which changes the saved state's layout; "
      r"keep --config.sbo_max_offset=31 to resume it")):
    compat.check(saved, config, "The checkpoint")


def test_the_readme_resume_table_names_each_field_as_the_code_does():
  # README's safe row listed tokenizer_path as if every config had it, but no
  # shipped pretraining config does (--config.tokenizer_path is an unknown
  # field there; an import's config.json records it), and its layout row's
  # "an import's hf_*" took in hf_kept_tensors, which the code treats as safe.
  import re
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  shipped = {f.rsplit(".", 1)[-1] for _, config in _shipped_configs()
             for f in compat.field_names(config)}
  checked = 0
  for kind in (compat.LAYOUT, compat.STREAM, compat.SAFE):
    row = next(l for l in readme.splitlines() if l.startswith(f"  | {kind}"))
    fields = row.split("|")[2]
    imports = {n for group in re.findall(r"an import's ((?:`\w+`(?:, | and )?)+)", fields)
               for n in re.findall(r"`(\w+)`", group)}
    for name in re.findall(r"`(\w+\*?)`", fields):
      if name.endswith("*"):  # every field of that prefix
        matching = [f for f in compat.FIELDS if f.startswith(name[:-1])]
        assert matching and all(compat.FIELDS[f] == kind for f in matching), (name, kind)
        continue
      assert compat.kind_of(name) == kind, (name, kind)
      assert name in shipped or name in imports, (
          f"{name} is in no shipped config; the {kind} row must call it an import's")
      checked += 1
  assert checked > 40


def test_unclassified_field_needs_allow_changes():
  config = {"seq_len": 32, "my_own_field": 2}
  with pytest.raises(compat.IncompatibleCheckpoint, match="allow_changes=my_own_field"):
    compat.check({"seq_len": 32, "my_own_field": 1},
                 _Dict(config), "The checkpoint")
  changes = compat.check({"seq_len": 32, "my_own_field": 1},
                         _Dict(dict(config, allow_changes="my_own_field")),
                         "The checkpoint")
  assert [c.field for c in changes] == ["allow_changes", "my_own_field"]


def test_a_layout_refusal_when_evaluating_says_to_evaluate_with_the_saved_config():
  saved = {"model_size": "tiny", "seq_len": 32}
  config = _Dict(model_size="mini", seq_len=64)
  with pytest.raises(compat.IncompatibleCheckpoint) as e:
    compat.check(saved, config, "The checkpoint", layout_only=True, evaluating=True)
  message = str(e.value)
  assert "pass --config.model_size=tiny to evaluate it" in message, message
  assert "resume" not in message and "from scratch" not in message, message
  with pytest.raises(compat.IncompatibleCheckpoint, match="to resume it, or pass a new"):
    compat.check(saved, config, "The checkpoint", layout_only=True)


def test_an_untrained_import_is_sent_to_import_again_not_from_scratch():
  # Training from scratch would throw the imported weights away; an import
  # with configs/roberta.py saves the MLM-only model instead.
  saved = {"model": "bert", "objective": "bert", "hf_special_ids": [0, 1, 2, 3, 4]}
  config = _Dict(model="bert", objective="mlm_only", hf_special_ids=[0, 1, 2, 3, 4])
  assert compat.is_import(saved)
  with pytest.raises(compat.IncompatibleCheckpoint) as e:
    compat.check(saved, config, "The checkpoint", layout_only=True, imported=True)
  message = str(e.value)
  assert "import the Hugging Face model again" in message, message
  assert "--config=configs/roberta.py:<size>" in message, message
  assert "from scratch" not in message, message


def test_another_variants_checkpoint_is_sent_to_its_config_file():
  # The flags named used to be ones this config lacks (Unknown config field
  # 'embedding_size' when followed); an import's have no file of their own.
  from bertjax import config_files
  bert = config_files.shipped("bert").get_config("tiny")
  for name, size in (("electra", "tiny"), ("roberta", "mini"), ("xlnet", "tiny")):
    saved = compat.as_json(config_files.shipped(name).get_config(size))
    with pytest.raises(compat.IncompatibleCheckpoint, match=(
        rf"; pass --config=configs/{name}\.py:{size}, the config it was trained "
        r"with, to evaluate it\.$")):
      compat.check(saved, bert, "The checkpoint", layout_only=True, evaluating=True)
    with pytest.raises(compat.IncompatibleCheckpoint, match=(
        rf"; pass --config=configs/{name}\.py:{size}, the config it was trained "
        r"with, to resume it, or a new --workdir")):
      compat.check(saved, bert, "The checkpoint")
  imported = dict(compat.as_json(bert), hf_model_type="bert", tokenizer="hf")
  with pytest.raises(compat.IncompatibleCheckpoint,
                     match=r"pass --config=configs/hf\.py:<the workdir>"):
    compat.check(imported, bert, "The checkpoint", layout_only=True, evaluating=True)


class _Dict(dict):
  """A dict with ConfigDict's ``get`` and ``to_dict``."""

  def to_dict(self):
    return dict(self)


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

"""Bad input stops before any device work with one sentence naming the fix,
and leaves the workdir as it was."""

import os
import subprocess
import sys

import pytest

from bertjax import config_files
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import prepare

from test_train import small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(path):
  """Every file under ``path`` with its size and modification time."""
  out = {}
  for dirpath, _, files in os.walk(path):
    for name in files:
      full = os.path.join(dirpath, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out


@pytest.fixture
def no_device_work(monkeypatch):
  """Fails the test if the run gets as far as building the train state."""

  def forbidden(*args, **kwargs):
    raise AssertionError("device work started before the bad input was refused")

  monkeypatch.setattr(state_lib, "create_train_state", forbidden)
  monkeypatch.setattr(state_lib, "state_shardings", forbidden)


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory, demo_config, demo_data):
  workdir = str(tmp_path_factory.mktemp("trained"))
  config = small_config(demo_config, demo_data, num_train_steps=2,
                        checkpoint_every_steps=2, log_every_steps=1)
  train.train_and_evaluate(config, workdir)
  return workdir


@pytest.mark.parametrize("args,start,needle", [
    (["--config=configs/bert.py:tiny", "--config.mask_ratee=0.2"],
     "error: Unknown config field 'mask_ratee'", "--config.mask_rate?"),
    (["--config=configs/bert.py:tinyy"],
     "error: Unknown size 'tinyy' after the config file's colon",
     "pick one of tiny, mini"),
    # These three were ml_collections' own words, naming no fix.
    (["--config.num_train_steps=3", "--config=configs/bert.py:tiny"],
     "error: --config.num_train_steps comes before --config=...",
     "put --config=FILE[:SIZE] first"),
    (["--config=configs/bert.py:tiny", "--config.scan_layers=maybe"],
     "error: --config.scan_layers=maybe is not true or false", "--config.scan_layers=true"),
    (["--config=configs/bert.py:tiny", "--config.seq_len=6.5"],
     "error: --config.seq_len=6.5 is not a whole number", "--config.seq_len=64"),
])
def test_cli_config_mistakes_get_one_line(tmp_path, args, start, needle):
  workdir = tmp_path / "never"
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", *args, f"--workdir={workdir}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1].startswith(start)
  assert needle in lines[-1]
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("field,value,needle", [
    ("mask_rate", 1.0, "--config.mask_rate"),
    ("seq_len", 1024, "--config.seq_len"),
    ("masking", "sometimes", "--config.masking"),
    ("batch_size", 12, "--config.batch_size"),  # 12 does not split over 8 devices
    ("model_size", "huge", "--config.model_size"),
    ("optimizer", "sgd", "--config.optimizer"),
    ("hidden_act", "swish", "--config.hidden_act"),
    ("layer_norm_eps", 0.0, "--config.layer_norm_eps"),
])
def test_out_of_range_values(tmp_path, demo_config, demo_data, no_device_work,
                             field, value, needle):
  config = small_config(demo_config, demo_data, **{field: value})
  with pytest.raises(ValueError, match=needle):
    train.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints" / "0")


def test_checkpoint_of_another_model_shape(trained_workdir, demo_config, demo_data,
                                           no_device_work):
  before = snapshot(trained_workdir)
  config = small_config(demo_config, demo_data, num_train_steps=4,
                        model_size="mini")
  with pytest.raises(ValueError, match=r"model_size='tiny'.*--config.model_size"):
    train.train_and_evaluate(config, trained_workdir)
  assert snapshot(trained_workdir) == before


def test_mismatched_vocabulary(tmp_path, monkeypatch, demo_config, demo_data,
                               no_device_work):
  # The data_dir's tokenizer fixes the size: refused before the workdir is
  # made or locked and before prepare starts, not from inside prepare.
  def forbidden(*args, **kwargs):
    raise AssertionError("prepare started before the vocab_size was refused")

  monkeypatch.setattr(prepare, "prepare", forbidden)
  before = snapshot(demo_data.data_dir)
  workdir = tmp_path / "work"
  config = small_config(demo_config, demo_data, vocab_size=4000)
  with pytest.raises(ValueError, match=r"vocab size 8000 but config.vocab_size is "
                     r"4000; set --config.vocab_size=8000"):
    train.train_and_evaluate(config, str(workdir))
  assert snapshot(demo_data.data_dir) == before
  assert not workdir.exists()


def test_a_vocabulary_too_small_to_train_is_refused_up_front(
    tmp_path, monkeypatch, demo_config, demo_data, no_device_work):
  # 5 specials + 256 byte pieces + one character: a vocabulary below 262
  # can never train, yet it was refused only once the text had been read and
  # sentencepiece ran. 262 is left to sentencepiece (the corpus decides).
  from bertjax.data import tokenizer_fit
  def forbidden(*args, **kwargs):
    raise AssertionError("prepare started before the vocab_size was refused")

  monkeypatch.setattr(prepare, "prepare", forbidden)
  workdir, data_dir = tmp_path / "work", tmp_path / "data"
  config = small_config(demo_config, demo_data, vocab_size=261, data_dir=str(data_dir))
  with pytest.raises(ValueError, match=r"--config.vocab_size=261 cannot hold .* set "
                     r"--config.vocab_size to at least 262"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists() and not data_dir.exists()
  config.vocab_size = 262
  tokenizer_fit.check_existing(config, str(data_dir / "tokenizers" / "x.model"))


def test_checkpoint_trained_with_another_tokenizer(trained_workdir, tmp_path,
                                                   demo_config, demo_data,
                                                   no_device_work):
  # The same corpus with a BPE tokenizer gives other ids: resuming the
  # checkpoint on it would silently scramble its embeddings.
  other = small_config(demo_config, demo_data, tokenizer="bpe",
                       data_dir=str(tmp_path / "bpe"), num_train_steps=4)
  prepare.prepare(other, other.data_dir)
  before = snapshot(trained_workdir)
  with pytest.raises(ValueError, match="trained with tokenizer"):
    train.train_and_evaluate(other, trained_workdir)
  assert snapshot(trained_workdir) == before


def test_empty_corpus(tmp_path, demo_config, demo_data, no_device_work):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "a.txt").write_text("")
  (corpus / "b.txt").write_text("   \n\n")
  config = small_config(demo_config, demo_data, dataset="bertjax_local_text",
                        text_files=str(corpus / "*.txt"),
                        data_dir=str(tmp_path / "data"))
  with pytest.raises(ValueError, match="--config.text_files|empty"):
    train.train_and_evaluate(config, str(tmp_path / "work"))
  assert sorted(os.listdir(corpus)) == ["a.txt", "b.txt"]


def test_mesh_that_cannot_split_the_model(demo_config):
  from bertjax import config_validation
  config = demo_config.copy_and_resolve_references()
  config.mesh_shape = "2,1,4"  # a 4-way tensor split of tiny BERT's 2 heads
  with pytest.raises(ValueError, match=r"num_heads=2 .*use a tensor size of 1 or 2, "
                     r"e\.g\. --config\.mesh_shape=-1,1,2\.$"):
    config_validation.validate(config)
  config.mesh_shape = "-1,1,2"
  config_validation.validate(config)
  config.vocab_size = 8001  # odd: no tensor split of the vocabulary but 1
  with pytest.raises(ValueError, match=r"vocab_size=8001 .*use a tensor size of 1,"):
    config_validation.validate(config)


def test_cli_refuses_a_mesh_that_cannot_split_the_model(tmp_path):
  workdir = tmp_path / "never"
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
       "--config.mesh_shape=2,1,4", f"--workdir={workdir}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert last.startswith("error: config.mesh_shape='2,1,4' splits num_heads=2"), last
  assert "--config.mesh_shape=-1,1,2" in last
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()  # refused before prepare and device work


def test_evaluate_never_prepares_data(trained_workdir, tmp_path, demo_config,
                                      demo_data, no_device_work):
  from bertjax import evaluation
  before = snapshot(trained_workdir)
  config = small_config(demo_config, demo_data, data_dir=str(tmp_path / "none"))
  with pytest.raises(ValueError, match=r"^No prepared data for .* in .*none; .*"
                     r"python -m bertjax\.prepare"):
    evaluation.evaluate_checkpoint(config, trained_workdir)
  assert not (tmp_path / "none").exists()
  assert snapshot(trained_workdir) == before


def test_evaluate_keeps_the_training_runs_record(trained_workdir, demo_config,
                                                  demo_data):
  import json
  from bertjax import evaluation
  path = os.path.join(trained_workdir, "eval_2.json")
  with open(path) as f:
    training_record = json.load(f)
  # One eval batch instead of the training run's two: another record.
  config = small_config(demo_config, demo_data, eval_max_batches=1)
  record = evaluation.evaluate_checkpoint(config, trained_workdir)
  assert record != training_record
  # The record says what it was run with that the training run's was not.
  assert record["config_changes"] == {"eval_max_batches": [2, 1]}
  assert "config_changes" not in training_record
  with open(path) as f:
    assert json.load(f) == training_record
  with open(os.path.join(trained_workdir, "eval_2-2.json")) as f:
    assert json.load(f) == record
  # A change only training reads (its length, its learning rate) is not one:
  # the same figures, the training run's record, no third file.
  config = small_config(demo_config, demo_data, num_train_steps=50, learning_rate=0.5)
  assert evaluation.evaluate_checkpoint(config, trained_workdir) == training_record
  assert not os.path.exists(os.path.join(trained_workdir, "eval_2-3.json"))


@pytest.mark.parametrize("spec,devices,needle", [
    ("1,2", 8, "is not three sizes for data,fsdp,tensor"),
    ("a,b,c", 8, "is not three sizes"),
    ("-1,-1,1", 8, "leaves more than one axis at -1"),
    ("0,1,1", 8, "has a size below 1"),
    ("1,-2,1", 8, "has a size below 1"),
    ("3,-1,1", 8, "does not divide the 8 devices"),
    ("2,2,1", 8, "uses 4 devices but 8 devices are present"),
    ("2,1,1", 1, "uses 2 devices but 1 device is present"),
])
def test_a_bad_mesh_shape_says_what_is_wrong_with_it(spec, devices, needle):
  from bertjax import sharding
  with pytest.raises(ValueError, match=rf"^config\.mesh_shape='{spec}' ") as e:
    sharding.parse_mesh_shape(spec, devices)
  assert needle in str(e.value)
  assert "\n" not in str(e.value)


def test_xlnet_sizes_are_listed_with_their_memory_suffix():
  with pytest.raises(ValueError) as e:
    config_files.load("xlnet:huge")
  assert "each with or without _mem, as in --config=FILE:tiny_mem" in str(e.value)
  assert config_files.load("xlnet:tiny_mem").mem_len > 0


@pytest.mark.parametrize("field,value", [
    ("shuffle_window", 0), ("shuffle_window", -3),
    ("short_seq_prob", 2.0), ("short_seq_prob", -0.1)])
def test_shuffle_window_and_short_seq_prob_are_checked_up_front(demo_config, field,
                                                                 value):
  # shuffle_window=0 used to fail once the data was read, with grain's words;
  # short_seq_prob=2 trained as if it were 1.
  from bertjax import config_validation
  config = demo_config.copy_and_resolve_references()
  config[field] = value
  with pytest.raises(ValueError, match=(
      rf"^config\.{field}={value!r} is invalid: .*; set --config\.{field}=")):
    config_validation.validate(config)
  config[field] = type(value)(1)
  config_validation.validate(config)


def test_a_shuffle_window_this_host_cannot_hold_is_refused_up_front(demo_config):
  # 10**9 rows filled the window for ever: 4.5 GB and growing, no step after
  # minutes. The limit is half this host's memory, so the fix it names fits.
  import re
  from bertjax import config_validation
  config = demo_config.copy_and_resolve_references()
  config.shuffle_window = 10**12
  with pytest.raises(ValueError, match=r"^config\.shuffle_window=1000000000000 is "
                     r"invalid: the training pipeline holds that many packed rows "
                     r".* it must be at most \d+ ") as error:
    config_validation.validate(config)
  config.shuffle_window = int(re.search(r"at most (\d+)", str(error.value)).group(1))
  config_validation.validate(config)
  # A launcher checking another machine's slice does not measure this one.
  config.shuffle_window = 10**12
  config_validation.validate(config, devices=8, hosts=1)
  # XLNet's seq_len has no position table to bound it: a row too large for
  # this host is refused as such (counted, never allocated).
  from bertjax import config_files
  xlnet = config_files.load("xlnet:tiny")
  xlnet.seq_len = xlnet.max_predictions_per_seq = 10**13
  with pytest.raises(ValueError, match=r"^config\.seq_len=10000000000000 is invalid: "
                     r"one packed row of it \(~\d+ bytes\) is more than half"):
    config_validation.validate(xlnet)

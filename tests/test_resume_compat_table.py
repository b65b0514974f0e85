"""Resume compatibility as a table: every config field classified (layout,
stream, safe), the README's table naming each as the code does, and the
refusals decided from a saved config alone, before any workdir is read.
The refusals of real workdirs are in test_resume_faults.py."""

import importlib
import os
import pkgutil

import jax
import pytest

import configs
from bertjax import compat
from bertjax import state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

"""The wrong kind of config, or a size that does not exist, gets one sentence
naming the fix (found by a user sweep of the installed binaries)."""

import json

import pytest

from bertjax import config_files
from bertjax import config_validation


def test_a_fine_tuning_config_given_to_pretraining_names_the_binary():
  config = config_files.load("finetune:coherence")
  with pytest.raises(ValueError, match=r"^This is a fine-tuning config .*"
                     r"python -m bertjax\.finetune"):
    config_validation.validate(config)


def test_an_unknown_size_names_the_config_argument_not_a_field():
  with pytest.raises(ValueError) as error:
    config_files.load("roberta:huge")
  message = str(error.value)
  assert "after the config file's colon" in message
  assert "--config.model_size" not in message  # overriding it cannot help
  assert "tiny" in message and "large" in message


def test_a_hugging_face_directory_given_as_an_import_says_to_import_it(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": "bert", "architectures": ["BertForMaskedLM"],
       "hidden_size": 64}))
  with pytest.raises(ValueError, match=r"holds a Hugging Face model, not an "
                     r"import .*--from_hf="):
    config_files.load(f"hf:{tmp_path}")
  # An import's own config.json (bertjax fields) still loads.
  (tmp_path / "config.json").write_text(json.dumps(
      {"objective": "bert", "model": "bert", "model_type": "bert"}))
  assert config_files.load(f"hf:{tmp_path}").objective == "bert"


def test_a_batch_the_devices_cannot_split_is_refused_before_any_data(demo_config):
  # 8 CPU devices (conftest): the check used to wait for the mesh, after the
  # corpus had been prepared into the workdir.
  config = demo_config.copy_and_resolve_references()
  config.batch_size = 12
  with pytest.raises(ValueError, match=r"config\.batch_size=12 is invalid: "
                     r".*8 data-parallel devices"):
    config_validation.validate(config)
  config.batch_size = 16
  config_validation.validate(config)

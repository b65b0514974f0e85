"""Reading and writing Hugging Face model directories.

Weights are read from ``model.safetensors`` (or its sharded index) with the
``safetensors`` package's numpy API, which needs no torch. A legacy
``pytorch_model.bin`` is read only through ``torch.load(weights_only=True)``,
which refuses arbitrary pickled objects; torch is then required (the ``hf``
extra). Writing is always safetensors. Directories may be local or gs://
(bertjax/paths.py); safetensors files are read and written as bytes.

A file that cannot be read (a config.json that is not JSON, a weights file cut
short, a pickle that holds more than tensors) is refused in one sentence that
names it and the fix.
"""

from __future__ import annotations

import json
import pickle
import re
from typing import Any, Mapping

import numpy as np

from bertjax import mirror
from bertjax import paths

CONFIG_FILE = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
# Tokenizer files of the BERT family that travel with a model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                   "sentencepiece.bpe.model", "spm.model", "added_tokens.json")


def read_config(hf_dir: str) -> dict[str, Any]:
  """config.json of an HF model directory."""
  path = paths.join(hf_dir, CONFIG_FILE)
  if not paths.exists(path):
    raise ValueError(
        f"{hf_dir} has no config.json; pass --from_hf a Hugging Face model "
        "directory (as written by save_pretrained).")
  try:
    config = json.loads(paths.read_text(path))
  except ValueError as e:  # also a UnicodeDecodeError
    raise ValueError(
        f"{path} is not valid JSON ({e}); restore the file (save_pretrained "
        "writes it) or pass --from_hf another model directory.") from None
  if not isinstance(config, dict):
    raise ValueError(
        f"{path} holds a JSON {type(config).__name__}, not an object of model "
        "settings; restore the file (save_pretrained writes it) or pass "
        "--from_hf another model directory.")
  return config


def _safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load
  try:
    return load(paths.path(path).read_bytes())
  except SafetensorError as e:
    raise ValueError(
        f"{path} cannot be read as safetensors ({e}): it is damaged or cut "
        "short; download or save it again.") from None


def _torch_bin(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise ValueError(
        f"{path} is a PyTorch pickle, which needs torch to read; install it "
        "(pip install torch==2.13.0, the CPU wheel; in a checkout, the hf extra) "
        "or convert the file to model.safetensors.") from None
  try:
    state = torch.load(mirror.fetched(path), map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    found = re.search(r"GLOBAL (\S+)", str(e))
    if found is None:
      raise ValueError(_damaged(path, e)) from None
    # weights_only refused to run what the pickle names: say so, briefly.
    raise ValueError(
        f"{path} cannot be read as weights only: its pickle calls "
        f"{found.group(1)}, which bertjax does not run; convert it to "
        "model.safetensors where you trust the file (transformers' "
        "save_pretrained(..., safe_serialization=True)) and import that.") from None
  except (RuntimeError, EOFError, KeyError, ValueError) as e:
    raise ValueError(_damaged(path, e)) from None
  if not isinstance(state, dict) or not all(
      isinstance(v, torch.Tensor) for v in state.values()):
    raise ValueError(
        f"{path} holds no plain state dict of tensors (a whole training "
        "checkpoint?); save the model's state_dict, or model.safetensors, and "
        "import that.")
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
          for k, v in state.items()}


def _damaged(path: str, error: Exception) -> str:
  first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  return (f"{path} cannot be read as a PyTorch checkpoint ({first}): it is "
          "damaged or cut short; download or save it again.")


def read_tensors(hf_dir: str) -> dict[str, np.ndarray]:
  """Every tensor of an HF model directory, by state-dict name (numpy)."""
  single = paths.join(hf_dir, SAFETENSORS)
  if paths.exists(single):
    return _safetensors(single)
  index = paths.join(hf_dir, SAFETENSORS_INDEX)
  if paths.exists(index):
    shards = sorted(set(paths.read_json(index)["weight_map"].values()))
    out = {}
    for shard in shards:
      out.update(_safetensors(paths.join(hf_dir, shard)))
    return out
  legacy = paths.join(hf_dir, TORCH_BIN)
  if paths.exists(legacy):
    return _torch_bin(legacy)
  raise ValueError(
      f"{hf_dir} has no {SAFETENSORS} or {TORCH_BIN}; pass --from_hf the "
      "directory that holds the model's weights.")


def read_tensor_file(path: str) -> dict[str, np.ndarray]:
  """The tensors of one safetensors file (numpy)."""
  return _safetensors(path)


def write_tensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
  """Writes numpy tensors to one safetensors file."""
  from safetensors.numpy import save
  paths.write_bytes(path, save({k: np.ascontiguousarray(v) for k, v in tensors.items()}))


def _no_record(*names: str) -> None:
  del names


def write(out_dir: str, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
          record=None) -> None:
  """Writes config.json and model.safetensors (metadata format 'pt', as
  transformers expects) into ``out_dir``; ``record`` (an export's manifest,
  bertjax/convert/export_target.py) is called with each name before its file
  is written."""
  from safetensors.numpy import save
  record = record or _no_record
  record(CONFIG_FILE)
  paths.makedirs(out_dir)
  paths.write_text(paths.join(out_dir, CONFIG_FILE),
                   json.dumps(dict(config), indent=2, sort_keys=True))
  data = save({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              metadata={"format": "pt"})
  record(SAFETENSORS)
  paths.write_bytes(paths.join(out_dir, SAFETENSORS), data)


def copy_tokenizer_files(src: str, dst: str, record=None) -> list[str]:
  """Copies the tokenizer files ``src`` has into ``dst``; returns their names
  (each passed to ``record`` before it is copied, as in ``write``)."""
  record = record or _no_record
  paths.makedirs(dst)
  copied = []
  for name in TOKENIZER_FILES:
    if paths.exists(paths.join(src, name)):
      record(name)
      paths.path(src, name).copy(paths.path(dst, name), overwrite=True)
      copied.append(name)
  return copied

"""The encoder a fine-tuning run starts from: ``--init`` loaded, its segment
layout, and the record of which ``--init`` a workdir was started from.

Which init. A fine-tuning config does not name the encoder: its architecture, weights
and tokenizer all come from ``--init``. The checkpoint's saved config
therefore cannot tell a resumed run that ``--init`` changed, and a finished
workdir rerun with another ``--init`` would report the old run's result. So a
fresh run writes ``init.json`` into its workdir:

  {"init": absolute path, "step": the init workdir's checkpoint step (None
   for a Hugging Face directory), "config_sha256": hash of the encoder's
   config fields, "weights_sha256": hash of a strided sample of every
   parameter (its path, shape, dtype and up to 4096 evenly spaced values)}

and a run that finds checkpoints in its workdir compares the init it is given
with the record before anything is placed on a device: other weights or
another encoder config are refused (a moved or copied init with the same
weights is accepted). A workdir fine-tuned before the record existed has
none and is not checked here; a restore failure then names ``--init``
(``loop``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np

from bertjax import checkpointing
from bertjax import paths


def load_init(init: str) -> tuple[dict[str, Any], Any, Any]:
  """(encoder config fields, params as numpy, tokenizer) of a bertjax workdir or
  an HF model directory (read-only)."""
  return load(init)[:3]


def load(init: str) -> tuple[dict[str, Any], Any, Any, int | None]:
  """``load_init``'s three, plus the checkpoint step read (None for HF)."""
  from bertjax import api
  from bertjax.convert import workdir as workdir_lib
  if not init:
    raise ValueError("No --init; pass a bertjax workdir or a Hugging Face model "
                     "directory to fine-tune (a workdir fine-tuned before remembers "
                     "its own).")
  path = paths.absolute(init)
  if paths.exists(path) and not paths.isdir(path):
    raise ValueError(f"--init={init} is a file, not a directory; pass a bertjax workdir "
                     "or a Hugging Face model directory.")
  if paths.isdir(paths.join(path, "checkpoints")):
    with checkpointing.quiet_read_only():
      fields, params, step = workdir_lib.load_params(path)
    return dict(fields), params, api._workdir_tokenizer(fields, path), step  # noqa: SLF001
  if api._is_hf_dir(path):  # noqa: SLF001
    fields, params, _, _, tokenizer = workdir_lib.load_hf(path)
    return dict(fields), params, tokenizer, None
  raise ValueError(f"--init {init} is neither a bertjax workdir (no checkpoints/) "
                   "nor a Hugging Face model directory (config.json + weights).")


def encoder_layout(fields: dict[str, Any]) -> tuple[int, bool]:
  """(pair separators, single segment) of the encoder, as ``api.Model`` reads them.

  Single segment (every token gets segment id 0) where the import recorded it
  (``single_segment``) or the mapping says so, and also wherever the segment
  table has fewer than two rows (``type_vocab_size`` 1 for a bertjax-trained
  RoBERTa or SpanBERT, 0 for no table): segment id 1 would read past the
  table, an out-of-range lookup that gives NaN at the first step.
  """
  from bertjax import convert
  mapping = convert.mapping_for_config(fields)
  recorded = bool(fields.get("single_segment", getattr(mapping, "SINGLE_SEGMENT", False)))
  one_row = int(fields.get("type_vocab_size", 2)) < 2
  return int(getattr(mapping, "PAIR_SEPARATORS", 1)), recorded or one_row


# The record of the init, in the fine-tuning workdir.
RECORD = "init.json"
# Values sampled per parameter for the weights hash: enough that two trained
# (or differently seeded) encoders differ, cheap for a large one.
_SAMPLES = 4096


def identify(init: str, fields: dict[str, Any], params: Any, step: int | None) -> dict[str, Any]:
  """The record of ``init`` (module docstring); ``params`` as numpy arrays."""
  weights = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    a = np.ascontiguousarray(leaf)
    flat = a.reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // _SAMPLES)])
    weights.update(f"{jax.tree_util.keystr(path)}{a.shape}{a.dtype}".encode())
    weights.update(sample.tobytes())
  config = json.dumps(fields, sort_keys=True, default=str).encode()
  where = paths.absolute(init)
  return {"init": where, "step": step, "config_sha256": hashlib.sha256(config).hexdigest(),
          "weights_sha256": weights.hexdigest()}


def _describe(record: dict[str, Any]) -> str:
  step = "" if record.get("step") is None else f" (checkpoint step {record['step']})"
  return f"--init={record['init']}{step}"


def check(workdir: str, record: dict[str, Any]) -> None:
  """Refuses, in one sentence, to resume ``workdir`` from another init.

  Reads only; a workdir without checkpoints or without a record passes.
  """
  if checkpointing.newest_saved_config(workdir) is None:
    return
  path = paths.join(workdir, RECORD)
  if not paths.exists(path):
    return
  saved = paths.read_json(path)
  same = all(saved.get(k) == record[k] for k in ("config_sha256", "weights_sha256"))
  if not same:
    raise ValueError(
        f"The fine-tuning workdir {workdir} was started from {_describe(saved)}, but this "
        f"run passes {_describe(record)}, another encoder or other weights; pass a new "
        f"--workdir to fine-tune from {record['init']}, or pass --init={saved['init']} "
        "to resume this one.")


def recorded(workdir: str) -> str | None:
  """The --init a workdir was started from (its record), or None."""
  path = paths.join(workdir, RECORD)
  return paths.read_json(path)["init"] if paths.exists(path) else None


def write(workdir: str, record: dict[str, Any]) -> None:
  """Records ``record`` for a fresh run (process 0; atomically)."""
  if jax.process_index() != 0:
    return
  paths.write_json(paths.join(workdir, RECORD), record, indent=1)

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

  (and "architecture_sha256": hash of the config fields that decide the
   encoder's layout: ``compat``'s layout fields and ``single_segment``)

and a run that finds checkpoints in its workdir compares the init it is given
with the record before anything is placed on a device: other weights or
another encoder config are refused (a moved or copied init with the same
weights is accepted) while the workdir has training left to do. A finished
workdir (its newest checkpoint at its last step), run again to predict,
takes the encoder's weights from its own checkpoints and reads the init for
its architecture and tokenizer only: the recorded init may then have trained
further (its newest checkpoint is read), as long as its architecture (the
record's hash, where recorded) and its tokenizer (the fingerprint the
fine-tuning checkpoints saved) are those the workdir was fine-tuned with.
Another --init is still refused there: the rerun would report the old run's
result as if fine-tuned from it. A workdir fine-tuned before the record
existed has none and is not checked here; a restore failure then names
``--init`` (``loop``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from bertjax import checkpoint_manifest as manifest_lib
from bertjax import checkpointing
from bertjax import compat
from bertjax import paths


def load_init(init: str) -> tuple[dict[str, Any], Any, Any]:
  """(encoder config fields, params as numpy, tokenizer) of a bertjax workdir or
  an HF model directory (read-only)."""
  return load(init)[:3]


def load(init: str) -> tuple[dict[str, Any], Any, Any, int | None]:
  """``load_init``'s three, plus the checkpoint step read (None for HF)."""
  from bertjax import api
  from bertjax.convert import workdir as workdir_lib
  path, is_workdir = _init_kind(init)
  if is_workdir:
    with checkpointing.quiet_read_only():
      fields, params, step = workdir_lib.load_params(path)
    return dict(fields), params, api._workdir_tokenizer(fields, path), step  # noqa: SLF001
  fields, params, _, _, tokenizer = workdir_lib.load_hf(path)
  return dict(fields), params, tokenizer, None


def load_architecture(init: str) -> tuple[dict[str, Any], Any]:
  """(encoder config fields, tokenizer) of ``init`` as ``load_init`` reads
  them, without its weights: for a fine-tuned workdir, whose own checkpoint
  holds the encoder's weights."""
  from bertjax import api
  from bertjax.convert import workdir as workdir_lib
  path, is_workdir = _init_kind(init)
  if is_workdir:
    with checkpointing.quiet_read_only():
      fields, _ = workdir_lib.load_config(path)
    return dict(fields), api._workdir_tokenizer(fields, path)  # noqa: SLF001
  fields, tokenizer = workdir_lib.read_hf_architecture(path)
  return dict(fields), tokenizer


def _init_kind(init: str) -> tuple[str, bool]:
  """(absolute path, whether a bertjax workdir) of ``--init``, or the
  sentence saying what it should be instead."""
  from bertjax import api
  if not init:
    raise ValueError("No --init; pass a bertjax workdir or a Hugging Face model "
                     "directory to fine-tune (a workdir fine-tuned before remembers "
                     "its own).")
  path = paths.absolute(init)
  if paths.exists(path) and not paths.isdir(path):
    raise ValueError(f"--init={init} is a file, not a directory; pass a bertjax workdir "
                     "or a Hugging Face model directory.")
  if paths.isdir(paths.join(path, "checkpoints")):
    return path, True
  if api._is_hf_dir(path):  # noqa: SLF001
    return path, False
  raise ValueError(f"--init {init} is neither a bertjax workdir (no checkpoints/) "
                   "nor a Hugging Face model directory (config.json + weights).")


def encoder_layout(fields: dict[str, Any], tokenizer: Any) -> tuple[int, bool]:
  """(pair separators, single segment) of the encoder, as ``api.Model`` reads them.

  Separators as ``tokenizer`` joins a pair (``convert.pair_format``): two
  for a RoBERTa's own byte-level BPE, one for the sentencepiece tokenizer a
  bertjax-pretrained RoBERTa exports with.
  Single segment (every token gets segment id 0) where the import recorded it
  (``single_segment``) or the mapping says so, and also wherever the segment
  table has fewer than two rows (``type_vocab_size`` 1 for a bertjax-trained
  RoBERTa or SpanBERT, 0 for no table): segment id 1 would read past the
  table, an out-of-range lookup that gives NaN at the first step.
  """
  from bertjax import convert
  from bertjax.convert import pair_format
  mapping = convert.mapping_for_config(fields)
  recorded = bool(fields.get("single_segment", getattr(mapping, "SINGLE_SEGMENT", False)))
  one_row = int(fields.get("type_vocab_size", 2)) < 2
  return pair_format.separators(fields, tokenizer), recorded or one_row


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
  layout = {k: v for k, v in fields.items()
            if compat.kind_of(k) == compat.LAYOUT or k == "single_segment"}
  architecture = json.dumps(layout, sort_keys=True, default=str).encode()
  where = paths.absolute(init)
  return {"init": where, "step": step, "config_sha256": hashlib.sha256(config).hexdigest(),
          "weights_sha256": weights.hexdigest(),
          "architecture_sha256": hashlib.sha256(architecture).hexdigest()}


def _describe(record: dict[str, Any]) -> str:
  step = "" if record.get("step") is None else f" (checkpoint step {record['step']})"
  return f"--init={record['init']}{step}"


def check(workdir: str, record: dict[str, Any], fingerprint: str = "") -> None:
  """Refuses, in one sentence, to resume ``workdir`` from another init
  (module docstring); ``fingerprint``: the init's tokenizer's.

  Reads only; a workdir without checkpoints or without a record passes.
  """
  newest = checkpointing.newest_saved_config(workdir)
  if newest is None:
    return
  path = paths.join(workdir, RECORD)
  if not paths.exists(path):
    return
  saved = paths.read_json(path)
  if all(saved.get(k) == record[k] for k in ("config_sha256", "weights_sha256")):
    return
  step, config, _ = newest
  finished = step >= int(config.get("num_train_steps", step + 1))
  if finished and saved["init"] == record["init"]:
    _check_predicting(workdir, step, saved, record, fingerprint)
    logging.info("%s now holds other weights than when %s was fine-tuned from it; the "
                 "finished workdir predicts with its own checkpoints' encoder.",
                 _describe(record), workdir)
    return
  raise ValueError(_refusal(workdir, saved, record, finished))


def _refusal(workdir: str, saved: dict[str, Any], record: dict[str, Any],
             finished: bool) -> str:
  """The one sentence refusing ``record`` for a workdir started from ``saved``."""
  init, was, now = saved["init"], saved.get("step"), record.get("step")
  start = f"The fine-tuning workdir {workdir} was started from {_describe(saved)}"
  if init == record["init"]:  # the same directory, trained further or replaced
    if was is not None and now is not None and was != now:
      changed = (f"but {init}'s newest checkpoint is now step {now}, not {was}, and the "
                 "workdir has fine-tuning left to do, which would not be from the init "
                 "it started with")
      fix = f"fine-tune from step {now} (--init reads a bertjax workdir's newest checkpoint)"
    else:
      changed = ("but it holds another encoder or other weights now, and the workdir "
                 "has fine-tuning left to do")
      fix = f"fine-tune from --init={init} as it is now"
    return f"{start}, {changed}; pass a new --workdir to {fix}."
  # Another directory: point back at the recorded one only where it still works.
  there = _newest_step(init)
  back = ""
  if finished:
    back = f", or leave --init out (or pass --init={init}) to predict with this one"
  elif was is None or there == was:
    back = f", or pass --init={init} to resume this one"
  return (f"{start}, but this run passes {_describe(record)}, another encoder or other "
          f"weights; pass a new --workdir to fine-tune from {record['init']}{back}.")


def _check_predicting(workdir: str, step: int, saved: dict[str, Any],
                      record: dict[str, Any], fingerprint: str) -> None:
  """A finished workdir's init must still build its encoder and tokenize as
  it did: the same architecture (where recorded) and tokenizer."""
  init = record["init"]
  fix = f"pass a new --workdir to fine-tune from --init={init} as it is now"
  if saved.get("architecture_sha256", record["architecture_sha256"]) != record[
      "architecture_sha256"]:
    raise ValueError(
        f"The fine-tuning workdir {workdir} was started from {_describe(saved)}, whose "
        f"encoder has another architecture now, which the workdir's checkpoints do not "
        f"fit; {fix}.")
  try:
    data = manifest_lib.read_json_item(
        epath.Path(paths.join(workdir, "checkpoints")) / str(step), "data")
  except ValueError:
    return  # unreadable: the restore sets the checkpoint aside, with why
  trained = str(data.get("tokenizer_fingerprint") or "")
  if trained and fingerprint and trained != fingerprint:
    raise ValueError(
        f"The fine-tuning workdir {workdir} was fine-tuned with tokenizer {trained[:12]} "
        f"but its --init={init} has tokenizer {fingerprint[:12]} now, which would read "
        f"other token ids; {fix}.")


def _newest_step(init: str) -> int | None:
  """The newest committed checkpoint step of a bertjax workdir, None for any
  other directory (read without loading anything)."""
  steps = manifest_lib.committed_steps(paths.join(init, "checkpoints"))
  return steps[-1] if steps else None


def recorded(workdir: str) -> str | None:
  """The --init a workdir was started from (its record), or None."""
  path = paths.join(workdir, RECORD)
  return paths.read_json(path)["init"] if paths.exists(path) else None


def write(workdir: str, record: dict[str, Any]) -> None:
  """Records ``record`` for a fresh run (process 0; atomically)."""
  if jax.process_index() != 0:
    return
  paths.write_json(paths.join(workdir, RECORD), record, indent=1)

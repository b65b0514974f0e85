"""Export a bertjax workdir's checkpoint as a Hugging Face model directory.

``export_hf`` writes the HF config.json, model.safetensors (ELECTRA's
generator in a subdirectory of its own) and the tokenizer: an import's own
files, or the sentencepiece model bertjax trained (``spm_export``). The rows
an import kept aside (bertjax/convert/workdir.py's ``hf_kept_tensors``) are
written back. ``load_params`` reads a checkpoint's params alone, for the
export and for the readers of a workdir (``bertjax.load``, fine-tuning's init);
``load_config`` its config alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from absl import logging

from bertjax import convert
from bertjax import paths
from bertjax.convert import core
from bertjax.convert import export_target
from bertjax.convert import hf_files
from bertjax.convert import spm_export


def _not_an_encoder(workdir: str, config: dict[str, Any]) -> str:
  if "task" in config:
    return (f"{workdir} is a fine-tuning workdir (python -m bertjax.finetune: "
            f"task {config['task']!r}), whose checkpoints hold a task head, not "
            "a pretrained model to fine-tune from or fill masks with; use the "
            "pretraining workdir it was fine-tuned from (its --init) instead.")
  return (f"The checkpoints in {workdir} record no model in their config; pass "
          "--workdir a bertjax pretraining or import workdir.")


def load_params(workdir: str, step: int | None = None) -> tuple[dict[str, Any], Any, int]:
  """(saved config dict, params as numpy, step) of a bertjax workdir's checkpoint.

  Restores only the params, not the optimizer state; the latest checkpoint
  of a run still training there even when the run removes it meanwhile.
  """
  from bertjax import checkpointing
  return checkpointing.read_while_training(
      workdir, step, lambda s: _load_params(workdir, s))


def load_config(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
  """(saved config dict, step) of the checkpoint ``load_params`` reads,
  without reading its params: an encoder's architecture and tokenizer."""
  from bertjax import checkpointing
  return checkpointing.read_while_training(
      workdir, step, lambda s: _open_config(workdir, s)[:2])


def _open_config(workdir: str, step: int | None) -> tuple[dict[str, Any], int, str]:
  """(saved config, step, checkpoint directory) of ``step`` (None: the latest)."""
  from bertjax import checkpointing
  checkpointer, step = checkpointing.open_step(workdir, step)
  if step is None:
    raise ValueError(f"No checkpoint in {checkpointer.directory}; train or import first.")
  config = checkpointer.saved_config(step)
  directory = checkpointer.directory
  checkpointer.close()
  if "model" not in config:
    raise ValueError(_not_an_encoder(workdir, config))
  return config, step, directory


def _load_params(workdir: str, step: int | None) -> tuple[dict[str, Any], Any, int]:
  import jax
  import orbax.checkpoint as ocp

  config, step, directory = _open_config(workdir, step)
  # Every array lands on this process's first device: the checkpoint may come
  # from a mesh of devices this process does not have (8 TPU chips, a laptop).
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  shapes = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
      core.param_shapes(core.build_model(config)))
  manager = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(read_only=True),
      item_names=("state", "data", "config"))
  item = {"params": shapes}
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item=item, partial_restore=True,
      restore_args=ocp.checkpoint_utils.construct_restore_args(item))))
  manager.close()
  params = jax.tree.map(np.asarray, restored["state"]["params"])
  return config, params, step


def _bertjax_tokenizer_files(config: dict[str, Any], workdir: str, out_dir: str,
                             record=None) -> list[str]:
  """Exports a tokenizer bertjax trained (sentencepiece) as an HF one
  (``spm_export``); the names written (each passed to ``record`` first)."""
  data_dir = config.get("data_dir") or paths.join(workdir, "data")
  models = sorted(paths.path(data_dir).glob("tokenizers/*.model"))
  if not models:
    logging.warning("No tokenizer under %s/tokenizers; exported the weights only.",
                    data_dir)
    return []
  return spm_export.write(config, str(models[0]), out_dir, record=record)


def kept_tensors(config: dict[str, Any]) -> dict[str, np.ndarray]:
  path = config.get("hf_kept_tensors")
  if not path:
    return {}
  if not paths.exists(path):
    logging.warning("%s is gone; the HF rows it kept are exported as zeros.", path)
    return {}
  return hf_files.read_tensor_file(path)


def export_hf(workdir: str, out_dir: str, step: int | None = None,
              model_type: str | None = None, overwrite: bool = False) -> dict[str, Any]:
  """Writes a workdir's checkpoint as an HF model directory.

  ``transformers.<HF_ARCHITECTURE>.from_pretrained(out_dir)`` (BERT:
  BertForPreTraining, RoBERTa: RobertaForMaskedLM, ALBERT:
  AlbertForPreTraining) loads it with no missing or unexpected weights.
  ``out_dir`` is checked before anything is read (``export_target``): new or
  empty, or an earlier export with ``overwrite``; never a bertjax workdir.

  Args:
    workdir: a bertjax workdir with checkpoints.
    out_dir: the HF directory to write.
    step: the checkpoint step; None for the latest.
    model_type: the HF model_type to write; None for the one the import
      recorded, else the default of config.model ('bert' or 'albert'). A
      bertjax BERT can be written as 'roberta' (without pooler and NSP head).
    overwrite: replace an earlier export in ``out_dir`` (its files only).

  Returns:
    {'step', 'tokenizer_files', 'left_out': the parts not written (``NOT_EXPORTED``)}.
  """
  from bertjax import batch as batch_lib
  from bertjax.convert import finetuned
  from bertjax.finetune import inference
  paths.require_directory(workdir, "--workdir")
  if inference.is_workdir(workdir):
    return finetuned.export(workdir, out_dir, step, model_type, overwrite)
  earlier = export_target.check(out_dir, workdir, overwrite)
  workdir = paths.absolute(workdir)
  config, params, step = load_params(workdir, step)
  dims = core.model_dims(config)
  if model_type:
    dims["hf_model_type"] = model_type
  mapping = convert.mapping_for_config(dims)
  if mapping.BERTJAX_MODEL != dims["model"] and model_type == convert.mapping_for_model(
      dims["model"]).MODEL_TYPE:  # SpanBERT named as the BERT it is written as
    mapping = convert.mapping_for_model(dims["model"])
  if mapping.BERTJAX_MODEL != dims["model"]:
    default = convert.mapping_for_model(dims["model"]).MODEL_TYPE
    fits = [t for t in convert.ARCHITECTURES
            if convert.mapping_for_hf(t).BERTJAX_MODEL == dims["model"]]
    choice = f"pass --model_type={' or '.join(fits)}, or " if fits else ""
    raise ValueError(
        f"A bertjax {dims['model']!r} model cannot be written as HF "
        f"{mapping.MODEL_TYPE!r}; {choice}leave --model_type out to write it "
        f"as {default!r}.")
  special = config.get("hf_special_ids")
  pad_id = special[0] if special else batch_lib.PAD_ID
  if hasattr(mapping, "fold_params"):  # e.g. DeBERTa-v3's embedding delta
    params = mapping.fold_params(dims, params)
  kept = kept_tensors(config)
  # A sentence head RobertaForMaskedLM / DebertaV2ForMaskedLM have no place for.
  left_out = [h for h in getattr(mapping, "NOT_EXPORTED", ()) if h in params]
  written_heads = {r.head for r in mapping.rules(dims)} - set(left_out)
  tensors = core.params_to_hf(mapping, dims, params, core.vocab_order(config), kept,
                              heads=written_heads)
  # Whole tensors an import kept that no rule writes (DeBERTa's EMD table).
  for name in getattr(mapping, "KEPT_WHOLE", ()):
    if name in kept and name not in tensors:
      tensors[name] = kept[name]
  companions = {}
  if hasattr(mapping, "split_companion"):  # ELECTRA's generator, see read_companion
    tensors, companions = mapping.split_companion(dims, pad_id, tensors)
  with export_target.begin(out_dir, earlier, workdir, step) as export:
    hf_files.write(out_dir, mapping.hf_config(dims, pad_id), tensors,
                   record=export.writing)
    written = [hf_files.CONFIG_FILE, hf_files.SAFETENSORS]
    for subdir, (companion_config, companion) in companions.items():
      hf_files.write(paths.join(out_dir, subdir), companion_config, companion,
                     record=export.under(subdir))
      written += [f"{subdir}/{hf_files.CONFIG_FILE}", f"{subdir}/{hf_files.SAFETENSORS}"]
    files = tokenizer_files(config, workdir, out_dir, record=export.writing)
    export.finish(written + files)
  if left_out:
    logging.warning("Left out %s: %s has no place for them.", left_out, mapping.HF_ARCHITECTURE)
  return {"step": step, "tokenizer_files": files, "left_out": left_out}


def tokenizer_files(config: dict[str, Any], workdir: str, out_dir: str,
                    record=None) -> list[str]:
  """Writes the tokenizer of a workdir's model into an export; the names
  written: an import's own files, or the sentencepiece model bertjax trained.
  ``record``: called with each name before that file is written."""
  tok_path = config.get("tokenizer_path")
  if config.get("tokenizer") == "hf" and tok_path and paths.isdir(tok_path):
    return hf_files.copy_tokenizer_files(tok_path, out_dir, record=record)
  return _bertjax_tokenizer_files(config, workdir, out_dir, record=record)

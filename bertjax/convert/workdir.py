"""Import an HF model into a bertjax workdir, and export a workdir's checkpoint.

An import writes, under the workdir:
  checkpoints/0/     an orbax checkpoint (bertjax/checkpointing.py) at step 0:
                     the converted params, a fresh optimizer state, an empty
                     iterator state (start of the data) and the full config
  config.json        the same config, readable; ``configs/hf.py:<workdir>``
                     loads it for ``bertjax.main`` / ``bertjax.evaluate``
  tokenizer/         the model's tokenizer files plus bertjax_tokenizer.json
  hf_kept_tensors.safetensors
                     only where the mapping drops HF rows (RoBERTa's first
                     position rows) or whole tensors (DeBERTa's EMD table,
                     ``KEPT_WHOLE``): those as saved, for the export

The config is the user's base config (training hyperparameters, data) with
the model fields taken from the HF config.json: explicit ``num_layers,
hidden_size, num_heads, mlp_dim`` (model_size names the matching row of
bertjax/models/sizes.py, or 'custom'), ``tokenizer='hf'`` with
``tokenizer_path``, and ``hf_special_ids`` (the vocabulary reordering).

An import is all or nothing: everything is written into a staging directory
inside the workdir (``.import-staging-*``, so the final moves are renames on
one filesystem) and moved into place only once the checkpoint is saved. A
refused import leaves the workdir as it was, and one that did not exist is not
created. Entries of the import's names already in the workdir (left by an
interrupted import: ``tokenizer/``, ``config.json``, an empty
``checkpoints/``) are replaced whole on success.

Refused before anything is read or written (``_check_target``): a workdir
that is the HF model directory or lies inside it (an import never writes
into ``--from_hf``), one holding a config.json bertjax did not write (another
HF model directory), and a base config whose objective cannot train the
imported model (``objectives.model_mismatch``: ELECTRA's on a BERT).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from typing import Any, Iterator

import numpy as np
from absl import logging
from etils import epath

from bertjax import convert
from bertjax import paths
from bertjax.convert import core
from bertjax.convert import export_target
from bertjax.convert import hf_files
from bertjax.convert import hf_tokenizers
from bertjax.convert import pair_format
from bertjax.convert import spm_export

TOKENIZER_DIR = "tokenizer"
CONFIG_FILE = "config.json"
# HF rows with no bertjax parameter (RoBERTa's position rows below
# padding_idx + 1), kept as saved so that the export restores them.
KEPT_FILE = "hf_kept_tensors.safetensors"
# An import writes here (inside the workdir) first; see the module docstring.
STAGING_PREFIX = ".import-staging-"


@dataclasses.dataclass
class ImportReport:
  """What ``import_hf`` did.

  Attributes:
    config: the bertjax ConfigDict written with the checkpoint.
    initialised: heads the checkpoint lacked, freshly initialised ('mlm', 'nsp', 'pooler').
    unused: HF tensor names that map to nothing in bertjax (e.g. a classifier).
    tokenizer: the imported tokenizer.
  """
  config: Any
  initialised: list[str]
  unused: list[str]
  tokenizer: hf_tokenizers.HfTokenizer


def _size_row(dims: dict[str, Any]) -> str:
  from bertjax.models import sizes
  for name, size in sizes.SIZES.items():
    if all(getattr(size, k) == dims[k] for k in core.DIM_FIELDS):
      return name
  return "custom"


def load_hf(hf_dir: str, tokenizer_dir: str | None = None, seed: int = 0):
  """Reads an HF model directory into bertjax params (numpy, float32).

  Args:
    hf_dir: holds config.json, model.safetensors (or pytorch_model.bin) and
      the tokenizer files.
    tokenizer_dir: where to copy the tokenizer files; None to read them in place.
    seed: initialises the heads the checkpoint lacks.

  Returns:
    (model fields with hf_special_ids, params, names of freshly initialised
    heads, HF tensor names not used, the HfTokenizer).
  """
  return _load_hf(hf_dir, tokenizer_dir, seed)[:5]


def _read_fields(hf_dir: str):
  """(mapping module, bertjax model fields, companion tensors) of an HF model
  directory, from its config.json: nothing is written."""
  hf_config = hf_files.read_config(hf_dir)
  mapping = convert.mapping_for_hf(hf_config.get("model_type", ""))
  # A mapping may read a companion checkpoint beside the model (ELECTRA's
  # generator in <hf_dir>/generator): its config and its tensors, renamed.
  companion_config, companion = (mapping.read_companion(hf_dir)
                                 if hasattr(mapping, "read_companion") else (None, {}))
  fields = (mapping.model_fields(hf_config, companion_config) if companion_config
            else mapping.model_fields(hf_config))
  return mapping, fields, companion


# Model choices of the base config that an HF config.json does not make: the
# checkpoint is saved with the params of the model the config builds (BERT
# with configs/roberta.py: no pooler/NSP, those HF tensors ignored; RoBERTa
# with configs/bert.py: both, fresh). A mapping's own value is for load_hf.
_BASE_CHOICES = ("sentence_head",)


def _with_base_choices(read, base_config):
  """``read`` with the base config's ``_BASE_CHOICES``, none it leaves out."""
  mapping, fields, companion = read
  fields = {k: v for k, v in fields.items() if k not in _BASE_CHOICES}
  choices = {k: base_config[k] for k in _BASE_CHOICES if k in base_config}
  return mapping, {**fields, **choices}, companion


def base_config_name(mapping) -> str:
  """The shipped config an import of ``mapping``'s models starts from."""
  return getattr(mapping, "BASE_CONFIG", mapping.BERTJAX_MODEL)


def _load_hf(hf_dir: str, tokenizer_dir: str | None, seed: int, read=None):
  """``load_hf`` plus the HF rows the params leave out (``core.dropped_rows``);
  ``read``: what ``_read_fields`` returned, if it ran already."""
  mapping, fields, companion = read or _read_fields(hf_dir)
  fields = dict(fields)
  if tokenizer_dir is None:
    tokenizer = hf_tokenizers.HfTokenizer(
        hf_dir, special=hf_tokenizers.special_tokens(hf_dir, mapping.SPECIAL_TOKENS),
        vocab_size=fields["vocab_size"])
  else:
    tokenizer = hf_tokenizers.import_tokenizer(
        hf_dir, tokenizer_dir, mapping.SPECIAL_TOKENS, fields["vocab_size"])
  fields["hf_special_ids"] = tuple(tokenizer.special_ids)
  shapes = core.param_shapes(mapping.build_model(fields, _float32()))
  tensors = {**hf_files.read_tensors(hf_dir), **companion}
  try:
    params, initialised, unused = core.hf_to_params(
        mapping, fields, tensors, shapes, tokenizer.order, seed)
  except ValueError as e:  # the rules' messages name tensors, not the directory
    raise ValueError(f"{hf_dir}: {e}") from None
  kept = core.dropped_rows(mapping, fields, tensors)
  kept.update({name: tensors[name] for name in getattr(mapping, "KEPT_WHOLE", ())
               if name in tensors and name in unused})
  return fields, params, initialised, unused, tokenizer, kept


def _float32():
  import jax.numpy as jnp
  return jnp.float32


def _absolute(path: str) -> epath.Path:
  """``path`` as an epath; a local one made absolute (it is recorded in the config)."""
  return paths.path(path)


def _resolved(path: str) -> str:
  """``path`` absolute with symlinks followed (a URL as given, no trailing /)."""
  return paths.absolute(path) if paths.is_remote(path) else os.path.realpath(
      paths.absolute(path))


def _check_target(hf_dir: str, workdir: str) -> None:
  """Refuses a --workdir whose files the import would destroy (one sentence):
  the HF model directory itself or a directory inside it (an import only
  reads --from_hf), a --from_hf inside an entry the import replaces, and a
  directory with a config.json bertjax did not write."""
  source, target = _resolved(hf_dir), _resolved(workdir)
  if target == source or target.startswith(source.rstrip("/") + "/"):
    where = ("is the --from_hf directory itself" if target == source
             else f"lies inside the --from_hf directory {hf_dir}")
    raise ValueError(
        f"--workdir={workdir} {where}, which the import only reads and must not "
        "write into (its config.json would be replaced); pass --workdir a new "
        "directory outside it.")
  if source.startswith(target + "/") and source[len(target) + 1:].split("/")[0] in (
      TOKENIZER_DIR, CONFIG_FILE, "checkpoints", KEPT_FILE):
    raise ValueError(
        f"--from_hf={hf_dir} lies inside the --workdir's "
        f"{source[len(target) + 1:].split('/')[0]}, which the import replaces; "
        "copy the model directory elsewhere first or pass another --workdir.")
  config = paths.path(workdir) / CONFIG_FILE
  if config.is_file() and not export_target.is_bertjax_config(config):
    raise ValueError(
        f"--workdir={workdir} holds a config.json that bertjax did not write "
        "(a Hugging Face model directory?), which the import would replace; "
        "pass --workdir a new directory.")


def _check_objective(base_config, mapping, fields) -> None:
  """Refuses a base config whose objective cannot train the imported model
  (e.g. ELECTRA's on a BERT), which training found only after its data."""
  from bertjax import objectives
  objective = base_config.get("objective")
  if objective is None:
    return
  reason = objectives.model_mismatch(
      objective, fields["model"], mapping.build_model(fields, _float32()))
  if reason is not None:
    raise ValueError(
        f"--config has objective {objective!r}, which cannot train the imported "
        f"{fields['model']!r} model: {reason}; leave --config out, or pass a "
        f"config of that model's system (e.g. --config=configs/"
        f"{base_config_name(mapping)}.py:base).")


@contextlib.contextmanager
def _staging(workdir: epath.Path) -> Iterator[epath.Path]:
  """A new empty directory inside ``workdir`` to write an import into.

  On an exception the staging directory goes, and so do the workdir and
  any parents this created, so the file tree is as before.
  """
  created = None
  for path in (workdir, *workdir.parents):
    if path.exists():
      break
    created = path
  workdir.mkdir(parents=True, exist_ok=True)
  stage = workdir / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
  stage.mkdir()
  try:
    yield stage
  except BaseException:
    (created or stage).rmtree()
    raise


def _move_into_place(stage: epath.Path, workdir: epath.Path) -> None:
  """Renames every entry of ``stage`` into ``workdir``, replacing any of the
  same name (the old one is deleted with the staging directory)."""
  entries = sorted(stage.iterdir())
  replaced = stage / ".replaced"
  for entry in entries:
    target = workdir / entry.name
    if target.exists():
      replaced.mkdir(exist_ok=True)
      target.rename(replaced / entry.name)
    entry.rename(target)
  # On an object store the moves leave no object under ``stage``: no prefix
  # is left to remove.
  stage.rmtree(missing_ok=True)


def import_hf(hf_dir: str, workdir: str, base_config) -> ImportReport:
  """Converts an HF model directory into a bertjax workdir at step 0.

  All or nothing: on an error (a refused checkpoint or tokenizer) the
  workdir is left exactly as it was (see the module docstring).

  Args:
    hf_dir: the HF model directory.
    workdir: a new bertjax workdir, or one without checkpoints; not inside
      ``hf_dir`` and without a config.json of anyone but bertjax.
    base_config: the ConfigDict whose training and data fields the run keeps
      (e.g. configs/bert.py:base); its model fields are replaced.

  Returns:
    An ImportReport.
  """
  import jax.numpy as jnp
  import ml_collections
  from bertjax import checkpointing
  from bertjax import models
  from bertjax import optim
  from bertjax import state as state_lib

  paths.require_directory(workdir, "--workdir")
  paths.require_writable(workdir, "--workdir", "the workdir")
  _check_target(hf_dir, workdir)
  workdir = _absolute(workdir)
  checkpoints = workdir / "checkpoints"
  if checkpoints.is_dir() and any(checkpoints.iterdir()):
    raise ValueError(
        f"{workdir} already has checkpoints; pass a new --workdir to import into.")
  read = _with_base_choices(_read_fields(hf_dir), base_config)
  _check_objective(base_config, *read[:2])
  # The config records where the files end up, not where they are staged.
  tok_dir = str(workdir / TOKENIZER_DIR)
  with _staging(workdir) as stage:
    fields, params, initialised, unused, tokenizer, kept = _load_hf(
        hf_dir, str(stage / TOKENIZER_DIR), seed=int(base_config.get("seed", 0)),
        read=read)
    config = ml_collections.ConfigDict(base_config.to_dict())
    for key, value in fields.items():
      config[key] = value
    config.model_size = _size_row(fields)
    # Sentence pairs are packed as the tokenizer's own template joins them:
    # two separators for RoBERTa's (bertjax/data/packing.py's
    # PAIR_SEPARATORS_FIELD); recorded only where it is not BERT's one.
    separators = pair_format.separators(fields, tokenizer)
    if separators != 1 or "pair_separators" in config:
      config.pair_separators = separators
    config.tokenizer = "hf"
    config.tokenizer_path = tok_dir
    config.seq_len = min(int(config.seq_len), int(fields["max_position_embeddings"]))
    config.max_predictions_per_seq = min(int(config.max_predictions_per_seq),
                                         int(config.seq_len))
    if kept:
      config.hf_kept_tensors = str(workdir / KEPT_FILE)
      hf_files.write_tensors(str(stage / KEPT_FILE), kept)

    tx = optim.make_optimizer(config)
    # A model with a carry (XLNet's memory) starts it empty, as training does.
    state = state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
        carry=state_lib.empty_carry(models.get_model(config), config))
    # The checkpoint records no directory: written under the staging
    # directory, it restores from <workdir>/checkpoints once moved.
    checkpointer = checkpointing.Checkpointer(str(stage), keep=config.keep_checkpoints)
    checkpointer.save(0, state, {}, config, tokenizer.fingerprint, force=True)
    checkpointer.close()
    (stage / CONFIG_FILE).write_text(
        json.dumps(config.to_dict(), indent=2, sort_keys=True), encoding="utf-8")
    _move_into_place(stage, workdir)
  tokenizer = hf_tokenizers.HfTokenizer(tok_dir)
  for head in initialised:
    logging.warning("The checkpoint has no %s head; it was freshly initialised.", head)
  if unused:
    logging.warning("Ignored %d HF tensors that bertjax's %s has no place for: %s",
                    len(unused), config.model, ", ".join(unused[:8]))
  return ImportReport(config, initialised, unused, tokenizer)


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


def _load_params(workdir: str, step: int | None) -> tuple[dict[str, Any], Any, int]:
  import jax
  import orbax.checkpoint as ocp
  from bertjax import checkpointing

  checkpointer, step = checkpointing.open_step(workdir, step)
  if step is None:
    raise ValueError(f"No checkpoint in {checkpointer.directory}; train or import first.")
  config = checkpointer.saved_config(step)
  directory = checkpointer.directory
  checkpointer.close()
  if "model" not in config:
    raise ValueError(_not_an_encoder(workdir, config))
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


def _bertjax_tokenizer_files(config: dict[str, Any], workdir: str, out_dir: str) -> list[str]:
  """Exports a tokenizer bertjax trained (sentencepiece) as an HF one
  (``spm_export``); the names written."""
  data_dir = config.get("data_dir") or paths.join(workdir, "data")
  models = sorted(paths.path(data_dir).glob("tokenizers/*.model"))
  if not models:
    logging.warning("No tokenizer under %s/tokenizers; exported the weights only.",
                    data_dir)
    return []
  return spm_export.write(config, str(models[0]), out_dir)


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
  export_target.remove_earlier(out_dir, earlier)
  hf_files.write(out_dir, mapping.hf_config(dims, pad_id), tensors)
  written = [CONFIG_FILE, hf_files.SAFETENSORS]
  for subdir, (companion_config, companion) in companions.items():
    hf_files.write(paths.join(out_dir, subdir), companion_config, companion)
    written += [f"{subdir}/{CONFIG_FILE}", f"{subdir}/{hf_files.SAFETENSORS}"]
  files = tokenizer_files(config, workdir, out_dir)
  export_target.write_manifest(out_dir, written + files, workdir, step)
  if left_out:
    logging.warning("Left out %s: %s has no place for them.", left_out, mapping.HF_ARCHITECTURE)
  return {"step": step, "tokenizer_files": files, "left_out": left_out}


def tokenizer_files(config: dict[str, Any], workdir: str, out_dir: str) -> list[str]:
  """Writes the tokenizer of a workdir's model into an export; the names
  written: an import's own files, or the sentencepiece model bertjax trained."""
  tok_path = config.get("tokenizer_path")
  if config.get("tokenizer") == "hf" and tok_path and paths.isdir(tok_path):
    return hf_files.copy_tokenizer_files(tok_path, out_dir)
  return _bertjax_tokenizer_files(config, workdir, out_dir)

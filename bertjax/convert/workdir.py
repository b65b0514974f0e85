"""Import an HF model into a bertjax workdir (the export is bertjax/convert/export.py).

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

An import is all or nothing (a SIGTERM to ``bertjax.convert`` too): everything is written into a staging directory
inside the workdir (``.import-staging-*``, so the final moves are renames on
one filesystem) and moved into place only once the checkpoint is saved. A
refused import leaves the workdir as it was, and one that did not exist is not
created. Entries of the import's names already in the workdir (left by an
interrupted import: ``tokenizer/``, ``config.json``, an empty
``checkpoints/``) are replaced whole on success, and the staging directories
of imports that were stopped (SIGTERM, a kill: nothing removes them then) are
removed first.

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

from absl import logging
from etils import epath

from bertjax import convert
from bertjax import guards
from bertjax import paths
from bertjax.convert import core
from bertjax.convert import export as export_lib
from bertjax.convert import export_target
from bertjax.convert import hf_files
from bertjax.convert import hf_tokenizers
from bertjax.convert import pair_format

TOKENIZER_DIR = "tokenizer"
CONFIG_FILE = "config.json"
# HF rows with no bertjax parameter (RoBERTa's position rows below
# padding_idx + 1), kept as saved so that the export restores them.
KEPT_FILE = "hf_kept_tensors.safetensors"
# An import writes here (inside the workdir) first; see the module docstring.
STAGING_PREFIX = ".import-staging-"
# The export's names, which callers (and tests) reach through this module.
export_hf = export_lib.export_hf
load_params = export_lib.load_params
load_config = export_lib.load_config
kept_tensors = export_lib.kept_tensors
tokenizer_files = export_lib.tokenizer_files


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


def read_hf_architecture(hf_dir: str):
  """(model fields with hf_special_ids, the HfTokenizer) of an HF model
  directory, as ``load_hf`` returns them, from its config.json and tokenizer
  files alone: no weights are read."""
  mapping, fields, _ = _read_fields(hf_dir, tensors=False)
  fields = dict(fields)
  tokenizer = _read_tokenizer(hf_dir, mapping, fields["vocab_size"])
  fields["hf_special_ids"] = tuple(tokenizer.special_ids)
  return fields, tokenizer


def _read_tokenizer(hf_dir: str, mapping, vocab_size: int):
  """The HF directory's tokenizer, read in place."""
  return hf_tokenizers.HfTokenizer(
      hf_dir, special=hf_tokenizers.special_tokens(hf_dir, mapping.SPECIAL_TOKENS),
      vocab_size=vocab_size)


def _read_fields(hf_dir: str, tensors: bool = True):
  """(mapping module, bertjax model fields, companion tensors) of an HF model
  directory, from its config.json: nothing is written. ``tensors=False``
  leaves the companion's tensors unread ({})."""
  hf_config = hf_files.read_config(hf_dir)
  mapping = convert.mapping_for_hf(hf_config.get("model_type", ""))
  # A mapping may read a companion checkpoint beside the model (ELECTRA's
  # generator in <hf_dir>/generator): its config and its tensors, renamed.
  if not hasattr(mapping, "read_companion"):
    companion_config, companion = None, {}
  elif tensors:
    companion_config, companion = mapping.read_companion(hf_dir)
  else:
    companion_config, companion = mapping.read_companion_config(hf_dir), {}
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
    tokenizer = _read_tokenizer(hf_dir, mapping, fields["vocab_size"])
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
  # Stopped imports' stages (their checkpoint, as large as the model and its
  # optimizer state, stayed for good); this workdir has no checkpoint, so
  # no import into it has finished.
  for stale in workdir.glob(f"{STAGING_PREFIX}*"):
    logging.info("Removing %s, left by an import that was stopped.", stale)
    stale.rmtree()
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
    # A SIGTERM from here on (bertjax.convert) lets the import end: stopped
    # between two moves, it would leave half an import in the workdir.
    guards.finish_on_sigterm()
    _move_into_place(stage, workdir)
  tokenizer = hf_tokenizers.HfTokenizer(tok_dir)
  for head in initialised:
    logging.warning("The checkpoint has no %s head; it was freshly initialised.", head)
  if unused:
    logging.warning("Ignored %d HF tensors that bertjax's %s has no place for: %s",
                    len(unused), config.model, ", ".join(unused[:8]))
  return ImportReport(config, initialised, unused, tokenizer)

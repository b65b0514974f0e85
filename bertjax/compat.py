"""Which config changes a resumed run accepts: the one compatibility table.

A checkpoint records the config it was trained with. Before anything is
restored, ``check`` compares it with the config of the new run, field by
field, and each field's kind in ``FIELDS`` decides:

  layout  the saved state, or the model it belongs to, would not be the same
          (model, sizes, objective, optimizer, scan_layers, vocabulary,
          tokenizer ...): refused, with no override. Resuming would fail or,
          worse, load weights into the wrong places.
  stream  the data stream, masks or schedule of the remaining steps change
          (seq_len, batch_size, seed, masking, learning_rate ...): refused
          unless ``--config.allow_changes=field,...`` names the field, and then
          logged. The run would no longer be the one that was started.
  safe    loop cadence, evaluation, devices, paths (num_train_steps,
          checkpoint_every_steps, eval_*, mesh_shape, microbatches ...): just
          apply, with an info line (num_train_steps below the checkpoint's
          step is refused: ``check_not_past_end``).

A checkpoint of step 0 (what ``bertjax.convert --from_hf`` writes) has
consumed no data and no schedule, so only its layout is checked: continued
pretraining picks its own data, batch and schedule.

A field missing from the table is treated like a stream field (refused unless
allowed): bertjax cannot know what it changes, the user can. The tests check
that every field of every shipped config is in the table, so a new field
cannot be forgotten. A field one of the two configs lacks compares as its
``DEFAULTS`` value (what the code assumes when the field is absent) or, when
there is none, as absent.

Nested configs compare by dotted path (``model.hidden_size``); the table is
looked up by the full path first and then by the last component. ELECTRA's
generator fields compare by the generator they size (``_same_generator``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

LAYOUT = "layout"
STREAM = "stream"
SAFE = "safe"

_LAYOUT_FIELDS = (
    "model", "model_size", "objective", "optimizer", "scan_layers", "vocab_size",
    "tokenizer", "max_position_embeddings", "type_vocab_size", "num_layers",
    "hidden_size", "num_heads", "mlp_dim", "embedding_size", "layer_sharing",
    "sentence_head", "hidden_act", "layer_norm_eps",
    # DeBERTa's attention and decoder (bertjax/models/deberta.py).
    "position_buckets", "max_relative_positions", "pos_att_type",
    "share_att_key", "norm_rel_ebd", "position_biased_input", "emd_layers",
    "hf_legacy_mlm_head",
    # ELECTRA's generator (configs/electra.py)
    "generator_hidden_fraction", "generator_num_layers", "generator_hidden_size",
    "generator_num_heads", "generator_mlp_dim",
    # ELECTRA-style pretraining with DeBERTa encoders (configs/deberta_v3.py)
    "encoder", "gdes",
    # XLNet's relative distance clamp and segment memory, whose length is
    # the shape of the memory in the saved state (configs/xlnet.py)
    "clamp_len", "mem_len",
    # SpanBERT's span-boundary head has an offset embedding of
    # sbo_max_offset + 1 rows (bertjax/models/spanbert.py).
    "sbo_max_offset",
    # What an import from Hugging Face records (bertjax/convert/workdir.py).
    "hf_special_ids", "hf_model_type", "hf_position_offset",
    # Fine-tuning (configs/finetune.py): the task and its head.
    "task", "task_kind", "num_labels", "text_fields", "label_field", "label_names",
    "pooling", "random_init", "head_activation")
_STREAM_FIELDS = (
    # data source and packing
    "dataset", "text_files", "text_feature", "train_split", "mixture", "layout",
    "short_seq_prob", "pair_chunking", "shuffle_window", "seq_len", "batch_size",
    "seed",
    # masking and the sentence/span objectives' corruption
    "masking", "mask_rate", "max_predictions_per_seq", "mask_token_rate",
    "random_token_rate", "dupe_factor", "whole_word_masking", "nsp_negative_rate",
    "sop_swap_rate", "max_ngram", "ngram_probs", "max_span_length",
    "span_geometric_p", "knowledge_spans", "attend_across_documents",
    "ernie_level_rates", "ernie_max_phrase_words", "ernie_phrase_min_count",
    "ernie_phrase_min_pmi", "ernie_entity_min_count", "ernie_gazetteer",
    # UniLM's mix of attention masks (configs/unilm.py)
    "unilm_mask_rates",
    # ELECTRA's sampling and loss weight (configs/electra.py)
    "generator_temperature", "disc_loss_weight",
    # XLNet's partial prediction
    "partial_prediction_k", "max_span",
    # numerics and the optimizer's schedule
    "dropout_rate", "attention_dropout_rate", "dtype", "learning_rate",
    "warmup_steps", "adam_b1", "adam_b2", "adam_eps", "weight_decay",
    "grad_clip_norm",
    # segment ids all 0 (imported RoBERTa, bertjax/convert/roberta.py)
    "single_segment",
    # [SEP]s between a pair's segments (an import's tokenizer: data/packing.py)
    "pair_separators",
    # Fine-tuning (configs/finetune.py): its data, rows and schedule.
    "train_files", "eval_files", "doc_stride", "max_query_tokens", "head_dropout",
    "num_epochs", "warmup_fraction", "layer_decay", "steps_per_epoch",
    "max_train_examples", "unanswerable_fraction")
_SAFE_FIELDS = (
    # Paths move; what they hold is checked by the tokenizer fingerprint.
    "data_dir", "tokenizer_path", "hf_kept_tensors",
    # How prepare works, not what it makes (the fingerprint guards the rest).
    "prepare_workers", "prepare_block_mb", "tokenizer_sample_sentences",
    "tokenizer_train_threads", "knowledge_fit_documents",
    # Only used when initialising, which a resumed run does not do.
    "initializer_range",
    # Devices and memory: the same update (accumulation is exact).
    "mesh_shape", "microbatches", "remat",
    # The attention kernel: the same function to float rounding (models/attention.py).
    "attention_impl",
    # The last layer at the read rows only: the same losses to float rounding.
    "sparse_last_layer",
    # The loop's cadence and length, evaluation, guards.
    "num_train_steps", "log_every_steps", "checkpoint_every_steps",
    "keep_checkpoints", "eval_split", "eval_every_steps", "eval_max_batches",
    "eval_seed", "nonfinite", "max_consecutive_skips", "debug_nan_step",
    "allow_changes", "restart_from_scratch",
    # Fine-tuning: where TFDS tasks live, decoding, which metric picks the best.
    "tfds_data_dir", "max_answer_tokens", "max_answer_words", "main_metric", "max_eval_examples",
    "no_answer", "no_answer_threshold",
    # What the run records of its task for bertjax.load (finetune/inference.py).
    "output_names",
    # Fine-tuning: what the finished model predicts (loop.predict_all).
    "predict_files", "predict_split")

# The one table: config field -> LAYOUT, STREAM or SAFE.
FIELDS: dict[str, str] = {
    **{f: LAYOUT for f in _LAYOUT_FIELDS},
    **{f: STREAM for f in _STREAM_FIELDS},
    **{f: SAFE for f in _SAFE_FIELDS},
}

# What the code assumes for a field a config lacks (``config.get(f, default)``),
# so that a checkpoint written before the field existed still compares equal.
DEFAULTS: dict[str, Any] = {
    "optimizer": "adamw", "scan_layers": False, "sentence_head": True,
    "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pair_chunking": "bert",
    "max_ngram": 1, "ngram_probs": [], "knowledge_spans": False, "attend_across_documents": False,
    "initializer_range": 0.02, "microbatches": 1, "remat": "none",
    "attention_impl": "auto", "sparse_last_layer": False,
    "allow_changes": "", "restart_from_scratch": False, "single_segment": False,
    "pair_separators": 1,
    "encoder": "bert", "gdes": False, "mixture": "",
    "unanswerable_fraction": 0.0, "no_answer": "auto", "no_answer_threshold": 0.0,
    "predict_files": "", "predict_split": "", "output_names": "", "head_activation": "tanh",
}

# A field one of the two configs does not have (a config from before it).
ABSENT = "(absent)"


class IncompatibleCheckpoint(ValueError):
  """The config differs from the checkpoint's in a field that is refused."""


@dataclasses.dataclass(frozen=True)
class Change:
  field: str
  saved: Any
  new: Any
  kind: str

  def describe(self) -> str:
    return f"{self.field} {show_value(self.saved)} -> {show_value(self.new)}"


def kind_of(field: str) -> str | None:
  """The table's kind of a (possibly dotted) field name, None if unclassified."""
  return FIELDS.get(field, FIELDS.get(field.rsplit(".", 1)[-1]))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def field_names(config) -> list[str]:
  """The (dotted) names of every field of ``config``."""
  return sorted(_flatten(as_json(config)))


def as_json(config) -> dict[str, Any]:
  """The config as its checkpoint stores it (JSON types: lists, not tuples)."""
  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return json.loads(json.dumps(tree))


def _lookup(flat: Mapping[str, Any], field: str) -> Any:
  if field in flat:
    return flat[field]
  return DEFAULTS.get(field.rsplit(".", 1)[-1], ABSENT)


def show_value(value: Any) -> str:
  """A saved or new value as a refusal names it (ABSENT bare)."""
  return value if value is ABSENT else repr(value)


def flag_value(value: Any) -> str:
  """A value as it is written after ``--config.FIELD=``."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    return repr(tuple(value))
  return repr(value)


def differences(saved: Mapping[str, Any], config) -> list[Change]:
  """Every field whose value differs between the saved config and ``config``."""
  old, new = _flatten(saved), _flatten(as_json(config))
  changes = []
  for field in sorted(set(old) | set(new)):
    a, b = _lookup(old, field), _lookup(new, field)
    if a != b:
      changes.append(Change(field, a, b, kind_of(field) or STREAM))
  return changes


def allowed(config) -> set[str]:
  """The fields named by ``config.allow_changes`` ('seq_len,batch_size')."""
  text = str(config.get("allow_changes", "") or "")
  names = {n.strip() for n in text.split(",") if n.strip()}
  known = set(_flatten(as_json(config))) | set(FIELDS)
  for name in sorted(names):
    if name not in known:
      raise ValueError(
          f"config.allow_changes names {name!r}, which is not a config field; "
          "set --config.allow_changes to a comma-separated list of fields such "
          "as seq_len,batch_size.")
    if kind_of(name) == LAYOUT:
      # It would be ignored: a layout change is refused whatever is allowed.
      raise ValueError(
          f"config.allow_changes names {name!r}, which sets the saved state's "
          "layout and cannot change on resume, allowed or not; leave it out of "
          "--config.allow_changes (keep the checkpoint's value to resume, or "
          "pass a new --workdir to train with another).")
  return names


def is_finetuning(config: Mapping[str, Any]) -> bool:
  """Whether a config, or a checkpoint's saved one, is fine-tuning's: only
  configs/finetune.py has ``task`` (pretraining's and imports' have none)."""
  return "task" in config


def check_workdir_kind(newest, config, workdir: str, *, evaluating: bool = False) -> None:
  """Refuses a pretraining workdir given to fine-tuning and the reverse, before
  any work: ``check``'s field-by-field refusal would ask for flags the other
  program does not have.

  Args:
    newest: (step, saved config, where) of the workdir's newest checkpoint
      (``checkpointing.newest_saved_config``), or None for a new workdir.
    config: the run's config; workdir: the --workdir as given.
    evaluating: ``bertjax.evaluate`` asks, not ``bertjax.main``.
  """
  if newest is None or is_finetuning(newest[1]) == is_finetuning(config):
    return
  step, saved = newest[0], newest[1]
  if is_finetuning(config):
    raise IncompatibleCheckpoint(
        f"{workdir} is a pretraining workdir (its newest checkpoint, step {step}, "
        "was pretrained or imported, not fine-tuned); pass a new --workdir for "
        f"fine-tuning (and {workdir} as --init to start from it).")
  use = ("run bertjax.finetune on it again to evaluate it" if evaluating
         else "use bertjax.finetune to resume it")
  raise IncompatibleCheckpoint(
      f"{workdir} is a fine-tuning workdir (task {saved['task']!r}, step {step}); "
      f"{use} or bertjax.load to predict, or pass a new --workdir to pretrain.")


def check_not_past_end(step: int, config, where: str) -> None:
  """Refuses a workdir whose newest checkpoint is past ``num_train_steps``.

  Lowering num_train_steps is otherwise a safe change, but below the
  checkpoint's step the run has nothing to train and would only evaluate
  that checkpoint again as if it had ended there; a checkpoint exactly at
  num_train_steps is a finished run, which a rerun evaluates.

  Args:
    step: the newest checkpoint's step (``checkpointing.newest_saved_config``).
    config: the run's config; where: names the checkpoint in the message.
  """
  total = int(config.num_train_steps)
  if step > total:
    raise IncompatibleCheckpoint(
        f"{where} is past the end of this run (--config.num_train_steps={total}); "
        f"pass --config.num_train_steps={step} to evaluate it as finished, a "
        f"larger value to train it further, or a new --workdir to train "
        f"{total} steps from scratch.")


def check(saved: Mapping[str, Any], config, where: str, *,
          layout_only: bool = False, evaluating: bool = False,
          imported: bool = False) -> list[Change]:
  """Refuses a resume whose config changes the layout or, unallowed, the stream.

  Args:
    saved: the config the checkpoint was trained with (its JSON).
    config: the new run's ConfigDict.
    where: names the checkpoint in messages ('The checkpoint at step 20 in ...').
    layout_only: refuse layout changes only (evaluating a checkpoint).
    evaluating: the refusal's way out is to evaluate with the saved values
      (``bertjax.evaluate``), not to resume or to train afresh.
    imported: the checkpoint is an untrained import (``is_import`` at step
      0): the way out is to import again with the wanted config, which keeps
      the imported weights, not to train from scratch.

  Returns:
    The accepted changes (safe ones and allowed stream ones), for the log.

  Raises:
    IncompatibleCheckpoint: one sentence naming the fields, both values and
      the ways out.
  """
  changes = _same_generator(differences(saved, config), saved, config)
  if not layout_only:
    changes = [_memory_rows(c, saved) for c in changes]
  layout = [c for c in changes if c.kind == LAYOUT]
  if layout:
    # Another variant's config (or an import's): another model, fields this
    # config lacks, or another objective among other changes; flags would not
    # say it, so name the config file instead.
    other = any(c.field in _VARIANT_FIELDS or c.new is ABSENT for c in layout) or (
        len(layout) > 1 and any(c.field == "objective" for c in layout))
    named = _config_file(saved) if other else None
    afresh = (_import_again(saved, config) if imported and not evaluating
              else "a new --workdir to train this config from scratch")
    if named and evaluating:
      way_out = f"pass {named}, the config it was trained with, to evaluate it"
    elif named:
      way_out = (f"pass {named}, the config it was trained with, to resume it, "
                 f"or {afresh}")
    elif evaluating:
      way_out = f"pass {_flags(layout)} to evaluate it with the config it was trained with"
    else:
      way_out = f"keep {_flags(layout)} to resume it, or pass {afresh}"
    raise IncompatibleCheckpoint(
        f"{where} was trained with {_listing(layout, 'saved')} but the config "
        f"says {_listing(layout, 'new')}, which changes the saved state's "
        f"layout; {way_out}.")
  if layout_only:
    return changes
  ok = allowed(config)
  refused = [c for c in changes if c.kind == STREAM and c.field not in ok]
  if refused:
    names = ",".join(c.field for c in refused)
    raise IncompatibleCheckpoint(
        f"{where} was trained with {_listing(refused, 'saved')} but the config "
        f"says {_listing(refused, 'new')}, which changes the data stream or "
        f"schedule of the resumed run; keep {_flags(refused)} to resume it as "
        f"it was, pass --config.allow_changes={names} to resume with the "
        "change, or pass a new --workdir.")
  return changes


def _memory_rows(change: Change, saved: Mapping[str, Any]) -> Change:
  """``batch_size`` is layout in a run with XLNet's segment memory
  (``mem_len`` > 0): the saved memory has a row per row of the batch, which
  a resumed run continues; another batch_size cannot restore it (it failed
  after the workdir was locked and the data prepared, whatever
  allow_changes said). An import's memory (step 0, ``layout_only``) is
  empty, and any batch_size continues it."""
  if change.field == "batch_size" and int(saved.get("mem_len", 0) or 0) > 0:
    return dataclasses.replace(change, kind=LAYOUT)
  return change


_GENERATOR_FIELDS = ("generator_hidden_fraction", "generator_num_layers",
                     "generator_hidden_size", "generator_num_heads",
                     "generator_mlp_dim")


def _same_generator(changes: list[Change], saved: Mapping[str, Any],
                    config) -> list[Change]:
  """ELECTRA's generator fields are layout through the generator they size
  (``models.electra.generator_size``): fields that size the same generator
  another way are a safe change. A DeBERTa-v3 checkpoint from before its
  config sized the width by the fraction (explicit width, fraction 0.25
  unused) resumes with the config now (width 0, fraction 1.0)."""
  if (not any(c.field in _GENERATOR_FIELDS for c in changes)
      or not saved.get("model") == config.get("model") == "electra"):
    return changes
  from bertjax.models import electra  # pylint: disable=import-outside-toplevel
  try:
    same = electra.generator_size(saved) == electra.generator_size(config)
  except (ValueError, KeyError, TypeError):
    return changes  # a size the model refuses: it says so when built
  if not same:
    return changes
  return [dataclasses.replace(c, kind=SAFE) if c.field in _GENERATOR_FIELDS
          else c for c in changes]


def is_import(saved: Mapping[str, Any]) -> bool:
  """Whether a checkpoint's config was written by an HF import
  (bertjax/convert/workdir.py records the vocabulary reordering)."""
  return bool(saved.get("hf_special_ids"))


def _import_again(saved: Mapping[str, Any], config) -> str:
  """The refusal's way out for an untrained import: importing again with a
  config of the wanted objective saves that config's heads."""
  from bertjax import config_files  # pylint: disable=import-outside-toplevel
  objective = config.get("objective")
  named = next((f"--config=configs/{name}.py:<size>"
                for name in config_files.shipped_names() if name not in ("hf", "finetune")
                if config_files.shipped(name).get_config().get("objective") == objective
                and config_files.shipped(name).get_config().get("model") == saved.get("model")),
               "--config set to the config of the wanted objective")
  return (f"--workdir a new directory and import the Hugging Face model again "
          f"(python -m bertjax.convert) with {named}, which keeps its weights")


# Fields only a config file of another variant (or an import) changes.
_VARIANT_FIELDS = ("model", "hf_model_type", "encoder")


def _config_file(saved: Mapping[str, Any]) -> str | None:
  """``--config=...`` of the shipped config that trains the saved model and
  objective at its size, or None; an import's is ``configs/hf.py:<workdir>``."""
  if saved.get("hf_model_type"):
    return "--config=configs/hf.py:<the workdir> (an import's own config)"
  from bertjax import config_files  # pylint: disable=import-outside-toplevel
  size = saved.get("model_size")
  for name in config_files.shipped_names():
    if name in ("hf", "finetune"):
      continue
    try:
      candidate = config_files.shipped(name).get_config(size)
    except (ValueError, KeyError, TypeError):
      continue
    if all(candidate.get(f) == saved.get(f)
           for f in ("model", "objective", "model_size", "encoder")):
      return f"--config=configs/{name}.py:{size}"
  return None


def _listing(changes: list[Change], side: str) -> str:
  return ", ".join(f"{c.field}={show_value(getattr(c, side))}" for c in changes)


def _flags(changes: list[Change]) -> str:
  return " ".join(f"--config.{c.field}={flag_value(c.saved)}" for c in changes
                  if c.saved is not ABSENT) or "the checkpoint's config"

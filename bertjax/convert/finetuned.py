"""A fine-tuned model (a ``bertjax.finetune`` workdir) written as a Hugging
Face task model: ``python -m bertjax.convert --to_hf=DIR --workdir=FT``.

The encoder is written as the pretraining export writes it (its parts only:
no MLM or sentence head), the head as transformers' class for the task, so
that ``AutoModelFor<Task>.from_pretrained(DIR)`` loads every weight and
computes what bertjax computes:

  classification, regression  BERT, SpanBERT, ALBERT: ``*ForSequenceClassification``:
                              the pooler (dense, tanh over [CLS]) and
                              ``classifier``. Pooling ``pooler`` writes the
                              encoder's pooler; ``first`` writes the head's own
                              dense+tanh as the pooler (the same function; only
                              where dropout sat in training differs).
                              RoBERTa: ``RobertaForSequenceClassification``,
                              whose ``classifier.dense``/``out_proj`` is the
                              ``first`` head exactly; ELECTRA:
                              ``ElectraForSequenceClassification``, the same
                              with ``head_activation='gelu'``; DeBERTa
                              (v2/v3): ``DebertaV2ForSequenceClassification``,
                              whose ``pooler`` (dense, then
                              ``pooler_hidden_act``, written as the head's
                              activation) and ``classifier`` are the
                              ``first`` head; XLNet:
                              ``XLNetForSequenceClassification``, its
                              ``sequence_summary`` set to the first token,
                              dense, the head's activation, then
                              ``logits_proj``.
  tagging                     ``*ForTokenClassification`` (``classifier``).
  qa                          ``*ForQuestionAnswering`` (``qa_outputs``;
                              XLNet: ``XLNetForQuestionAnsweringSimple``).

Refused, with why: ``mean`` pooling (no transformers class averages tokens),
a head whose activation is not the class's, and the DeBERTa
towers of an ELECTRA-style (``configs/deberta_v3.py``) pretraining run (not
mapped; their imported or exported ``DebertaV2Model`` fine-tunes and
exports). The
tokenizer comes from the run's ``--init``, as the pretraining export writes it.
The label names go into ``id2label``/``label2id``; regression sets
``problem_type``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax import paths
from bertjax.convert import core
from bertjax.convert import export_target
from bertjax.convert import hf_files

_CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert",
                 "electra": "Electra", "deberta-v2": "DebertaV2", "xlnet": "XLNet"}
_SUFFIX = {"classification": "ForSequenceClassification",
           "regression": "ForSequenceClassification",
           "tagging": "ForTokenClassification", "qa": "ForQuestionAnswering"}


def _linear(name: str, params: dict[str, Any]) -> dict[str, np.ndarray]:
  """An ``nn.Linear``'s weight [out, in] and bias from a Dense's params."""
  return {f"{name}.weight": np.ascontiguousarray(np.asarray(params["kernel"]).T),
          f"{name}.bias": np.asarray(params["bias"])}


def _architecture(model_type: str, kind: str) -> str:
  """The transformers class for the task (XLNet's start/end-logits reader is
  ``XLNetForQuestionAnsweringSimple``; its ``ForQuestionAnswering`` is the
  beam-search one)."""
  if model_type == "xlnet" and kind == "qa":
    return "XLNetForQuestionAnsweringSimple"
  return _CLASS_PREFIX[model_type] + _SUFFIX[kind]


def _head_config(model_type: str, kind: str, cfg, hidden: int) -> dict[str, Any]:
  """config.json fields the task class reads for bertjax's sequence head."""
  if kind not in ("classification", "regression"):
    return {}
  activation = cfg.get("head_activation", "tanh")
  if model_type == "deberta-v2":  # ContextPooler: dense, then this activation
    return {"pooler_hidden_size": hidden, "pooler_hidden_act": activation,
            "pooler_dropout": float(cfg.head_dropout)}
  if model_type == "xlnet":
    # SequenceSummary over the first token (bertjax's [CLS] leads the row):
    # dense to the hidden size, the activation; logits_proj after it.
    return {"summary_type": "first", "summary_use_proj": True,
            "summary_proj_to_labels": False, "summary_activation": activation,
            "summary_first_dropout": 0.0,
            "summary_last_dropout": float(cfg.head_dropout)}
  return {}


def _head_tensors(model_type: str, prefix: str, kind: str, cfg,
                  head: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
  """(encoder parts to write, the head's tensors) for the task's HF class."""
  if kind in ("tagging", "qa"):
    return ("encoder",), _linear("classifier" if kind == "tagging" else "qa_outputs",
                                 head["out"])
  pooling, activation = cfg.pooling, cfg.get("head_activation", "tanh")
  if model_type == "deberta-v2":
    return ("encoder",), {**_linear("pooler.dense", head["dense"]),
                          **_linear("classifier", head["out"])}
  if model_type == "xlnet":
    return ("encoder",), {**_linear("sequence_summary.summary", head["dense"]),
                          **_linear("logits_proj", head["out"])}
  if model_type in ("roberta", "electra"):
    want = "tanh" if model_type == "roberta" else "gelu"
    if pooling != "first" or activation != want:
      raise ValueError(
          f"A {model_type} sequence head exports only as transformers' own "
          f"(the first token, dense, {want}, dense), not pooling={pooling!r} with "
          f"head_activation={activation!r}; fine-tune with --config.pooling=first "
          f"--config.head_activation={want} to export it.")
    return ("encoder",), {**_linear("classifier.dense", head["dense"]),
                          **_linear("classifier.out_proj", head["out"])}
  if pooling == "first" and activation != "tanh":
    raise ValueError(f"BERT's pooler is tanh, and this head was fine-tuned with "
                     f"head_activation={activation!r}; fine-tune with "
                     "--config.head_activation=tanh to export it.")
  if pooling == "pooler":
    return ("encoder", "pooler"), _linear("classifier", head["out"])
  # 'first': the head's dense+tanh over [CLS] is BERT's pooler.
  return ("encoder",), {**_linear(f"{prefix}pooler.dense", head["dense"]),
                        **_linear("classifier", head["out"])}


def export(workdir: str, out_dir: str, step: int | None = None,
           model_type: str | None = None, overwrite: bool = False) -> dict[str, Any]:
  """Writes the fine-tuning workdir's model (its best evaluation's, or
  ``step``'s) as an HF task model; returns {'step', 'tokenizer_files',
  'architecture'}."""
  from bertjax import convert
  from bertjax.convert import workdir as workdir_lib
  from bertjax.finetune import inference
  earlier = export_target.check(out_dir, workdir, overwrite)
  saved = inference.read(workdir, step)
  cfg, kind = saved.config, saved.config.task_kind
  if kind in ("classification", "regression") and cfg.pooling == "mean":
    raise ValueError(f"{workdir} was fine-tuned with pooling='mean', which no "
                     "transformers class computes; fine-tune with pooling='first' or "
                     "'pooler' to export it.")
  dims = core.model_dims(saved.fields)
  if model_type:
    dims["hf_model_type"] = model_type
  if dims.get("encoder", "bert") == "deberta":
    raise ValueError(
        f"{workdir} fine-tuned the DeBERTa tower of an ELECTRA-style run, which "
        "does not export as a task model; export that pretraining workdir with "
        "--to_hf (a DebertaV2Model), fine-tune from the exported directory, and "
        "export the result.")
  mapping = convert.mapping_for_config(dims)
  if (mapping.MODEL_TYPE not in _CLASS_PREFIX
      or dims["model"] not in ("bert", "spanbert", "albert", "electra", "deberta",
                               "xlnet")
      or dims.get("encoder", "bert") != "bert"):
    raise ValueError(f"Exporting a fine-tuned {dims['model']!r} encoder (HF "
                     f"{mapping.MODEL_TYPE!r}) is not supported; fine-tuned BERT, "
                     "SpanBERT, RoBERTa, ALBERT, ELECTRA, DeBERTa and XLNet models "
                     "export.")
  parts, head = _head_tensors(mapping.MODEL_TYPE, mapping.BASE_PREFIX, kind, cfg,
                              saved.params["head"])
  tensors = core.params_to_hf(mapping, dims, saved.params["encoder"],
                              core.vocab_order(saved.fields),
                              workdir_lib.kept_tensors(saved.fields), heads=parts)
  tensors.update(head)
  architecture = _architecture(mapping.MODEL_TYPE, kind)
  special = saved.fields.get("hf_special_ids")
  from bertjax import batch as batch_lib
  config = dict(mapping.hf_config(dims, special[0] if special else batch_lib.PAD_ID))
  names = inference.output_names(cfg)
  config["architectures"] = [architecture]
  config.update(_head_config(mapping.MODEL_TYPE, kind, cfg, int(dims["hidden_size"])))
  if kind == "regression":
    config.update(num_labels=1, problem_type="regression")
  elif names:
    config.update(id2label={str(i): n for i, n in enumerate(names)},
                  label2id={n: i for i, n in enumerate(names)})
    if kind == "classification":
      config["problem_type"] = "single_label_classification"
  with export_target.begin(out_dir, earlier, paths.absolute(workdir),
                           saved.step) as export:
    hf_files.write(out_dir, config, tensors, record=export.writing)
    written = [workdir_lib.CONFIG_FILE, hf_files.SAFETENSORS]
    if not paths.isdir(paths.join(saved.init, "checkpoints")):  # an HF model directory
      files = hf_files.copy_tokenizer_files(saved.init, out_dir, record=export.writing)
    else:
      files = workdir_lib.tokenizer_files(saved.fields, saved.init, out_dir,
                                          record=export.writing)
    export.finish(written + files)
  return {"step": saved.step, "tokenizer_files": files, "architecture": architecture}

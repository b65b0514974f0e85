"""What a fine-tuned model predicts for inputs without labels, and ``score``: the
metrics and per-example records of the eval split from the head's logits.

``config.predict_files`` (comma-separated files in the task's own format:
a table for classification and regression, SQuAD .json for QA, CoNLL for
tagging; labels, answers and tags may be left out) and
``config.predict_split`` (a split of a TFDS task, e.g. GLUE's ``test``, whose
labels TFDS hides) are read and checked with the task, before any work. Once
the run has trained its last step, and again each time a finished run is
started again (so new files are predicted without training), they are
predicted with the parameters of the best evaluation (``best_checkpoint/``;
the last step's where there is none) into ``<workdir>/predict_<name>.jsonl``:
one record per example, in input order, with the gold label, answers or tags
beside the prediction where the input had them. Where a finished run's
evaluation went beside the run's own record (``loop.evaluate``: settings that
move it), they go beside the run's own too, to ``predict_<name>-2.jsonl``
(the suffix of that evaluation's ``eval_<step>-2.json``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from etils import epath

from bertjax import checkpointing
from bertjax.finetune import features as features_lib
from bertjax.finetune import local_files
from bertjax.finetune import metrics as task_metrics
from bertjax.finetune import qa as qa_lib
from bertjax.finetune import tasks as tasks_lib


def _name(path: str) -> str:
  """predict_<name>.jsonl's name for a file: its base name without extension."""
  base = path.rstrip("/").rsplit("/", 1)[-1]
  return base.rsplit(".", 1)[0] if "." in base else base


def _hidden_gold(kind: str, examples, names) -> list[dict[str, Any]]:
  """A TFDS split's examples as unlabelled ones: a label TFDS hides (-1, as
  in GLUE's test splits) is no gold; the rest keep theirs."""
  out = []
  for ex in examples:
    ex = dict(ex)
    if kind == "classification":
      label = int(ex["label"])
      ex["gold"] = names[label] if 0 <= label < len(names) else None
      ex["label"] = 0
    elif kind == "regression":
      ex["gold"] = float(ex["label"]) if ex["label"] >= 0 else None
      ex["label"] = 0.0
    elif kind == "tagging":
      ex["gold"] = ex["tags"]
    else:
      ex["gold"] = ex["answers"] or None
    out.append(ex)
  return out


def inputs(config, task: tasks_lib.Task) -> list[tuple[str, list[dict[str, Any]]]]:
  """(name, examples) of each input to predict, read and checked."""
  out = [(_name(p), local_files.unlabelled(p, config, task))
         for p in [p.strip() for p in config.get("predict_files", "").split(",") if p.strip()]]
  split = config.get("predict_split", "")
  if split:
    if config.task == "local" or config.task in tasks_lib.demo_tasks.DEMO_TASKS:
      raise ValueError(f"--config.predict_split={split} names a split of a TFDS task, "
                       f"and {config.task!r} is not one; predict files with "
                       "--config.predict_files instead.")
    kind, examples, names = tasks_lib.tfds_split(config, split)
    out.append((split, _hidden_gold(kind, examples, names or task.label_names)))
  names = [name for name, _ in out]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise ValueError(f"Two inputs to predict would both write predict_{twice[0]}.jsonl; "
                     "give files of different names.")
  for name, examples in out:
    if not examples:
      raise ValueError(f"The input {name!r} to predict has no examples; give a "
                       "non-empty file or split.")
  return out


def records(task: tasks_lib.Task, examples, feats, logits: np.ndarray, config
            ) -> list[dict[str, Any]]:
  """One record per example: its input, the prediction and, where the input
  had one, its gold label / answers / tags."""
  kind, names = task.kind, task.label_names
  out = []
  if kind == "classification":
    z = logits - logits.max(-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    for i, (ex, p) in enumerate(zip(examples, probs)):
      rec = {"index": i, "text_a": ex["text_a"], **({"text_b": ex["text_b"]} if "text_b" in ex
                                                      else {}),
             "prediction": names[int(p.argmax())],
             "probabilities": {n: float(q) for n, q in zip(names, p)}}
      out.append(rec)
  elif kind == "regression":
    for i, (ex, v) in enumerate(zip(examples, logits[:, 0])):
      out.append({"index": i, "text_a": ex["text_a"],
                  **({"text_b": ex["text_b"]} if "text_b" in ex else {}),
                  "prediction": float(v)})
  elif kind == "tagging":
    tags = features_lib.word_tags(examples, feats, logits.argmax(-1), names)
    out = [{"index": i, "words": ex["words"], "prediction": t}
           for i, (ex, t) in enumerate(zip(examples, tags))]
  else:
    _, _, out = qa_lib.decode(examples, feats, logits, config,
                              no_answer=tasks_lib.predicts_no_answer(config, task),
                              threshold=float(config.get("no_answer_threshold", 0.0)))
    for rec, ex in zip(out, examples):
      del rec["answers"]
      rec["question"] = ex["question"]
  gold_key = {"classification": "label", "regression": "label", "tagging": "tags",
              "qa": "answers"}[kind]
  for rec, ex in zip(out, examples):
    if ex.get("gold") is not None:
      rec[gold_key] = ex["gold"]
  return out


def write(path: epath.Path, recs: list[dict[str, Any]]) -> None:
  tmp = path.parent / (path.name + ".tmp")
  tmp.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
  tmp.replace(path)


def best_params(workdir: str, step: int, abstract, shardings):
  """The parameters of the best evaluation (``best_checkpoint/<step>``)."""
  checkpointer = checkpointing.Checkpointer(workdir, read_only=True, subdir="best_checkpoint")
  try:
    state, _ = checkpointer.restore(step, abstract, shardings)
  finally:
    checkpointer.close()
  return state.params


def score(task: tasks_lib.Task, examples, feats, logits: np.ndarray, config
          ) -> tuple[dict[str, float], list[dict[str, Any]]]:
  """(metrics, one prediction record per example) from the head's logits."""
  kind, names = task.kind, task.label_names
  if kind == "classification":
    pred = logits.argmax(-1)
    gold = feats["label"]
    records = [{"index": i, "label": names[int(g)], "prediction": names[int(p)]}
               for i, (g, p) in enumerate(zip(gold, pred))]
    return task_metrics.classification(gold, pred, len(names)), records
  if kind == "regression":
    pred = logits[:, 0]
    records = [{"index": i, "label": float(g), "prediction": float(p)}
               for i, (g, p) in enumerate(zip(feats["label"], pred))]
    return task_metrics.regression(feats["label"], pred), records
  if kind == "tagging":
    pred = features_lib.word_tags(examples, feats, logits.argmax(-1), names)
    gold = [ex["tags"] for ex in examples]
    records = [{"index": i, "words": ex["words"], "tags": ex["tags"], "prediction": tags}
               for i, (ex, tags) in enumerate(zip(examples, pred))]
    return task_metrics.tagging(gold, pred), records
  no_answer = tasks_lib.predicts_no_answer(config, task)
  threshold = float(config.get("no_answer_threshold", 0.0))
  spans, margins, records = qa_lib.decode(examples, feats, logits, config,
                                          no_answer=no_answer, threshold=threshold)
  golds = [ex["answers"] for ex in examples]
  if no_answer:
    return task_metrics.squad_v2(golds, spans, margins, threshold), records
  return task_metrics.squad(golds, spans), records

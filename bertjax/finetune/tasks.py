"""Fine-tuning tasks: where the examples come from, and what kind they are.

A task yields plain Python examples, one dict each:
  classification / regression  {'text_a', 'text_b' (pairs; absent for single
                                texts), 'label' (class index / float)}
  tagging                      {'words': [str], 'tags': [str]}
  qa                           {'id', 'context', 'question', 'answers': [str],
                                'answer_start': chars into context (-1: none)}

A QA example with no answers is a question the context does not answer
(SQuAD 2.0); decoding predicts "no answer" for a task that has such
questions (``predicts_no_answer``).

Sources (``config.task``):
  coherence, cloze_qa   built deterministically from the demo corpus's held-out
                        documents (``demo_tasks``).
  glue/<name>, squad (v1.1), squad/v2.0, conll2003
                        TFDS datasets, read only when already prepared in
                        ``config.tfds_data_dir``; never downloaded.
  local                 the user's files: ``config.train_files`` and
                        ``config.eval_files`` (``local_files``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax.finetune import demo_tasks

KINDS = ("classification", "regression", "tagging", "qa")
# SQuAD's versions as tasks, and the TFDS names they are read from.
SQUAD = {"squad": "squad/v1.1", "squad/v1.1": "squad/v1.1", "squad/v2.0": "squad/v2.0"}
# What ``config.task_kind`` may say for local tables (.csv, .tsv, .jsonl).
TABLE_KINDS = ("classification", "regression")


@dataclasses.dataclass(frozen=True)
class Glue:
  tfds_name: str
  kind: str
  text_fields: tuple[str, ...]
  num_labels: int
  eval_split: str = "validation"


# GLUE as TFDS names it; the main metric of each is in loop.MAIN_METRIC.
GLUE = {
    "cola": Glue("glue/cola", "classification", ("sentence",), 2),
    "sst2": Glue("glue/sst2", "classification", ("sentence",), 2),
    "mrpc": Glue("glue/mrpc", "classification", ("sentence1", "sentence2"), 2),
    "qqp": Glue("glue/qqp", "classification", ("question1", "question2"), 2),
    "stsb": Glue("glue/stsb", "regression", ("sentence1", "sentence2"), 1),
    "mnli": Glue("glue/mnli", "classification", ("premise", "hypothesis"), 3,
                 "validation_matched"),
    "qnli": Glue("glue/qnli", "classification", ("question", "sentence"), 2),
    "rte": Glue("glue/rte", "classification", ("sentence1", "sentence2"), 2),
    "wnli": Glue("glue/wnli", "classification", ("sentence1", "sentence2"), 2),
}


@dataclasses.dataclass
class Task:
  """Examples of both splits plus what the head needs to know.

  Attributes:
    kind: one of KINDS.
    train, eval: lists of example dicts (module docstring).
    label_names: class / tag names (classification, tagging).
  """
  kind: str
  train: list[dict[str, Any]]
  eval: list[dict[str, Any]]
  label_names: tuple[str, ...] = ()

  @property
  def num_outputs(self) -> int:
    return {"regression": 1, "qa": 2}.get(self.kind, len(self.label_names))

  @property
  def unanswerable(self) -> bool:
    """A QA task with questions that have no answer (SQuAD 2.0)."""
    return self.kind == "qa" and any(not ex["answers"] for ex in self.train + self.eval)


def predicts_no_answer(config, task: Task) -> bool:
  """Whether QA decoding may answer "no answer": ``config.no_answer`` 'on',
  or 'auto' (the default) and the task has questions without an answer."""
  mode = config.get("no_answer", "auto")
  return task.kind == "qa" and (mode == "on" or (mode == "auto" and task.unanswerable))


def _tfds_examples(name: str, split: str, data_dir: str) -> list[dict[str, Any]]:
  import tensorflow_datasets as tfds
  where = data_dir or tfds.core.constants.DATA_DIR
  how = (f"prepare it once where there is network (`tfds build {name} --data_dir=DIR`) "
         "and pass --config.tfds_data_dir=DIR (bertjax never downloads)")
  from bertjax.data import builders  # pylint: disable=g-import-not-at-top
  try:
    builder = builders.catalog_builder(name, data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    # TFDS raises this both for unknown names and for known ones whose code
    # it cannot load here; either way the prepared files are not there.
    raise ValueError(f"TFDS dataset {name} is not prepared in {where}; {how}.") from None
  if not builder.is_prepared():
    raise ValueError(f"TFDS dataset {name} is not prepared in {where}; {how}.")
  if split not in builder.info.splits:
    raise ValueError(f"TFDS dataset {name} has no split {split!r}; it has "
                     f"{', '.join(builder.info.splits)}.")
  return list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))), builder


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def tfds_split(config, split: str):
  """(kind, examples, label names) of one split of the TFDS task ``config.task``."""
  task = config.task
  if task.startswith("glue/"):
    glue = GLUE.get(task[5:])
    if glue is None:
      raise ValueError(f"Unknown GLUE task {task!r}; pass --config=configs/finetune.py:"
                       f"<task> with one of {', '.join('glue/' + k for k in GLUE)}.")
    rows, builder = _tfds_examples(glue.tfds_name, split, config.tfds_data_dir)
    out = []
    for r in rows:
      ex = {"text_a": _text(r[glue.text_fields[0]]),
            "label": float(r["label"]) if glue.kind == "regression" else int(r["label"])}
      if len(glue.text_fields) > 1:
        ex["text_b"] = _text(r[glue.text_fields[1]])
      out.append(ex)
    names = (() if glue.kind == "regression"
             else tuple(builder.info.features["label"].names))
    return glue.kind, out, names
  if task in SQUAD:
    # SQuAD 2.0's unanswerable questions have no answers (is_impossible).
    rows, _ = _tfds_examples(SQUAD[task], split, config.tfds_data_dir)
    return "qa", [{
        "id": _text(r["id"]), "context": _text(r["context"]),
        "question": _text(r["question"]),
        "answers": [_text(t) for t in r["answers"]["text"]],
        "answer_start": int(r["answers"]["answer_start"][0])
                        if len(r["answers"]["answer_start"]) else -1} for r in rows], ()
  if task == "conll2003":
    rows, builder = _tfds_examples("conll2003", split, config.tfds_data_dir)
    names = tuple(builder.info.features["ner"].feature.names)
    return "tagging", [{"words": [_text(w) for w in r["tokens"]],
                        "tags": [names[int(t)] for t in r["ner"]]} for r in rows], names
  raise ValueError(f"Unknown task {task!r}; pass --config=configs/finetune.py:<task> "
                   "with one of coherence, cloze_qa, local, squad, squad/v2.0, conll2003, "
                   "glue/<name>.")


def load(config) -> Task:
  """The task ``config.task`` names, both splits (module docstring)."""
  if config.task == "coherence":
    train, evals = demo_tasks.documents()
    return Task("classification", demo_tasks.coherence_examples(train, 0),
                demo_tasks.coherence_examples(evals, 1), ("other_document", "continuation"))
  if config.task == "cloze_qa":
    train, evals = demo_tasks.documents()
    fraction = float(config.get("unanswerable_fraction", 0.0))
    return Task("qa", demo_tasks.cloze_examples(train, 0, fraction),
                demo_tasks.cloze_examples(evals, 1, fraction))
  if config.task == "local":
    from bertjax.finetune import local_files
    return local_files.load(config)
  kind, train, names = tfds_split(config, config.train_split)
  _, evals, _ = tfds_split(config, config.eval_split)
  return Task(kind, train, evals, names)

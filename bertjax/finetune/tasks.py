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
                        ``config.eval_files``, read by extension: .csv, .tsv
                        and .jsonl (``config.text_fields``, ``config.label_field``),
                        .json (SQuAD format), .conll/.txt (CoNLL columns:
                        the word first, the tag last, blank lines between
                        sentences). UTF-8, a byte-order mark allowed; a .tsv
                        is read without quoting, as GLUE's files and BERT's
                        reader take them. A malformed row is refused with
                        its file and line.
All files are read through etils.epath, so gs:// paths work.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from typing import Any

import numpy as np
from etils import epath

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
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
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


def _from_tfds(config, split: str):
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


def _read(path: str) -> str:
  """The text of a task file (UTF-8; a byte-order mark, as Excel writes, is dropped)."""
  p = epath.Path(path)
  if not p.exists():
    raise ValueError(f"Task file {path} does not exist; fix --config.train_files / "
                     "--config.eval_files.")
  data = p.read_bytes()
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ValueError(f"Task file {path} is not UTF-8 text (byte {data[e.start]:#04x} at "
                     f"offset {e.start}); save it as UTF-8.") from None


def _table_rows(path: str, text: str, tsv: bool) -> list[dict[str, Any]]:
  """Rows of a .csv or .tsv file, each with its line under ``LINE``. A .tsv is
  read as GLUE's files and BERT's reader take them: no quoting, so a text that
  starts with a quote mark is kept as it is instead of swallowing the lines
  after it."""
  reader = csv.DictReader(io.StringIO(text), delimiter="\t" if tsv else ",",
                          quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
  rows = []
  try:
    for row in reader:
      if None in row or None in row.values():
        given = (sum(v is not None for k, v in row.items() if k is not None)
                 + len(row.get(None, [])))
        raise ValueError(
            f"{path} line {reader.line_num} has {given} fields where its header has "
            f"{len(reader.fieldnames)} "
            f"({', '.join(reader.fieldnames)}); give every row one value per column"
            + (" (a .tsv is split at every tab)" if tsv else
               " (quote a value that holds a comma)") + ".")
      rows.append({**row, LINE: reader.line_num})
  except csv.Error as e:
    raise ValueError(f"{path} line {reader.line_num} is not valid "
                     f"{'TSV' if tsv else 'CSV'} ({e}); fix that line.") from None
  return rows


def _jsonl_rows(path: str, text: str) -> list[dict[str, Any]]:
  rows = []
  for n, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} line {n} is not valid JSON ({e.msg}, column {e.colno}); "
                       "each line of a .jsonl file must be one JSON object.") from None
    if not isinstance(row, dict):
      raise ValueError(f"{path} line {n} is a JSON {type(row).__name__}, not an object; "
                       "each line of a .jsonl file must be one object such as "
                       '{"sentence": "...", "label": "..."}.')
    rows.append({**row, LINE: n})
  return rows


_SQUAD_LAYOUT = ('{"data": [{"paragraphs": [{"context": ..., "qas": [{"id": ..., '
                 '"question": ..., "answers": [{"text": ..., "answer_start": ...}]}]}]}]}')


def _squad_rows(path: str, text: str) -> list[dict[str, Any]]:
  try:
    squad = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); a .json "
                     "task file is a SQuAD file (a .jsonl file holds one row a line).") from None
  rows = []
  try:
    for article in squad["data"]:
      for para in article["paragraphs"]:
        for qa in para["qas"]:
          answers = qa.get("answers", [])
          rows.append({"id": str(qa["id"]), "context": str(para["context"]),
                       "question": str(qa["question"]),
                       "answers": [str(a["text"]) for a in answers],
                       "answer_start": int(answers[0]["answer_start"]) if answers else -1})
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    what = f"no {e.args[0]!r}" if isinstance(e, KeyError) else "an entry of another shape"
    raise ValueError(f"{path} is not a SQuAD file ({what}); a .json task file must be "
                     f"laid out as SQuAD's: {_SQUAD_LAYOUT}.") from None
  return rows


def _conll_rows(path: str, text: str) -> list[dict[str, Any]]:
  rows, words, tags = [], [], []
  for n, line in enumerate(text.splitlines() + [""], 1):
    cols = line.split()
    if not cols or cols[0] == "-DOCSTART-":
      if words:
        rows.append({"words": words, "tags": tags})
      words, tags = [], []
      continue
    if len(cols) < 2:
      raise ValueError(f"{path} line {n} has one column ({cols[0]!r}); a CoNLL line is "
                       "the word first and its tag last, with a blank line between "
                       "sentences.")
    words.append(cols[0])
    tags.append(cols[-1])
  return rows


def _local_rows(path: str, config) -> tuple[str, list[dict[str, Any]]]:
  """(kind-less format, rows) of one local file, by its extension."""
  del config
  lower = path.lower()
  if lower.endswith((".csv", ".tsv")):
    return "table", _table_rows(path, _read(path), lower.endswith(".tsv"))
  if lower.endswith(".jsonl"):
    return "table", _jsonl_rows(path, _read(path))
  if lower.endswith(".json"):
    return "qa", _squad_rows(path, _read(path))
  if lower.endswith((".conll", ".txt")):
    return "tagging", _conll_rows(path, _read(path))
  if not epath.Path(path).exists():  # a missing file is named as such first
    _read(path)
  raise ValueError(f"Cannot read {path}: use .csv, .tsv, .jsonl, .json (SQuAD) or "
                   ".conll files.")


def _local_split(files: str, config) -> tuple[str, list[dict[str, Any]]]:
  """(format, rows) of comma-separated ``files``; each table row remembers its
  file under ``SOURCE`` so that a bad value can be reported with it."""
  kinds, rows = set(), []
  for path in [p.strip() for p in files.split(",") if p.strip()]:
    kind, part = _local_rows(path, config)
    kinds.add(kind)
    rows += [{**r, SOURCE: path} for r in part] if kind == "table" else part
  if not rows:
    raise ValueError(f"No examples in {files!r}; set --config.train_files and "
                     "--config.eval_files to non-empty files.")
  if len(kinds) > 1:
    raise ValueError(f"{files!r} mixes file formats; give files of one format.")
  return kinds.pop(), rows


# Keys under which a local row keeps the file and line it was read from (not columns).
SOURCE = "__file__"
LINE = "__line__"


def _where(row: dict[str, Any]) -> str:
  return f"{row[SOURCE]} line {row[LINE]}" if LINE in row else str(row[SOURCE])


def _number(row: dict[str, Any], config) -> float:
  """The regression label of a local table row, or ValueError naming the file,
  the column, the value and the fix."""
  value = row[config.label_field]
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = None
  if number is None or not np.isfinite(number):
    line = f" (line {row[LINE]})" if LINE in row else ""
    raise ValueError(
        f"{row[SOURCE]} has the label {value!r} in column {config.label_field!r}{line}, "
        "which --config.task_kind=regression cannot read as a finite number; set "
        "--config.task_kind=classification for labels that are names, or make "
        "every label in that column a number.")
  return number


def _table_examples(rows, config) -> list[dict[str, Any]]:
  fields = [f.strip() for f in config.text_fields.split(",") if f.strip()]
  if not 1 <= len(fields) <= 2:
    raise ValueError("--config.text_fields names one or two columns, e.g. "
                     "'sentence' or 'sentence1,sentence2'.")
  regression = config.task_kind == "regression"
  out, seen = [], set()
  for r in rows:
    columns = [c for c in r if c not in (SOURCE, LINE)]
    missing = [f for f in fields + [config.label_field] if f not in columns]
    if missing:
      # A table's header is its first row's columns: name the file then.
      place = _where(r) if r[SOURCE] in seen else r[SOURCE]
      raise ValueError(f"{place} has no column {missing[0]!r} (it has "
                       f"{', '.join(columns)}); set --config.text_fields / "
                       "--config.label_field.")
    empty = [f for f in fields + [config.label_field] if r[f] is None]
    if empty:
      raise ValueError(f"{_where(r)} has no value (null) in column {empty[0]!r}; give "
                       "every row its text and label.")
    label = _number(r, config) if regression else r[config.label_field]
    seen.add(r[SOURCE])
    ex = {"text_a": str(r[fields[0]]), "label": label, SOURCE: _where(r)}
    if len(fields) == 2:
      ex["text_b"] = str(r[fields[1]])
    out.append(ex)
  return out


def _label_names(config, train: list[dict[str, Any]]) -> tuple[str, ...]:
  """The classes: ``config.label_names``, or those of the train files, sorted."""
  given = tuple(x.strip() for x in config.label_names.split(",") if x.strip())
  if len(set(given)) < len(given):
    twice = sorted({x for x in given if given.count(x) > 1})
    raise ValueError(f"--config.label_names lists {twice[0]!r} twice; list each label once.")
  if len(given) == 1:
    raise ValueError(f"--config.label_names lists one label ({given[0]!r}), and a "
                     "classifier needs two or more; list every label, comma-separated.")
  names = given or tuple(sorted({str(ex["label"]) for ex in train}))
  if len(names) < 2:
    raise ValueError(
        f"The train files have only the label {names[0]!r} in column "
        f"{config.label_field!r}, and a classifier needs two or more; add rows of the "
        "other labels, list every label in --config.label_names, or set "
        "--config.task_kind=regression for numbers.")
  return names


def _local(config) -> Task:
  if not config.train_files or not config.eval_files:
    raise ValueError("task 'local' reads --config.train_files and --config.eval_files; "
                     "set both.")
  fmt, train = _local_split(config.train_files, config)
  eval_fmt, evals = _local_split(config.eval_files, config)
  if eval_fmt != fmt:
    kinds = {"table": "a table (.csv, .tsv, .jsonl)", "qa": "SQuAD (.json)",
             "tagging": "CoNLL (.conll)"}
    raise ValueError(f"--config.train_files are {kinds[fmt]} but --config.eval_files are "
                     f"{kinds[eval_fmt]}; give eval files of the train files' format.")
  if fmt == "qa":
    return Task("qa", train, evals)
  if fmt == "tagging":
    names = tuple(sorted({t for ex in train for t in ex["tags"]}))
    unknown = {t for ex in evals for t in ex["tags"]} - set(names)
    if unknown:
      raise ValueError(f"Eval tags {sorted(unknown)[:3]} never occur in the train files; "
                       "add them to the train data.")
    return Task("tagging", train, evals, names)
  if config.task_kind not in TABLE_KINDS:
    raise ValueError(f"task_kind {config.task_kind!r} is not one of "
                     f"{', '.join(TABLE_KINDS)}; fix --config.task_kind.")
  train = _table_examples(train, config)
  evals = _table_examples(evals, config)
  if config.task_kind == "regression":
    for ex in train + evals:
      del ex[SOURCE]
    return Task("regression", train, evals)
  names = _label_names(config, train)
  index = {n: i for i, n in enumerate(names)}
  for ex in train + evals:
    label = str(ex["label"])
    if label not in index:
      among = ("--config.label_names" if config.label_names.strip()
               else "the labels of the train files")
      raise ValueError(f"Label {label!r} of {ex[SOURCE]} is not among {among} "
                       f"({', '.join(names)}); list every label in --config.label_names "
                       "(or fix that row).")
    ex["label"] = index[label]
  for ex in train + evals:
    del ex[SOURCE]
  return Task("classification", train, evals, names)


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
    return _local(config)
  kind, train, names = _from_tfds(config, config.train_split)
  _, evals, _ = _from_tfds(config, config.eval_split)
  return Task(kind, train, evals, names)

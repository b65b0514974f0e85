"""The user's own task files: ``config.train_files`` and ``config.eval_files``
(task ``local``), and files to predict (``config.predict_files``).

Files are read by extension: .csv, .tsv and .jsonl (``config.text_fields``,
``config.label_field``), .json (SQuAD format), .conll/.txt (CoNLL columns:
the word first, the tag last, blank lines between sentences). UTF-8, a
byte-order mark allowed; a .tsv is read without quoting, as GLUE's files and
BERT's reader take them. A malformed row is refused with its file and line.
Files to predict have the same formats; their labels, answers and tags may be
left out. All files are read through etils.epath, so gs:// paths work.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np
from etils import epath

from bertjax.finetune.tasks import TABLE_KINDS, Task


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
  lines = io.StringIO(text).readlines()
  reader = csv.DictReader(lines, delimiter="\t" if tsv else ",",
                          quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
  rows = []
  try:
    reader.fieldnames  # reads the header, which the first row's line must count
    while True:
      # A row's line is read off before it, as a quoted value may span lines;
      # the reader skips blank lines, so they are skipped here too.
      start = reader.line_num + 1
      while start <= len(lines) and not lines[start - 1].strip("\r\n"):
        start += 1
      row = next(reader, None)
      if row is None:
        break
      if None in row or None in row.values():
        given = (sum(v is not None for k, v in row.items() if k is not None)
                 + len(row.get(None, [])))
        spans = [v for v in row.values() if isinstance(v, str) and "\n" in v]
        if spans and not tsv and reader.line_num > start:
          raise ValueError(
              f"{path} line {start} opens a quoted value that runs on to line "
              f"{reader.line_num}, so the row has {given} of its header's "
              f"{len(reader.fieldnames)} fields; close the quote (a quote inside a "
              f"value is written twice, \"\").")
        raise ValueError(
            f"{path} line {reader.line_num} has {given} fields where its header has "
            f"{len(reader.fieldnames)} "
            f"({', '.join(reader.fieldnames)}); give every row one value per column"
            + (" (a .tsv is split at every tab)" if tsv else
               " (quote a value that holds a comma)") + ".")
      rows.append({**row, LINE: start})
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


class _Contradiction(Exception):
  """A SQuAD 2.0 question both unanswerable and answered: (number, id)."""


def _squad_rows(path: str, text: str) -> list[dict[str, Any]]:
  try:
    squad = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); a .json "
                     "task file is a SQuAD file (a .jsonl file holds one row a line).") from None
  rows, spans = [], []
  try:
    for article in squad["data"]:
      for para in article["paragraphs"]:
        for qa in para["qas"]:
          answers = qa.get("answers", [])
          if qa.get("is_impossible") is True and answers:
            raise _Contradiction(len(rows) + 1, str(qa["id"]))
          rows.append({"id": str(qa["id"]), "context": str(para["context"]),
                       "question": str(qa["question"]),
                       "answers": [str(a["text"]) for a in answers],
                       "answer_start": int(answers[0]["answer_start"]) if answers else -1})
          spans.append([(str(a["text"]), a["answer_start"])
                        for a in answers if "answer_start" in a])
  except _Contradiction as e:
    n, qid = e.args
    raise ValueError(
        f"{path} question {n} (id {qid!r}) is marked \"is_impossible\": true but "
        "has answers; a question the context does not answer has \"answers\": [] "
        "(SQuAD 2.0 keeps such guesses under \"plausible_answers\"), so empty its "
        "answers or set \"is_impossible\": false.") from None
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    what = f"no {e.args[0]!r}" if isinstance(e, KeyError) else "an entry of another shape"
    raise ValueError(f"{path} is not a SQuAD file ({what}); a .json task file must be "
                     f"laid out as SQuAD's: {_SQUAD_LAYOUT}.") from None
  for n, (row, given) in enumerate(zip(rows, spans), 1):
    for text, start in given:
      if isinstance(start, bool) or not isinstance(start, int):
        raise ValueError(
            f"{path} question {n} (id {row['id']!r}) has answer_start {start!r}; "
            "answer_start is a whole number, the answer's first character's "
            "index in the context, counted from 0.")
      _check_answer(path, n, row["id"], row["context"], text, start)
  return rows


def _check_answer(path: str, n: int, qid: str, context: str, text: str, start: int):
  """ValueError unless ``text`` is the context's characters from ``start`` on,
  exactly (whitespace included; SQuAD's own offsets match so). A mismatched
  span used to be trained on silently as other characters, or as "no answer"
  where it covered no token."""
  question = f"{path} question {n} (id {qid!r})"
  if not text:
    raise ValueError(f"{question} has an empty answer text; give the answer's text, or "
                     '"answers": [] for a question the context does not answer.')
  end = start + len(text)
  if 0 <= start and end <= len(context) and context[start:end] == text:
    return
  there = (f"the context holds {context[start:end]!r} there"
           if 0 <= start and end <= len(context) else
           f"that runs outside the context ({len(context)} characters)")
  found = context.find(text)
  hint = (f"{text!r} first occurs at {found}" if found >= 0
          else f"{text!r} does not occur in the context")
  raise ValueError(f"{question} gives the answer {text!r} at answer_start {start}, but "
                   f"{there}; answer_start counts the context's characters from 0 "
                   f"({hint}), so set it to where the answer's text starts, or fix "
                   "the text.")


def _conll_rows(path: str, text: str, labelled: bool = True) -> list[dict[str, Any]]:
  """Sentences of a CoNLL file; unless ``labelled``, every line may be the
  word alone, and such a sentence gets ``tags`` None."""
  rows, words, tags = [], [], []
  for n, line in enumerate(text.splitlines() + [""], 1):
    cols = line.split()
    if not cols or cols[0] == "-DOCSTART-":
      if words:
        rows.append({"words": words, "tags": None if None in tags else tags})
      words, tags = [], []
      continue
    if len(cols) < 2 and labelled:
      raise ValueError(f"{path} line {n} has one column ({cols[0]!r}); a CoNLL line is "
                       "the word first and its tag last, with a blank line between "
                       "sentences.")
    words.append(cols[0])
    tags.append(cols[-1] if len(cols) > 1 else None)
  return rows


def _local_rows(path: str, labelled: bool = True) -> tuple[str, list[dict[str, Any]]]:
  """(kind-less format, rows) of one local file, by its extension."""
  lower = path.lower()
  if lower.endswith((".csv", ".tsv")):
    return "table", _table_rows(path, _read(path), lower.endswith(".tsv"))
  if lower.endswith(".jsonl"):
    return "table", _jsonl_rows(path, _read(path))
  if lower.endswith(".json"):
    return "qa", _squad_rows(path, _read(path))
  if lower.endswith((".conll", ".txt")):
    return "tagging", _conll_rows(path, _read(path), labelled)
  if not epath.Path(path).exists():  # a missing file is named as such first
    _read(path)
  raise ValueError(f"Cannot read {path}: use .csv, .tsv, .jsonl, .json (SQuAD) or "
                   ".conll files.")


def _local_split(files: str, labelled: bool = True) -> tuple[str, list[dict[str, Any]]]:
  """(format, rows) of comma-separated ``files``; each table row remembers its
  file under ``SOURCE`` so that a bad value can be reported with it."""
  kinds, rows = set(), []
  for path in [p.strip() for p in files.split(",") if p.strip()]:
    kind, part = _local_rows(path, labelled)
    kinds.add(kind)
    rows += [{**r, SOURCE: path} for r in part] if kind == "table" else part
  if not rows:
    flags = ("--config.train_files and --config.eval_files" if labelled
             else "--config.predict_files")
    raise ValueError(f"No examples in {files!r}; set {flags} to non-empty files.")
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
    number = None if isinstance(value, bool) else float(value)  # JSON's true is no number
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


def _class_name(row: dict[str, Any], config, labelled: bool) -> str | None:
  """The class of a local table row: its label as text, without the spaces
  around it (a CSV written "text, label"); None for a row to predict that has
  none. ValueError for an empty label, which used to become a class "", and for
  a JSON list or object."""
  value = row.get(config.label_field)
  if isinstance(value, (list, dict)):
    raise ValueError(
        f"{_where(row)} has the label {_json(value)} in column {config.label_field!r}, a "
        f"JSON {'list' if isinstance(value, list) else 'object'}; a label is a string, a "
        "number or true/false.")
  name = "" if value is None else str(value).strip()
  if name or not labelled:
    return name or None
  raise ValueError(f"{_where(row)} has no label in column {config.label_field!r}; give "
                   "every row its label, or leave the row out.")


def _written(value) -> str:
  """How a label is written. str() makes each way a class of its own (1 is
  "1", 1.0 is "1.0", true is "True"), so a split writes all of its labels one way."""
  if isinstance(value, bool):
    return "true/false"
  if isinstance(value, int):
    return "a whole number"
  return "a number with a decimal point" if isinstance(value, float) else "a string"


def _json(value) -> str:
  return json.dumps(value, ensure_ascii=False)


def _check_written_alike(rows: list[dict[str, Any]], field: str):
  """ValueError at the first row whose label is written another way than the
  first row's (``_written``; a CSV cell is a string)."""
  first = rows[0]
  for r in rows[1:]:
    if _written(r[field]) != _written(first[field]):
      there = f"line {first[LINE]}" if first[SOURCE] == r[SOURCE] else _where(first)
      raise ValueError(
          f"{_where(r)} has the label {_json(r[field])} ({_written(r[field])}) in column "
          f"{field!r}, where {there} has {_json(first[field])} ({_written(first[field])}); "
          "write every label the same way (all strings, all whole numbers or all "
          "true/false), as each way of writing one is a class of its own.")


def _table_examples(rows, config, labelled: bool = True) -> list[dict[str, Any]]:
  """Examples of table rows; unless ``labelled``, the label column may be
  missing or empty (``label`` None)."""
  fields = [f.strip() for f in config.text_fields.split(",") if f.strip()]
  if not 1 <= len(fields) <= 2:
    raise ValueError("--config.text_fields names one or two columns, e.g. "
                     "'sentence' or 'sentence1,sentence2'.")
  if config.label_field in fields:
    # The model would read the answer it is asked for.
    raise ValueError(f"--config.text_fields={config.text_fields!r} names the label column "
                     f"{config.label_field!r}; name only the text columns there, or set "
                     "--config.label_field to the column that holds the labels.")
  regression = config.task_kind == "regression"
  needed = fields + [config.label_field] if labelled else fields
  out, seen = [], set()
  for r in rows:
    columns = [c for c in r if c not in (SOURCE, LINE)]
    missing = [f for f in needed if f not in columns]
    if missing:
      # A table's header is its first row's columns: name the file then.
      place = _where(r) if r[SOURCE] in seen else r[SOURCE]
      raise ValueError(f"{place} has no column {missing[0]!r} (it has "
                       f"{', '.join(columns)}); set --config.text_fields / "
                       "--config.label_field.")
    empty = [f for f in needed if r[f] is None]
    if empty:
      raise ValueError(f"{_where(r)} has no value (null) in column {empty[0]!r}; give "
                       "every row its text and label.")
    label = r.get(config.label_field)
    if label in (None, "") and not labelled:
      label = None
    elif regression:
      label = _number(r, config)
    else:
      label = _class_name(r, config, labelled)
    seen.add(r[SOURCE])
    ex = {"text_a": str(r[fields[0]]), "label": label, SOURCE: _where(r)}
    if len(fields) == 2:
      ex["text_b"] = str(r[fields[1]])
    out.append(ex)
  if labelled and not regression:
    _check_written_alike(rows, config.label_field)
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


def load(config) -> Task:
  if not config.train_files or not config.eval_files:
    raise ValueError("task 'local' reads --config.train_files and --config.eval_files; "
                     "set both.")
  fmt, train = _local_split(config.train_files)
  eval_fmt, evals = _local_split(config.eval_files)
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


_FORMATS = {"classification": "table", "regression": "table", "tagging": "tagging",
            "qa": "qa"}


def unlabelled(path: str, config, task: Task) -> list[dict[str, Any]]:
  """Examples of one file to predict, for ``task``: in its training files'
  format, labels, answers and tags optional. A label, answers or tags that
  are given are kept as ``gold`` (class names stay names); the fields the
  features need get placeholders (class 0, no answer, the first tag)."""
  fmt, rows = _local_split(path, labelled=False)
  if fmt != _FORMATS[task.kind]:
    kinds = {"table": "a table (.csv, .tsv, .jsonl)", "qa": "SQuAD (.json)",
             "tagging": "CoNLL (.conll)"}
    raise ValueError(f"--config.predict_files {path} is {kinds[fmt]}, but this is a "
                     f"{task.kind} task, whose files are {kinds[_FORMATS[task.kind]]}; "
                     "give files of that format.")
  if task.kind == "qa":
    return [{**r, "gold": r["answers"] or None} for r in rows]
  if task.kind == "tagging":
    return [{"words": r["words"], "tags": [task.label_names[0]] * len(r["words"]),
             "gold": r["tags"]} for r in rows]
  out = []
  for ex in _table_examples(rows, config, labelled=False):
    del ex[SOURCE]
    gold = ex["label"]
    ex["gold"] = None if gold is None else (
        float(gold) if task.kind == "regression" else str(gold))
    ex["label"] = 0.0 if task.kind == "regression" else 0
    out.append(ex)
  return out

"""The user's task files (``bertjax/finetune/local_files.py``): values that
used to be trained on silently as something else are refused with their file
and place, before any work; no model is needed."""

import json
import re

import pytest

from bertjax import config_files
from bertjax.finetune import loop
from bertjax.finetune import tasks as tasks_lib


def _local(tmp_path, train: str, evals: str, train_name: str, eval_name: str, **overrides):
  (tmp_path / train_name).write_text(train)
  (tmp_path / eval_name).write_text(evals)
  c = config_files.shipped("finetune").get_config("local")
  c.train_files, c.eval_files = str(tmp_path / train_name), str(tmp_path / eval_name)
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _squad(*qas, context="The answer is apple pie.") -> str:
  return json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [
      {"id": f"q{n}", "question": "What is it?", "answers": answers}
      for n, answers in enumerate(qas, 1)]}]}]})


_RIGHT = [{"text": "apple pie", "answer_start": 14}]


@pytest.mark.parametrize("answers,message", [
    # Both used to train as "no answer" ([CLS]): the span covered other
    # characters, or none of the context.
    ([{"text": "banana", "answer_start": 4}],
     r"gives the answer 'banana' at answer_start 4, but the "
     r"context holds 'answer' there; answer_start counts the context's characters "
     r"from 0 \('banana' does not occur in the context\)"),
    ([{"text": "apple", "answer_start": 500}],
     r"gives the answer 'apple' at answer_start 500, but that "
     r"runs outside the context \(24 characters\); answer_start counts the context's "
     r"characters from 0 \('apple' first occurs at 14\)"),
    # Off by one: a prefix of the answer's span is held, not the answer.
    ([{"text": "apple", "answer_start": 13}], r"context holds ' appl' there"),
    # Whitespace counts: SQuAD's own offsets match the context exactly.
    ([{"text": "apple  pie", "answer_start": 14}], r"context holds 'apple pie.' there"),
    ([{"text": "apple", "answer_start": -1}], r"runs outside the context"),
    # A second answer is checked as the first is.
    ([{"text": "apple", "answer_start": 14}, {"text": "pie", "answer_start": 14}],
     r"gives the answer 'pie' at answer_start 14, but the context holds 'app' there"),
    ([{"text": "", "answer_start": 0}],
     r"has an empty answer text; give the answer's text, or "
     r"\"answers\": \[\] for a question the context does not answer"),
    # int() used to read 14.5 as 14 and true as 1, silently.
    ([{"text": "apple", "answer_start": 14.5}], r"has answer_start 14\.5; answer_start is a whole"),
    ([{"text": "apple", "answer_start": True}], r"has answer_start True; answer_start is a whole"),
], ids=["other_text", "past_the_end", "off_by_one", "whitespace", "negative",
        "second_answer", "empty_text", "fraction", "boolean"])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_squad_answer_not_at_its_answer_start_is_refused(tmp_path, answers, message, split):
  bad, good = _squad(_RIGHT, answers), _squad(_RIGHT)
  config = _local(tmp_path, bad if split == "train" else good,
                  good if split == "train" else bad, "train.json", "dev.json")
  name = "train.json" if split == "train" else "dev.json"
  with pytest.raises(ValueError, match=(
      rf"^{re.escape(str(tmp_path / name))} question 2 \(id 'q2'\) .*{message}")):
    tasks_lib.load(config)


def test_squad_files_whose_offsets_match_are_read_as_they_are(tmp_path):
  # SQuAD 2.0's layout: a context that starts with whitespace (kept, as the
  # offsets count it), an unanswerable question, several answers.
  context = "  Paris is in France.\n\nRome  is in Italy."
  unanswerable = {"id": "u", "question": "Where is Oslo?", "answers": [],
                  "plausible_answers": [{"text": "Italy", "answer_start": 99}],
                  "is_impossible": True}
  squad = json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [
      {"id": "a", "question": "Where is Paris?", "is_impossible": False, "answers": [
          {"text": "France", "answer_start": 14}, {"text": "in France", "answer_start": 11}]},
      {"id": "b", "question": "Which Rome?", "answers": [
          {"text": "Rome  is", "answer_start": 23}]},
      unanswerable]}]}]})
  task = tasks_lib.load(_local(tmp_path, squad, squad, "train.json", "dev.json"))
  assert [(ex["answers"], ex["answer_start"]) for ex in task.train] == [
      (["France", "in France"], 14), (["Rome  is"], 23), ([], -1)]
  assert task.unanswerable


def test_an_unanswerable_question_with_answers_is_refused(tmp_path):
  # "is_impossible": true with answers used to train as answered (the flag was
  # not read); the two contradict each other, so neither is guessed at.
  squad = json.loads(_squad(_RIGHT, _RIGHT))
  squad["data"][0]["paragraphs"][0]["qas"][1]["is_impossible"] = True
  config = _local(tmp_path, json.dumps(squad), _squad(_RIGHT), "train.json", "dev.json")
  with pytest.raises(ValueError, match=(
      rf"^{re.escape(str(tmp_path / 'train.json'))} question 2 \(id 'q2'\) is marked "
      r'"is_impossible": true but has answers; .* so empty its answers or set '
      r'"is_impossible": false\.$')):
    tasks_lib.load(config)


def test_a_bad_answer_start_is_refused_before_the_init_is_read(tmp_path):
  config = _local(tmp_path, _squad([{"text": "apple", "answer_start": 500}]),
                  _squad(_RIGHT), "train.json", "dev.json")
  with pytest.raises(ValueError, match=r"train\.json question 1 \(id 'q1'\) gives the answer"):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()


def _jsonl(*labels) -> str:
  return "".join(json.dumps({"sentence": f"row {n}", "label": label}) + "\n"
                 for n, label in enumerate(labels, 1))


_WORDS = "sentence,label\na cat,pos\na dog,neg\n"


@pytest.mark.parametrize("train,evals,names,message", [
    # An empty label cell used to become the class "" (the eval files
    # refused it only as a label the train files lack).
    ("sentence,label\nhello there,pos\nbye now,neg\nno label here,\n", _WORDS,
     ("train.csv", "dev.csv"), r"train\.csv line 4 has no label in column 'label'"),
    ("sentence\tlabel\nhello\tpos\nbye\tneg\nblank\t \n", "sentence\tlabel\nhi\tpos\n",
     ("train.tsv", "dev.tsv"), r"train\.tsv line 4 has no label in column 'label'"),
    (_jsonl("pos", "neg", ""), _jsonl("pos"), ("train.jsonl", "dev.jsonl"),
     r"train\.jsonl line 3 has no label in column 'label'; give every row its label"),
    (_WORDS, "sentence,label\nfine,pos\nodd,\n", ("train.csv", "dev.csv"),
     r"dev\.csv line 3 has no label in column 'label'"),
    # JSON labels written several ways used to become one class per way:
    # 1, 0, 1.0, true gave "1", "0", "1.0", "True".
    (_jsonl(1, 0, 1.0, True), _jsonl(1, 0), ("train.jsonl", "dev.jsonl"),
     r"train\.jsonl line 3 has the label 1\.0 \(a number with a decimal point\) in "
     r"column 'label', where line 1 has 1 \(a whole number\); write every label the "
     r"same way \(all strings, all whole numbers or all true/false\)"),
    (_jsonl("pos", "neg", True), _jsonl("pos"), ("train.jsonl", "dev.jsonl"),
     r"train\.jsonl line 3 has the label true \(true/false\) in column 'label', where "
     r"line 1 has \"pos\" \(a string\)"),
    (_jsonl(1, 0), _jsonl(1, "0"), ("train.jsonl", "dev.jsonl"),
     r"dev\.jsonl line 2 has the label \"0\" \(a string\) in column 'label', where "
     r"line 1 has 1 \(a whole number\)"),
    (_jsonl("pos", ["neg"]), _jsonl("pos"), ("train.jsonl", "dev.jsonl"),
     r"train\.jsonl line 2 has the label \[\"neg\"\] in column 'label', a JSON list; "
     r"a label is a string, a number or true/false"),
], ids=["empty_csv", "blank_tsv", "empty_jsonl", "empty_in_eval", "int_float_bool",
        "string_bool", "int_string_in_eval", "list"])
def test_label_cells_that_would_become_classes_of_their_own_are_refused(
    tmp_path, train, evals, names, message):
  with pytest.raises(ValueError, match=message):
    tasks_lib.load(_local(tmp_path, train, evals, *names))


def test_labels_of_one_class_written_apart_are_refused_across_files(tmp_path):
  (tmp_path / "more.jsonl").write_text(_jsonl(0.0, 1.0))
  config = _local(tmp_path, _jsonl(1, 0), _jsonl(1, 0), "train.jsonl", "dev.jsonl")
  config.train_files += f",{tmp_path / 'more.jsonl'}"
  with pytest.raises(ValueError, match=(
      rf"^{re.escape(str(tmp_path / 'more.jsonl'))} line 1 has the label 0\.0 \(a number "
      rf"with a decimal point\) in column 'label', where "
      rf"{re.escape(str(tmp_path / 'train.jsonl'))} line 1 has 1 \(a whole number\)")):
    tasks_lib.load(config)


def test_labels_written_one_way_are_classes_and_regression_reads_numbers(tmp_path):
  # Spaces around a label cell (a CSV written "text, label") are not part of it.
  task = tasks_lib.load(_local(tmp_path, "sentence,label\na, pos\nb,neg\nc,pos \n",
                               _WORDS, "train.csv", "dev.csv"))
  assert task.label_names == ("neg", "pos")
  assert [ex["label"] for ex in task.train] == [1, 0, 1]
  for train, evals, names in [((0, 1, 0), (1, 0), ("0", "1")),
                              ((0.0, 1.0), (1.0,), ("0.0", "1.0")),
                              ((True, False), (True,), ("False", "True")),
                              ((1, 0), ("1", "0"), ("0", "1"))]:
    task = tasks_lib.load(_local(tmp_path, _jsonl(*train), _jsonl(*evals),
                                 "train.jsonl", "dev.jsonl"))
    assert task.label_names == names
  # Regression reads numbers; true is not one.
  with pytest.raises(ValueError, match=r"has the label True in column 'label' \(line 3\)"):
    tasks_lib.load(_local(tmp_path, _jsonl(0.5, 2, True), _jsonl(1.5), "train.jsonl",
                          "dev.jsonl", task_kind="regression"))
  task = tasks_lib.load(_local(tmp_path, _jsonl(0.5, 2, "3"), _jsonl(1.5), "train.jsonl",
                               "dev.jsonl", task_kind="regression"))
  assert [ex["label"] for ex in task.train] == [0.5, 2.0, 3.0]


def test_an_empty_label_is_refused_before_the_init_is_read(tmp_path):
  config = _local(tmp_path, "sentence,label\nhello there,pos\nbye now,neg\nno label here,\n",
                  _WORDS, "train.csv", "dev.csv")
  with pytest.raises(ValueError, match=r"train\.csv line 4 has no label"):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()

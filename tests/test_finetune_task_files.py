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
], ids=["other_text", "past_the_end", "off_by_one", "whitespace", "negative",
        "second_answer", "empty_text"])
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


def test_a_bad_answer_start_is_refused_before_the_init_is_read(tmp_path):
  config = _local(tmp_path, _squad([{"text": "apple", "answer_start": 500}]),
                  _squad(_RIGHT), "train.json", "dev.json")
  with pytest.raises(ValueError, match=r"train\.json question 1 \(id 'q1'\) gives the answer"):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()

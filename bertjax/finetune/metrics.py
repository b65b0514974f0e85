"""Fine-tuning metrics with their standard definitions.

Classification, regression and tagging scores come from scikit-learn, scipy
and seqeval (the ``finetune`` extra). SQuAD's exact match and F1 have no
offline library, so they are written here after the official evaluation
script's definitions: answers are compared after lower-casing, removing
punctuation and the articles a/an/the, and collapsing whitespace; F1 is the
bag-of-tokens overlap; each prediction takes its best score over the gold
answers; both are reported in percent, as SQuAD does.
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

"""Fine-tuning metrics against hand-computed cases, and QA windows/decoding
(issue 16, items 1 and 3)."""

import numpy as np
import pytest

from bertjax.finetune import metrics
from bertjax.finetune import qa


def test_classification_metrics_by_hand():
  # TP=2 (0, 3), FP=1 (4), FN=1 (2), TN=1 (1).
  got = metrics.classification([1, 0, 1, 1, 0], [1, 0, 0, 1, 1], num_classes=2)
  assert got["accuracy"] == pytest.approx(0.6)
  assert got["f1"] == pytest.approx(4 / 6)  # 2TP / (2TP + FP + FN)
  # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 1 / sqrt(36)
  assert got["matthews_corr"] == pytest.approx(1 / 6)
  three = metrics.classification([0, 1, 2, 2], [0, 1, 1, 2], num_classes=3)
  # per-class F1: 1, 2/3 (P 1/2, R 1), 2/3 (P 1, R 1/2) -> macro 7/9
  assert three["macro_f1"] == pytest.approx(7 / 9)


def test_regression_metrics_by_hand():
  got = metrics.regression([1, 2, 3], [1, 3, 2])
  # centred: (-1, 0, 1) . (-1, 1, 0) = 1 over sqrt(2 * 2)
  assert got["pearson"] == pytest.approx(0.5)
  assert got["spearman"] == pytest.approx(0.5)
  assert got["mse"] == pytest.approx(2 / 3)
  assert metrics.regression([1, 2, 3, 4], [1, 8, 27, 64])["spearman"] == pytest.approx(1.0)
  assert metrics.regression([1, 2, 3, 4], [4, 3, 2, 1])["pearson"] == pytest.approx(-1.0)


def test_entity_level_f1_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-LOC"]]
  got = metrics.tagging(gold, pred)
  # gold entities PER, LOC, ORG; predicted PER, ORG, LOC(wrong place): 2 of 3 each way.
  assert got["entity_precision"] == pytest.approx(2 / 3)
  assert got["entity_recall"] == pytest.approx(2 / 3)
  assert got["entity_f1"] == pytest.approx(2 / 3)
  # A partly matching entity is a miss, not a partial hit.
  assert metrics.tagging([["B-PER", "I-PER"]], [["B-PER", "O"]])["entity_f1"] == 0.0
  assert got["token_accuracy"] == pytest.approx(4 / 6)


def test_squad_normalisation_articles_punctuation_whitespace():
  assert metrics.normalize_answer("The  Cat!") == "cat"
  assert metrics.normalize_answer("an apple,\ta pear.") == "apple pear"
  assert metrics.normalize_answer("theory") == "theory"  # 'the' only as a word
  assert metrics.exact_match("the Eiffel Tower.", "Eiffel  tower") == 1.0
  assert metrics.exact_match("Eiffel", "Eiffel Tower") == 0.0
  # pred {cat, sat, on, mat}, gold {cat, on, mat}: P 3/4, R 1.
  assert metrics.token_f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
  assert metrics.token_f1("dog", "cat") == 0.0
  assert metrics.token_f1("cat cat", "cat") == pytest.approx(2 / 3)  # counts, not sets


def test_squad_takes_the_best_gold_answer_and_reports_percent():
  got = metrics.squad([["Paris", "the city of Paris"], ["blue"], ["big red car"]],
                      ["the paris", "red", "red car"])
  assert got["exact_match"] == pytest.approx(100 / 3)
  # F1 per question: 1, 0, 2 * (1 * 2/3) / (1 + 2/3) = 0.8
  assert got["f1"] == pytest.approx(100 * 1.8 / 3)


def test_squad_v2_scores_no_answer_by_hand():
  golds = [["Paris"], [], ["blue sky"], []]
  spans = ["paris", "london", "sky", "x"]
  margins = [-2.0, 1.0, 0.5, -1.0]
  got = metrics.squad_v2(golds, spans, margins, threshold=0.0)
  # Margins above 0 get "no answer": questions 2 (right) and 3 (wrong); 1 and 4
  # keep their spans: 1 is right, 4 answers an unanswerable question (wrong).
  assert got["exact_match"] == pytest.approx(50.0) and got["f1"] == pytest.approx(50.0)
  assert got["has_answer_exact_match"] == pytest.approx(50.0)
  assert got["no_answer_exact_match"] == pytest.approx(50.0)
  assert (got["has_answer_count"], got["no_answer_count"]) == (2, 2)
  assert got["answerability_accuracy"] == pytest.approx(0.5)
  # Threshold -2: only question 1 keeps its span; 2, 3, 4 get "no answer",
  # right for 2 and 4: 3 of 4. Threshold 0.5 adds question 3's span ("sky"
  # against "blue sky": F1 2/3) but gives question 4 its wrong span: 2 + 2/3.
  assert got["best_exact_match"] == pytest.approx(75.0)
  assert got["best_f1"] == pytest.approx(75.0)
  assert got["best_exact_match_threshold"] == -2.0 and got["best_f1_threshold"] == -2.0
  at_best = metrics.squad_v2(golds, spans, margins, threshold=-2.0)
  assert at_best["exact_match"] == pytest.approx(75.0)
  assert metrics.squad_v2(golds, spans, margins, 0.5)["f1"] == pytest.approx(100 * (2 + 2 / 3) / 4)


def test_squad_v2_best_threshold_is_the_best_of_every_threshold():
  rng = np.random.default_rng(0)
  words = ["red", "blue", "green", "sky", "sea"]
  for trial in range(60):
    n = int(rng.integers(1, 12))
    golds = [[] if rng.random() < 0.4 else [" ".join(rng.choice(words, 2))]
             for _ in range(n)]
    spans = [" ".join(rng.choice(words, int(rng.integers(1, 3)))) for _ in range(n)]
    # Few distinct margins, so ties are common; now and then no legal span.
    margins = rng.integers(-3, 4, n).astype(float)
    margins[rng.random(n) < 0.1] = np.inf
    got = metrics.squad_v2(golds, spans, margins, threshold=0.0)
    finite = margins[np.isfinite(margins)]
    candidates = np.concatenate([finite, finite - 0.5, finite + 0.5, [-10.0, 10.0]])
    for name in ("exact_match", "f1"):
      scores = [metrics.squad_v2(golds, spans, margins, t)[name] for t in candidates]
      assert got[f"best_{name}"] == pytest.approx(max(scores)), trial
      again = metrics.squad_v2(golds, spans, margins, got[f"best_{name}_threshold"])
      assert again[name] == pytest.approx(got[f"best_{name}"]), trial
    none = np.where(np.isfinite(margins), margins > 0.0, True)
    assert got["answerability_accuracy"] == pytest.approx(
        np.mean(none == np.array([not g for g in golds])))


def test_no_answer_decoding_takes_the_lowest_cls_score_over_windows():
  # Two windows of one question; a span "b" in the second scores 2 + 2 = 4.
  context = "a b c"
  offsets = np.array([[-1, -1], [0, 1], [2, 3], [4, 5], [-1, -1]])
  mask = offsets[:, 0] >= 0
  starts = [np.array([3.0, 0, 0, 0, 0]), np.array([2.5, 0, 2.0, 0, 0])]
  ends = [np.array([2.0, 0, 0, 0, 0]), np.array([1.0, 0, 2.0, 0, 0])]
  # No-answer: the lower of 3 + 2 and 2.5 + 1.
  assert qa.no_answer_score(starts, ends) == 3.5
  feats = {"example": np.array([0, 0]), "context_mask": np.stack([mask, mask]),
           "offsets": np.stack([offsets, offsets])}
  logits = np.stack([np.stack(starts), np.stack(ends)], -1)
  example = [{"id": "q", "context": context, "answers": []}]
  config = {"max_answer_tokens": 3}

  class Config(dict):
    __getattr__ = dict.__getitem__
  spans, margins, records = qa.decode(example, feats, logits, Config(config),
                                      no_answer=True, threshold=0.0)
  assert spans == ["b"] and margins == [pytest.approx(-0.5)]
  assert records[0]["prediction"] == "b" and records[0]["best_span"] == "b"
  _, _, records = qa.decode(example, feats, logits, Config(config), no_answer=True,
                            threshold=-1.0)
  assert records[0]["prediction"] == "" and records[0]["no_answer_margin"] == -0.5
  # Without no-answer decoding the span is the prediction, whatever [CLS] says.
  spans, margins, records = qa.decode(example, feats, logits, Config(config),
                                      no_answer=False)
  assert records[0]["prediction"] == "b" and margins == [] and "best_span" not in records[0]


def _words(text):
  """A whitespace 'tokenizer': ids and character offsets of each word."""
  import re
  spans = [m.span() for m in re.finditer(r"\S+", text)]
  return np.arange(10, 10 + len(spans), dtype=np.int32), np.asarray(spans, np.int32)


def test_windows_cover_every_answer_and_decode_back_to_its_characters():
  context = " ".join(f"w{i}" * (1 + i % 3) for i in range(60))
  ids, offsets = _words(context)
  question = np.array([7, 8, 9], np.int32)
  for first in range(0, 59, 1):
    last = first + 1  # two-word answers, many across window edges
    begin, end = int(offsets[first, 0]), int(offsets[last, 1])
    rows = qa.windows(0, question, ids, offsets, (begin, end), seq_len=24,
                      doc_stride=7, max_query_tokens=64)
    assert len(rows) > 2  # the context really is split
    inside = [r for r in rows if r.start > 0]
    assert inside, first
    for r in inside:
      assert r.context_mask[r.start] and r.context_mask[r.end] and r.start <= r.end
    # Logits peaked at the gold tokens of one window that holds the answer.
    s_log = [np.zeros(24) for _ in rows]
    e_log = [np.zeros(24) for _ in rows]
    k = max(i for i, r in enumerate(rows) if r.start > 0)
    s_log[k][rows[k].start] = 10.0
    e_log[k][rows[k].end] = 10.0
    b, e, _ = qa.best_span(s_log, e_log, [r.context_mask for r in rows],
                           [r.offsets for r in rows], max_answer_tokens=5)
    assert context[b:e] == context[begin:end]


def test_decoding_is_always_a_legal_span_and_the_best_one():
  rng = np.random.default_rng(0)
  for _ in range(200):
    n, windows = 12, int(rng.integers(1, 4))
    masks, offs, s_log, e_log = [], [], [], []
    for _ in range(windows):
      mask = np.zeros(n, bool)
      lo = int(rng.integers(1, 6))
      mask[lo:lo + int(rng.integers(1, n - lo))] = True
      off = np.full((n, 2), -1)
      starts = np.cumsum(rng.integers(1, 4, n)) * 3
      off[mask] = np.stack([starts, starts + 2], -1)[mask]
      masks.append(mask)
      offs.append(off)
      s_log.append(rng.normal(size=n) * 5)
      e_log.append(rng.normal(size=n) * 5)
    max_len = int(rng.integers(1, 5))
    b, e, score = qa.best_span(s_log, e_log, masks, offs, max_len)
    # Brute force over all legal pairs.
    legal = [(s_log[w][i] + e_log[w][j], offs[w][i, 0], offs[w][j, 1])
             for w in range(windows) for i in range(n) for j in range(n)
             if masks[w][i] and masks[w][j] and i <= j and j - i < max_len]
    best = max(legal)
    assert score == pytest.approx(best[0])
    assert (b, e) == (best[1], best[2])
    assert b < e  # never reversed, never an empty or outside span


def test_word_limit_keeps_the_answer_inside_one_word():
  # Pieces "cat" "alog" | "page" "s." with their offsets, between [CLS] and [SEP].
  context = "catalog pages."
  offsets = np.array([[-1, -1], [0, 3], [3, 7], [8, 12], [12, 14], [-1, -1]])
  mask = offsets[:, 0] >= 0
  np.testing.assert_array_equal(qa.word_index(context, offsets), [-1, 0, 0, 1, 1, -1])
  s_log = np.array([0, 5.0, 0, 0.5, 0, 0])
  e_log = np.array([0, 0, 1.0, 5.0, 0, 0])
  # Without a word limit the best pair is start 1 + end 3 = 10, two words.
  b, e, score = qa.best_span([s_log], [e_log], [mask], [offsets], 8)
  assert (context[b:e], score) == ("catalog page", 10.0)
  # Inside one word: (1, 2) = 6 beats (3, 3) = 5.5 and (1, 1) = 5.
  b, e, score = qa.best_span([s_log], [e_log], [mask], [offsets], 8, context=context,
                             max_answer_words=1)
  assert (context[b:e], score) == ("catalog", 6.0)
  e_log[2] = -5.0  # now (3, 3) = 5.5 is the best one-word pair
  b, e, score = qa.best_span([s_log], [e_log], [mask], [offsets], 8, context=context,
                             max_answer_words=1)
  assert (context[b:e], score) == ("page", 5.5)
  with pytest.raises(ValueError, match="context"):
    qa.best_span([s_log], [e_log], [mask], [offsets], 8, max_answer_words=1)


def test_window_arguments_are_checked():
  ids, offsets = _words("a b c d e f")
  with pytest.raises(ValueError, match="doc_stride"):
    qa.windows(0, np.array([1]), ids, offsets, None, seq_len=8, doc_stride=9,
               max_query_tokens=4)
  with pytest.raises(ValueError, match="seq_len"):
    qa.windows(0, np.arange(10), ids, offsets, None, seq_len=8, doc_stride=1,
               max_query_tokens=10)


def test_layerwise_decay_factors_by_depth():
  from bertjax.finetune import layer_decay
  leaf = np.zeros((2, 3))
  params = {"encoder": {"embeddings": {"word_embeddings": {"embedding": leaf}},
                        "encoder": {"layer_0": {"k": leaf}, "layer_1": {"k": leaf}},
                        "pooler": {"kernel": leaf}},
            "head": {"out": {"kernel": leaf}}}
  f = layer_decay.layerwise_scales(params, 0.5)
  assert float(f["head"]["out"]["kernel"]) == 1.0
  assert float(f["encoder"]["encoder"]["layer_1"]["k"]) == 0.5  # top layer: decay^1
  assert float(f["encoder"]["encoder"]["layer_0"]["k"]) == 0.25
  assert float(f["encoder"]["embeddings"]["word_embeddings"]["embedding"]) == 0.125
  scanned = {"encoder": {"encoder": {"layers": {"k": np.zeros((3, 4, 4))}}}}
  g = layer_decay.layerwise_scales(scanned, 0.5)["encoder"]["encoder"]["layers"]["k"]
  assert np.asarray(g).reshape(-1).tolist() == [0.125, 0.25, 0.5]


@pytest.mark.parametrize("variant", ["bert", "albert", "deberta", "electra", "xlnet"])
def test_one_head_fits_every_encoder(variant):
  import jax
  from bertjax import config_files, models
  from bertjax.finetune import objective
  from bertjax.models import heads
  config = config_files.shipped(variant).get_config("tiny")
  config.seq_len = 16
  tokens = np.tile(np.array([[2, 9, 10, 11, 3, 12, 13, 3] + [0] * 8], np.int32), (2, 1))
  inputs = objective.model_inputs({"tokens": tokens, "segment_ids": np.zeros_like(tokens)})
  for kind, outputs, shape in (("sequence", 3, (2, 3)), ("token", 5, (2, 16, 5)),
                               ("span", 2, (2, 16, 2))):
    model = heads.build(models.get_model(config), kind, outputs)
    params = model.init(jax.random.key(0), inputs)["params"]
    assert set(params) == {"encoder", "head"}
    assert model.apply({"params": params}, inputs)["logits"].shape == shape

"""Tests of bertjax.data.packing: BERT sentence pairs and the row layout.

Documents here have token ids 5, 6, 7, ... in order (unique within a
document), so a segment's position in its document is read off its tokens and
"B continues A" is checked against the document, not against the packer's
own bookkeeping.
"""

import types

import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax.data import packing

FIRST = batch_lib.NUM_SPECIAL_TOKENS


def make_doc(sentence_lengths, rng, word_prob=0.6):
  """A document with tokens FIRST.. in order; sentences start words."""
  lengths = np.asarray(sentence_lengths, np.int32)
  n = int(lengths.sum())
  word_starts = rng.random(n) < word_prob
  word_starts[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
  return {"tokens": np.arange(FIRST, FIRST + n, dtype=np.int32),
          "word_starts": word_starts, "sentence_lengths": lengths}


def positions_of(segment):
  """Document offsets of a segment's tokens; asserts they are contiguous."""
  pos = np.asarray(segment.tokens) - FIRST
  np.testing.assert_array_equal(pos, np.arange(pos[0], pos[0] + len(pos)))
  return int(pos[0]), int(pos[-1]) + 1


def random_docs(rng, count, max_sentences=20, max_len=30):
  return [make_doc(rng.integers(1, max_len, rng.integers(1, max_sentences)), rng)
          for _ in range(count)]


def test_pair_row_layout_exact():
  rng = np.random.default_rng(0)
  a = packing.Segment(rng.integers(5, 100, 7).astype(np.int32), rng.random(7) < .5)
  b = packing.Segment(rng.integers(5, 100, 4).astype(np.int32), rng.random(4) < .5)
  row = packing.pair_row(a, b, 16)
  cls, sep, pad = batch_lib.CLS_ID, batch_lib.SEP_ID, batch_lib.PAD_ID
  want_tokens = [cls, *a.tokens, sep, *b.tokens, sep] + [pad] * 2
  np.testing.assert_array_equal(row["tokens"], want_tokens)
  np.testing.assert_array_equal(row["segment_ids"], [0] * 9 + [1] * 5 + [0] * 2)
  np.testing.assert_array_equal(row["positions"], np.arange(16))
  np.testing.assert_array_equal(row["doc_ids"], [1] * 14 + [0] * 2)
  special = np.zeros(16, bool)
  special[[0, 8, 13, 14, 15]] = True
  np.testing.assert_array_equal(row["special"], special)
  np.testing.assert_array_equal(
      row["word_starts"], [True, *a.word_starts, True, *b.word_starts, True] + [False] * 2)
  assert int(row["a_lengths"]) == 7 and int(row["b_lengths"]) == 4
  for name, value in row.items():
    assert np.dtype(value.dtype) == np.dtype(batch_lib.FIELDS[name][0]), name
    assert value.shape == batch_lib.field_shape(name, 1, 16)[1:], name


def test_pair_row_with_a_roberta_pair_template_has_two_separators():
  # <s> A </s></s> B </s>: both separators after A are special one-token
  # words of segment 0, B keeps segment 1.
  a = packing.Segment(np.arange(5, 8, dtype=np.int32), np.array([True, False, True]))
  b = packing.Segment(np.arange(9, 11, dtype=np.int32), np.array([True, False]))
  row = packing.pair_row(a, b, 10, separators=2)
  cls, sep, pad = batch_lib.CLS_ID, batch_lib.SEP_ID, batch_lib.PAD_ID
  np.testing.assert_array_equal(row["tokens"], [cls, 5, 6, 7, sep, sep, 9, 10, sep, pad])
  np.testing.assert_array_equal(row["segment_ids"], [0] * 6 + [1] * 3 + [0])
  np.testing.assert_array_equal(row["special"], [1, 0, 0, 0, 1, 1, 0, 0, 1, 1])
  np.testing.assert_array_equal(row["word_starts"], [1, 1, 0, 1, 1, 1, 1, 0, 1, 0])
  np.testing.assert_array_equal(row["doc_ids"], [1] * 9 + [0])
  assert int(row["a_lengths"]) == 3 and int(row["b_lengths"]) == 2
  with pytest.raises(ValueError, match="4 special tokens"):
    packing.pair_row(a, b, 8, separators=2)
  # The layout reads the count from the config and leaves room for it.
  rng = np.random.default_rng(4)
  config = types.SimpleNamespace(seq_len=16, short_seq_prob=0.0, pair_separators=2,
                                 get=lambda k, d=None: getattr(config, k, d))
  rows = [r for doc in random_docs(rng, 20)
          for r in packing.sentence_pair_rows(doc, config, rng)]
  assert rows and max(int(r["a_lengths"] + r["b_lengths"]) for r in rows) == 12
  for r in rows:
    assert r["tokens"][r["a_lengths"] + 1] == r["tokens"][r["a_lengths"] + 2] == sep
  from bertjax import config_files
  from bertjax import config_validation
  bad = config_files.shipped("bert").get_config("tiny")
  bad.pair_separators = 3
  with pytest.raises(ValueError, match="pair_separators=3 is invalid"):
    config_validation.validate(bad)


def test_pair_row_rejects_pairs_that_do_not_fit():
  seg = packing.Segment(np.full(6, 9, np.int32), np.ones(6, bool))
  empty = packing.Segment(np.zeros(0, np.int32), np.zeros(0, bool))
  with pytest.raises(ValueError, match="seq_len"):
    packing.pair_row(seg, seg, 14)
  with pytest.raises(ValueError):
    packing.pair_row(seg, empty, 32)


def test_untruncated_pairs_partition_the_document_at_sentence_boundaries():
  rng = np.random.default_rng(1)
  for _ in range(200):
    # Every sentence has >= 2 words so no chunk is skipped; seq_len so large
    # that nothing is truncated.
    lengths = rng.integers(2, 12, rng.integers(1, 15))
    doc = make_doc(lengths, rng)
    doc["word_starts"][np.cumsum(lengths) - lengths + 1] = True
    bounds = set(np.cumsum(lengths).tolist()) | {0}
    pairs = packing.pair_instances(doc, seq_len=512, short_seq_prob=0.3, rng=rng)
    covered = []
    for p in pairs:
      a0, a1 = positions_of(p.a)
      b0, b1 = positions_of(p.b)
      assert b0 == a1, "B must start right where A ends"
      assert a0 in bounds and b1 in bounds, "chunks are whole sentences"
      chunk_sentences = sum(1 for x in bounds if a0 < x < b1)
      if chunk_sentences:
        assert a1 in bounds, "a multi-sentence chunk splits between sentences"
      else:
        assert doc["word_starts"][b0], "a one-sentence chunk splits between words"
      covered.extend(range(a0, b1))
    assert covered == list(range(len(doc["tokens"])))


def test_pairs_fit_and_keep_word_starts():
  rng = np.random.default_rng(2)
  for doc in random_docs(rng, 150, max_len=60):
    for p in packing.pair_instances(doc, seq_len=40, short_seq_prob=0.1, rng=rng):
      assert len(p.a.tokens) >= 1 and len(p.b.tokens) >= 1
      assert len(p.a.tokens) + len(p.b.tokens) <= 37
      for seg in (p.a, p.b):
        start, end = positions_of(seg)
        assert seg.word_starts[0], "a segment always opens a word"
        np.testing.assert_array_equal(seg.word_starts[1:],
                                      doc["word_starts"][start + 1:end])
      assert positions_of(p.a)[1] <= positions_of(p.b)[0]


def test_one_word_document_gives_no_pair():
  rng = np.random.default_rng(3)
  doc = {"tokens": np.arange(5, 9, dtype=np.int32),
         "word_starts": np.array([True, False, False, False]),
         "sentence_lengths": np.array([4], np.int32)}
  assert packing.pair_instances(doc, seq_len=32, short_seq_prob=0.0, rng=rng) == []


def test_short_target_fraction_and_range():
  # One-token sentences: a non-final chunk stops exactly at its target length,
  # so the observed pair length is the drawn target (capped by max_tokens).
  rng = np.random.default_rng(4)
  seq_len, prob = 64, 0.1
  max_tokens = seq_len - 3
  lengths = []
  for _ in range(40):
    doc = make_doc(np.ones(4000, np.int32), rng)
    pairs = packing.pair_instances(doc, seq_len=seq_len, short_seq_prob=prob, rng=rng)
    lengths += [len(p.a.tokens) + len(p.b.tokens) for p in pairs[:-1]]
  lengths = np.asarray(lengths)
  assert len(lengths) > 2500
  short = lengths[lengths < max_tokens]
  # A short draw is uniform on [2, max_tokens]; one value in 60 equals max.
  want = prob * (1 - 1 / (max_tokens - 1))
  sigma = np.sqrt(want * (1 - want) / len(lengths))
  assert abs(len(short) / len(lengths) - want) < 5 * sigma
  assert short.min() >= 2
  # Uniform on [2, 60]: mean 31, sd 17; 5 standard errors of tolerance.
  assert abs(short.mean() - 31) < 5 * 17 / np.sqrt(len(short))


def test_truncation_cuts_longer_side_front_and_back():
  rng = np.random.default_rng(5)
  seq_len = 32
  fronts = backs = 0
  both_cut = 0
  for _ in range(400):
    # Long sentences force truncation of nearly every pair.
    doc = make_doc(rng.integers(20, 80, 4), rng)
    for p in packing.pair_instances(doc, seq_len=seq_len, short_seq_prob=0.0, rng=rng):
      a0, a1 = positions_of(p.a)
      b0, b1 = positions_of(p.b)
      la, lb = a1 - a0, b1 - b0
      if p.chunk_end - p.chunk_start > seq_len - 3:
        assert la + lb == seq_len - 3, "a long chunk is cut to exactly max_tokens"
      assert p.chunk_start <= a0 and a1 <= p.split <= b0 and b1 <= p.chunk_end
      cut_a = (a0 - p.chunk_start) + (p.split - a1)
      cut_b = (b0 - p.split) + (p.chunk_end - b1)
      fronts += (a0 - p.chunk_start) + (b0 - p.split)
      backs += (p.split - a1) + (p.chunk_end - b1)
      # BERT cuts the longer side, B on ties: each cut side was, before its
      # last cut, longer than (A) or as long as (B) the other side.
      if cut_a and cut_b:
        both_cut += 1
        assert la - lb in (0, 1)
      elif cut_a:
        assert la >= lb
      elif cut_b:
        assert lb >= la - 1
  total = fronts + backs
  assert both_cut > 50
  # Each removed token is a fair coin front/back; 5 sigma of a binomial.
  assert abs(fronts / total - 0.5) < 5 * 0.5 / np.sqrt(total)


def test_same_rng_same_pairs_and_seed_matters():
  doc = make_doc(np.random.default_rng(6).integers(3, 20, 30), np.random.default_rng(7))
  run = lambda seed: packing.pair_instances(
      doc, seq_len=48, short_seq_prob=0.5, rng=np.random.default_rng(seed))
  first, again, other = run(0), run(0), run(1)
  key = lambda ps: [(p.a_start, p.a_end, p.b_start, p.b_end) for p in ps]
  assert key(first) == key(again)
  assert key(first) != key(other)


def test_bad_layout_and_seq_len():
  with pytest.raises(ValueError, match="sentence_pairs"):
    packing.get_layout("full_sentences_typo")
  doc = make_doc([3, 3], np.random.default_rng(0))
  with pytest.raises(ValueError, match="seq_len"):
    packing.pair_instances(doc, seq_len=4, short_seq_prob=0.0,
                           rng=np.random.default_rng(0))


def test_inconsistent_document_is_rejected():
  doc = make_doc([3, 3], np.random.default_rng(0))
  doc["sentence_lengths"] = np.array([3, 4], np.int32)
  with pytest.raises(ValueError, match="sentence_lengths"):
    packing.pair_instances(doc, seq_len=32, short_seq_prob=0.0,
                           rng=np.random.default_rng(0))


def test_whole_sentence_chunks_keep_the_pair_junction():
  # Sentences of up to 40 tokens against a 61-token target: BERT's chunks
  # overshoot and get cut, often at the A|B junction; whole-sentence chunks
  # stop before the overflowing sentence, so a multi-sentence pair is never
  # truncated and B starts right where A ends.
  rng = np.random.default_rng(7)
  seq_len = 64
  junction_cut = {"bert": 0, "whole_sentences": 0}
  for _ in range(200):
    doc = make_doc(rng.integers(5, 40, 8), rng)
    bounds = set(np.concatenate([[0], np.cumsum(doc["sentence_lengths"])]).tolist())
    for mode in junction_cut:
      for p in packing.pair_instances(doc, seq_len=seq_len, short_seq_prob=0.0,
                                      rng=rng, chunking=mode):
        a0, a1 = positions_of(p.a)
        b0, b1 = positions_of(p.b)
        junction_cut[mode] += a1 != b0
        if mode == "whole_sentences":
          assert len(p.a.tokens) + len(p.b.tokens) <= seq_len - 3
          assert a1 == b0 == p.split
          assert a0 == p.chunk_start in bounds and b1 == p.chunk_end in bounds
  assert junction_cut["whole_sentences"] == 0
  assert junction_cut["bert"] > 50  # the test would notice BERT's cut


def test_unknown_pair_chunking_is_one_line_error():
  doc = make_doc([5, 5], np.random.default_rng(0))
  with pytest.raises(ValueError, match="--config.pair_chunking"):
    packing.pair_instances(doc, seq_len=32, short_seq_prob=0.0,
                           rng=np.random.default_rng(0), chunking="greedy")

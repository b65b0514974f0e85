"""The sentencepiece tokenizer: fixed special ids, round trips, word starts, determinism."""

import hashlib
import itertools
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax import batch
from bertjax.data import python_docs
from bertjax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def tok(demo_data):
  return demo_data.tokenizer()


@pytest.fixture(scope="module")
def validation_sentences(demo_data):
  """Held-out demo sentences (the tokenizer never saw them)."""
  source = tfds.builder_from_directory(os.path.join(
      demo_data.data_dir, "bertjax_python_docs", "1.0.0")).as_data_source("validation")
  sents = [s.decode() for i in range(len(source)) for s in source[i]["sentences"]]
  assert len(sents) > 500
  return sents


@pytest.fixture(scope="module")
def small_corpus():
  """~300 KB of sentences (the pydoc topics): quick to train small vocabularies on."""
  return [p for _, paras in python_docs.topic_documents() for p in paras]


def test_special_tokens_at_fixed_ids(tok, demo_config):
  assert tok.vocab_size == demo_config.vocab_size
  for i, piece in enumerate(batch.SPECIAL_TOKENS):
    assert tok.id_to_piece(i) == piece
    assert tok.piece_to_id(piece) == i
  assert (batch.PAD_ID, batch.UNK_ID, batch.CLS_ID, batch.SEP_ID, batch.MASK_ID) == (
      0, 1, 2, 3, 4)
  # Special tokens written in the text are just text: never their control ids.
  ids, _ = tok.encode("[CLS] a [MASK] b [SEP] c [PAD]")
  assert not set(ids.tolist()) & {batch.PAD_ID, batch.CLS_ID, batch.SEP_ID, batch.MASK_ID}


def test_fingerprint_is_sha256_of_model_file(tok, demo_data):
  with open(demo_data.tokenizer_path, "rb") as f:
    assert tok.fingerprint == hashlib.sha256(f.read()).hexdigest() == demo_data.fingerprint


def test_round_trip_and_word_starts(tok, validation_sentences):
  clean = 0
  for sentence in validation_sentences:
    ids, word_starts = tok.encode(sentence)
    assert ids.dtype == np.int32 and word_starts.dtype == np.bool_
    assert ids.shape == word_starts.shape
    assert ((ids >= 0) & (ids < tok.vocab_size)).all()
    pieces = [tok.id_to_piece(i) for i in ids]
    assert word_starts.tolist() == [p.startswith("\u2581") for p in pieces]
    if batch.UNK_ID in ids:
      continue
    clean += 1
    assert tok.decode(ids) == " ".join(sentence.split())
    # Exactly one word start per whitespace-separated word.
    assert int(word_starts.sum()) == len(sentence.split())
  # Unknown characters are rare in held-out English prose.
  assert clean >= 0.95 * len(validation_sentences)


def test_training_is_deterministic(tmp_path, small_corpus):
  a = tokenizer_lib.train(small_corpus, str(tmp_path / "a.model"), 400)
  b = tokenizer_lib.train(small_corpus, str(tmp_path / "b.model"), 400)
  assert a.vocab_size == 400
  assert a.fingerprint == b.fingerprint
  c = tokenizer_lib.train(small_corpus[1:], str(tmp_path / "c.model"), 400)
  assert c.fingerprint != a.fingerprint


def test_bpe_has_the_same_special_ids(tmp_path, small_corpus):
  bpe = tokenizer_lib.train(small_corpus, str(tmp_path / "bpe.model"), 300, "bpe")
  assert tokenizer_lib.model_type_of(bpe.path) == "bpe"
  assert bpe.vocab_size == 300
  assert [bpe.id_to_piece(i) for i in range(5)] == list(batch.SPECIAL_TOKENS)
  ids, _ = bpe.encode(small_corpus[0])
  assert ids.size and (ids >= batch.NUM_SPECIAL_TOKENS).all()


def test_vocab_too_large_for_corpus_says_what_to_do(tmp_path, small_corpus):
  with pytest.raises(ValueError, match=r"too small.*--config.vocab_size to at most \d+"):
    tokenizer_lib.train(itertools.islice(small_corpus, 40), str(tmp_path / "x.model"), 5000)
  assert not (tmp_path / "x.model").exists()


def test_bad_tokenizer_settings(tmp_path, small_corpus):
  with pytest.raises(ValueError, match="--config.tokenizer"):
    tokenizer_lib.train(small_corpus, str(tmp_path / "w.model"), 300, "wordpiece")
  with pytest.raises(ValueError, match="--config.vocab_size"):
    tokenizer_lib.train(small_corpus, str(tmp_path / "v.model"), 5)
  with pytest.raises(ValueError, match="does not exist"):
    tokenizer_lib.Tokenizer(str(tmp_path / "missing.model"))

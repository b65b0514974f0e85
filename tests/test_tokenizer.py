"""The sentencepiece tokenizer: fixed special ids, round trips, word starts, determinism."""

import hashlib
import itertools
import os

import numpy as np
import pytest
import sentencepiece as spm
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
  """~150 KB of sentences (the first 700 paragraphs of the pydoc topics):
  about a second to train a small vocabulary on."""
  return [p for _, paras in python_docs.topic_documents() for p in paras][:700]


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
    # Byte fallback: characters outside the vocabulary are bytes, never [UNK].
    assert batch.UNK_ID not in ids
    if tok.decode(ids) != " ".join(sentence.split()):
      continue  # NFKC normalisation changed a character
    clean += 1
    # Exactly one word start per whitespace-separated word.
    assert int(word_starts.sum()) == len(sentence.split())
  assert clean >= 0.95 * len(validation_sentences)


def test_training_is_deterministic(tmp_path, small_corpus):
  a = tokenizer_lib.train(small_corpus, str(tmp_path / "a.model"), 400)
  b = tokenizer_lib.train(small_corpus, str(tmp_path / "b.model"), 400)
  assert a.vocab_size == 400
  assert a.fingerprint == b.fingerprint
  c = tokenizer_lib.train(small_corpus[1:], str(tmp_path / "c.model"), 400)
  assert c.fingerprint != a.fingerprint


def test_repeated_sentences_are_trained_on_once(tmp_path, small_corpus):
  """A sentence given again after its first appearance changes nothing: the
  model is byte-identical to the one trained on each sentence once."""
  once = list(dict.fromkeys(small_corpus))
  assert len(once) > 600
  repeated = []
  for i, sentence in enumerate(once):
    repeated.append(sentence)
    if i % 2:
      repeated += [once[i // 2], ""]
  a = tokenizer_lib.train(once, str(tmp_path / "a.model"), 400)
  r = tokenizer_lib.train(repeated, str(tmp_path / "r.model"), 400)
  assert len(repeated) > 1.4 * len(once)
  assert r.fingerprint == a.fingerprint


def test_bpe_has_the_same_special_ids(tmp_path, small_corpus):
  bpe = tokenizer_lib.train(small_corpus, str(tmp_path / "bpe.model"), 400, "bpe")
  assert tokenizer_lib.model_type_of(bpe.path) == "bpe_bytes"
  assert bpe.vocab_size == 400
  assert [bpe.id_to_piece(i) for i in range(5)] == list(batch.SPECIAL_TOKENS)
  ids, _ = bpe.encode(small_corpus[0])
  assert ids.size and (ids >= batch.NUM_SPECIAL_TOKENS).all()


# Chinese and Arabic the English corpus never showed the tokenizer.
_UNSEEN = "Tokens 分词器不应丢失文字 and العربية أيضا, 汉字 then more English."


def test_unseen_scripts_fall_back_to_bytes(tmp_path, small_corpus):
  for kind in ("unigram", "bpe"):
    tok = tokenizer_lib.train(small_corpus, str(tmp_path / f"{kind}.model"), 400, kind)
    assert tok.byte_fallback
    ids, _ = tok.encode(_UNSEEN)
    pieces = [tok.id_to_piece(i) for i in ids]
    assert batch.UNK_ID not in ids
    # Every Han character of the text is 3 UTF-8 byte pieces, not one lump.
    assert sum(p.startswith("<0x") for p in pieces) >= 3 * 9
    assert tok.decode(ids) == _UNSEEN


def test_a_sentence_longer_than_sentencepiece_takes_still_trains_the_vocabulary(
    tmp_path, small_corpus):
  # sentencepiece's trainer silently skips a sentence over 4192 bytes: a
  # paragraph the splitter cannot cut (another script, a one-line file) used
  # to leave its words out of the vocabulary.
  # 18 KB, one "sentence": the word among random ones, so that the text's
  # pieces are not one string repeated (on which sentencepiece 0.2.2's seed
  # search takes 16 s instead of 2).
  rng = np.random.default_rng(0)
  letters = np.array(list("abcdefghiklmnoprstuw"))
  long = " ".join(f"zqxjv {''.join(rng.choice(letters, 6))}" for _ in range(1500))
  assert len(long.encode()) > 4192
  tok = tokenizer_lib.train(small_corpus[:200] + [long], str(tmp_path / "t.model"), 400)
  ids, _ = tok.encode("zqxjv zqxjv")
  assert [tok.id_to_piece(i) for i in ids] == ["\u2581zqxjv"] * 2


def test_tokenizer_without_byte_fallback_still_loads(tmp_path, small_corpus):
  """A model trained before byte fallback (same special ids) loads, as 'unigram'."""
  path = str(tmp_path / "old.model")
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(small_corpus), model_prefix=path[:-len(".model")],
      vocab_size=300, pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]",
      bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      minloglevel=2)
  old = tokenizer_lib.Tokenizer(path)
  assert not old.byte_fallback
  assert tokenizer_lib.model_type_of(path) == "unigram"
  assert tokenizer_lib.fits_config("unigram", "unigram")
  assert tokenizer_lib.fits_config("unigram_bytes", "unigram")
  assert not tokenizer_lib.fits_config("bpe", "bpe_bytes")
  ids, _ = old.encode(_UNSEEN)
  assert batch.UNK_ID in ids  # what byte fallback is for


def test_vocab_too_small_for_byte_pieces_says_what_to_do(tmp_path, small_corpus):
  with pytest.raises(ValueError, match=r"256 byte pieces.*--config.vocab_size to at least \d+"):
    tokenizer_lib.train(small_corpus, str(tmp_path / "x.model"), 300)
  assert not (tmp_path / "x.model").exists()


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


def test_an_interrupt_while_the_trainer_reads_is_not_an_empty_corpus(tmp_path):
  # Ctrl-C (or prepare's SIGTERM stop) while sentencepiece read the sample
  # came back as RuntimeError('INTERNAL: KeyboardInterrupt: <EMPTY MESSAGE>'),
  # reported as "The tokenizer's training corpus is empty" (exit status 2).
  def sentences():
    for i in range(1000):
      if i == 500:
        raise KeyboardInterrupt
      yield f"Sentence number {i} is here."
  with pytest.raises(KeyboardInterrupt):
    tokenizer_lib.train(sentences(), str(tmp_path / "t.model"), 400)
  assert not (tmp_path / "t.model").exists()

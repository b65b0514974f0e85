"""An imported byte-level BPE (RoBERTa's: no add_prefix_space) tokenizes a
document's sentences as transformers tokenizes its running text: a sentence
after another keeps the space before it ('\u0120Then', not 'mat.Then'), and
every sentence's first piece begins a word (masking's word units)."""

import types

import numpy as np
import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from bertjax.convert import hf_tokenizers  # noqa: E402
from bertjax.data import builders  # noqa: E402
from bertjax.data import tokenized  # noqa: E402

SENTENCES = ["The cat sat on the mat.", "Then the dog ran home.", "It slept."]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
  from tokenizers import ByteLevelBPETokenizer
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator([" ".join(SENTENCES)] * 5, vocab_size=300, min_frequency=1,
                          special_tokens=SPECIALS)
  path = tmp_path_factory.mktemp("roberta")
  bpe.save_model(str(path))
  fast = transformers.RobertaTokenizerFast(str(path / "vocab.json"),
                                           str(path / "merges.txt"))
  fast.save_pretrained(str(path))
  return path


@pytest.mark.parametrize("tokenizer_json", [True, False])
def test_sentences_tokenize_as_the_running_text(roberta_dir, tmp_path, tokenizer_json):
  path = roberta_dir
  if not tokenizer_json:  # vocab.json + merges.txt only (the slow tokenizer's files)
    path = tmp_path / "slow"
    path.mkdir()
    for f in roberta_dir.iterdir():
      if f.name != "tokenizer.json":
        (path / f.name).write_bytes(f.read_bytes())
  tok = hf_tokenizers.HfTokenizer(str(path))
  [(index, example)] = list(builders.tokenize_documents([("doc", SENTENCES)], tok))
  assert index == 0
  want = transformers.AutoTokenizer.from_pretrained(str(roberta_dir))(
      " ".join(SENTENCES), add_special_tokens=False)["input_ids"]
  np.testing.assert_array_equal(tok.to_hf_ids(example["tokens"]), want)
  lengths = example["sentence_lengths"]
  assert lengths.sum() == len(want) and len(lengths) == len(SENTENCES)
  firsts = np.cumsum(lengths) - lengths
  starts = example["word_starts"]
  assert starts[firsts].all(), starts
  pieces = [tok.id_to_piece(i) for i in example["tokens"]]
  assert [pieces[i] for i in firsts[1:]] == ["\u0120Then", "\u0120It"]
  # Elsewhere a word start is exactly a '\u0120' piece.
  marked = np.array([p.startswith("\u0120") for p in pieces])
  marked[0] = True
  np.testing.assert_array_equal(starts, marked)
  assert tok.sentence_prefix == " "


def test_empty_first_sentence_does_not_make_a_leading_space(roberta_dir):
  tok = hf_tokenizers.HfTokenizer(str(roberta_dir))
  [(_, example)] = list(builders.tokenize_documents([("d", [""] + SENTENCES[:1])], tok))
  want = transformers.AutoTokenizer.from_pretrained(str(roberta_dir))(
      SENTENCES[0], add_special_tokens=False)["input_ids"]
  np.testing.assert_array_equal(tok.to_hf_ids(example["tokens"]), want)


def test_wordpiece_needs_no_prefix(tmp_path):
  words = sorted({w for s in SENTENCES for w in s.replace(".", " .").split()})
  (tmp_path / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  tok = hf_tokenizers.HfTokenizer(str(tmp_path))
  assert tok.sentence_prefix == ""


def test_shards_of_the_old_bpe_encoding_are_not_reused(roberta_dir, monkeypatch):
  tok = hf_tokenizers.HfTokenizer(str(roberta_dir))
  # Shards published before sentence_prefix: same tokenizer fingerprint.
  info = types.SimpleNamespace(metadata={"tokenizer_fingerprint": tok.fingerprint},
                               splits={})
  monkeypatch.setattr(tokenized.staged, "is_published", lambda d: True)
  monkeypatch.setattr(tokenized.tfds, "builder_from_directory",
                      lambda d: types.SimpleNamespace(info=info))
  with pytest.raises(ValueError, match="space before it"):
    tokenized.prepare_shards(None, "/nonexistent", "x", tok, {"train": None}, None,
                             "", None)


@pytest.mark.parametrize("kind", ["albert", "xlnet", "deberta"])
def test_sentencepiece_imports_need_no_prefix(tmp_path, kind):
  """Their shards stay valid: each text already begins with a word mark."""
  pytest.importorskip("sentencepiece")
  from test_hf_sentencepiece_offsets import KINDS
  make, fast = KINDS[kind]
  slow_dir, fast_dir = tmp_path / "slow", tmp_path / "fast"
  slow_dir.mkdir()
  make(str(slow_dir))
  assert hf_tokenizers.HfTokenizer(str(slow_dir)).sentence_prefix == ""
  getattr(transformers, fast).from_pretrained(str(slow_dir)).save_pretrained(str(fast_dir))
  assert (fast_dir / "tokenizer.json").exists()
  assert hf_tokenizers.HfTokenizer(str(fast_dir)).sentence_prefix == ""


def test_pair_texts_read_as_transformers_reads_them_not_as_running_text(roberta_dir):
  """``Model.tokenize`` encodes each text of a pair alone, as transformers'
  tokenizer does ('The', 'n': no space before B), and fill_mask its text
  whole; only prepare's sentences of one document get the space before them.
  Deliberate: an import or export must read pairs as AutoTokenizer does."""
  from bertjax import api
  from bertjax import fill_mask
  from bertjax.convert import roberta
  tok = hf_tokenizers.HfTokenizer(str(roberta_dir))
  hf = transformers.AutoTokenizer.from_pretrained(str(roberta_dir))
  fields = roberta.model_fields(transformers.RobertaConfig(
      vocab_size=len(hf), hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
      intermediate_size=8, max_position_embeddings=66, type_vocab_size=1,
      pad_token_id=1).to_dict())
  model = api.Model(fields, None, tok)  # tokenize reads no params
  a, b = SENTENCES[:2]
  got = tok.to_hf_ids(model.tokenize([(a, b)])["tokens"][0])
  want = hf(a, b)["input_ids"]
  assert got.tolist() == want
  pieces = hf.convert_ids_to_tokens(want)
  assert pieces[pieces.index("</s>") + 2] == "The"  # B's first word, no '\u0120'
  masked, _ = fill_mask.mask_inputs(model, f"{a} [MASK] the dog ran home.")
  assert tok.to_hf_ids(masked["tokens"][0]).tolist() == hf(
      f"{a} <mask> the dog ran home.")["input_ids"]
  [(_, example)] = list(builders.tokenize_documents([("doc", [a, b])], tok))
  b_first = example["tokens"][example["sentence_lengths"][0]]
  assert tok.id_to_piece(int(b_first)) == "\u0120Then"

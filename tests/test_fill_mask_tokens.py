"""fill_mask feeds the model the ids transformers' fast tokenizer gives the
text with its own mask token in place (byte-level BPE, WordPiece,
sentencepiece), and shows each filling as the text it reads as."""

import os
import types

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")

CORPUS = ["The config sets the checkpoint on the mat.", "The cat sat on the mat.",
          "The checkpoint saves the config, and the run goes on."] * 5
TEXTS = ["The config [MASK] the checkpoint.", "[MASK] sets it.", "It ends on [MASK]",
         "The [MASK] [MASK] sat.", "  spaced   [MASK]  out ", "no space[MASK]here.",
         "The cat, [MASK]."]


def _roberta_dir(path, fast):
  """A byte-level BPE trained here, saved by RobertaTokenizer(Fast)."""
  from tokenizers import ByteLevelBPETokenizer
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  os.makedirs(path)
  bpe.save_model(path)
  cls = transformers.RobertaTokenizerFast if fast else transformers.RobertaTokenizer
  tok = cls(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"))
  tok.save_pretrained(path)
  assert os.path.exists(os.path.join(path, "tokenizer.json")) == fast
  return len(tok)


def _masked_ids(tokenizer, text):
  """The HF ids of [CLS] text [SEP] as bertjax's fill_mask feeds them."""
  from bertjax import fill_mask
  model = types.SimpleNamespace(tokenizer=tokenizer,
                                config={"max_position_embeddings": 512})
  inputs, where = fill_mask.mask_inputs(model, text)
  ids = inputs["tokens"][0]
  assert len(where) == text.count("[MASK]")
  return [int(i) for i in getattr(tokenizer, "to_hf_ids", lambda x: x)(ids)]


def _check_ids(tokenizer, hf_dir):
  hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
  assert hf.is_fast
  for text in TEXTS:
    want = hf(text.replace("[MASK]", hf.mask_token))["input_ids"]
    assert _masked_ids(tokenizer, text) == want, (hf_dir, text)


def test_masked_text_gets_the_fast_tokenizers_ids(tmp_path, demo_config, demo_data):
  from bertjax.convert import hf_tokenizers
  from bertjax.convert import spm_export
  # Byte-level BPE, from tokenizer.json and from the slow tokenizer's files:
  # 'The config <mask> the' reads ... 'Ġconfig', '<mask>', 'Ġthe'.
  for fast in (True, False):
    path = str(tmp_path / f"bpe_{fast}")
    _roberta_dir(path, fast)
    _check_ids(hf_tokenizers.HfTokenizer(path), path)
  with pytest.raises(ValueError, match="own mask token '<mask>' besides"):
    _masked_ids(hf_tokenizers.HfTokenizer(path), "A [MASK] and a <mask>.")
  # WordPiece (vocab.txt).
  words = sorted({w for t in CORPUS for w in t.replace(".", " .").replace(",", " ,").split()})
  wordpiece = tmp_path / "wordpiece"
  wordpiece.mkdir()
  (wordpiece / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  transformers.BertTokenizerFast(str(wordpiece / "vocab.txt")).save_pretrained(str(wordpiece))
  _check_ids(hf_tokenizers.HfTokenizer(str(wordpiece)), str(wordpiece))
  # Sentencepiece: bertjax's own, and its export read back by the import.
  exported = tmp_path / "spm"
  exported.mkdir()
  spm_export.write(demo_config.to_dict(), demo_data.tokenizer_path, str(exported))
  _check_ids(demo_data.tokenizer(), str(exported))
  _check_ids(hf_tokenizers.HfTokenizer(str(exported)), str(exported))


def test_roberta_fill_mask_matches_transformers_and_shows_text(tmp_path):
  from bertjax import api
  path = str(tmp_path / "hfr")
  vocab = _roberta_dir(path, fast=True)
  torch.manual_seed(0)
  config = transformers.RobertaConfig(
      vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=40, type_vocab_size=1)
  hf_model = transformers.RobertaForMaskedLM(config).eval()
  with torch.no_grad():  # larger weights: the scores tell inputs apart
    for p in hf_model.parameters():
      p.mul_(4.0)
  hf_model.save_pretrained(path)
  hf = transformers.AutoTokenizer.from_pretrained(path)
  model = api.load(path)
  text = "The config [MASK] the checkpoint."
  batch = hf(text.replace("[MASK]", hf.mask_token), return_tensors="pt")
  with torch.no_grad():
    logits = hf_model(**batch).logits[0].numpy()
  where = int(np.flatnonzero(batch["input_ids"][0].numpy() == hf.mask_token_id)[0])
  probs = np.exp(logits[where] - logits[where].max())
  probs /= probs.sum()
  probs[hf.all_special_ids] = -1.0  # never proposed
  want = np.argsort(-probs)[:5]
  got = model.fill_mask(text, top_k=5)[0]
  assert [int(model.tokenizer.to_hf_ids(p["token_id"])) for p in got] == want.tolist()
  assert np.allclose([p["score"] for p in got], probs[want], rtol=1e-4, atol=0)
  for p, i in zip(got, want):
    assert p["token"] == hf.convert_ids_to_tokens(int(i))  # the piece: 'Ġthe'
    assert p["text"] == hf.decode([int(i)])  # and what it reads as: ' the'

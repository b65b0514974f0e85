"""Character offsets of an imported sentencepiece tokenizer (ALBERT, XLNet,
DeBERTa-v2/v3 directories without a tokenizer.json): what extractive QA and
tagging map answers and word tags through."""

import os
import unicodedata

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from bertjax.convert import hf_tokenizers  # noqa: E402
from test_convert_deberta import _deberta_tokenizer  # noqa: E402
from test_convert_variants import _albert_tokenizer  # noqa: E402
from test_convert_xlnet import _xlnet_tokenizer  # noqa: E402

# Whitespace runs and ends, accents, TeX quotes, digit-commas (split off by
# the ALBERT/XLNet cleaning, not by DeBERTa's), a lower case that grows
# (İ -> i + dot), Greek sigmas (lower-cased by context).
TEXTS = ["Hello  wörld, the ``cat'' sat 12,5 on   mats.",
         "  Ünïcödé  café naïve 3,000 x ", "the cat sat on the mat",
         "İstanbul ΣΑΣ 9,9,9 a,b", "ﬁne ½ tab\there\nnew line"]
KINDS = {"xlnet": (_xlnet_tokenizer, "XLNetTokenizerFast"),
         "albert": (_albert_tokenizer, "AlbertTokenizerFast"),
         "deberta": (_deberta_tokenizer, "DebertaV2TokenizerFast")}


@pytest.fixture(scope="module", params=sorted(KINDS))
def tokenizers(request, tmp_path_factory):
  """(bertjax's HfTokenizer, transformers' fast tokenizer) of one directory."""
  path = str(tmp_path_factory.mktemp(request.param))
  make, fast = KINDS[request.param]
  make(path)
  assert not os.path.exists(os.path.join(path, "tokenizer.json"))
  return hf_tokenizers.HfTokenizer(path), getattr(transformers, fast).from_pretrained(path)


@pytest.mark.parametrize("text", TEXTS)
def test_offsets_cover_each_pieces_characters(tokenizers, text):
  tok, fast = tokenizers
  ids, spans = tok.encode_with_offsets(text)
  # The same pieces as every other encoding of the text.
  np.testing.assert_array_equal(ids, tok.encode_batch([text])[0])
  assert spans.shape == (len(ids), 2)
  assert (spans[:, 0] <= spans[:, 1]).all() and (spans[1:, 0] >= spans[:-1, 1]).all()
  assert spans.min() >= 0 and spans.max() <= len(text)
  backend = tok._tok  # the cleaning transformers' slow tokenizer applies

  def expands(chars: str) -> bool:
    """Whether the cleaning or sentencepiece's NFKC makes several characters
    of one of these (the ligature 'ﬁ' -> 'fi', '½' -> '1⁄2')."""
    return any(len(backend._clean(c)) > 1 or len(unicodedata.normalize("NFKC", c)) > 1
               for c in chars)

  unk = tok.piece_to_id("<unk>") if "<unk>" in tok._piece_ids else -1
  checked = 0
  for i, (b, e) in zip(ids, spans):
    surface = tok.id_to_piece(i).replace("\u2581", "")
    if not surface or i in (unk, 1):  # a lone word-start mark, or unknown
      assert b == e or i in (unk, 1)
      continue
    if b == e:  # only beside a character that expanded, whose first piece has it
      assert expands(text[max(b - 1, 0):b + 1]), (text, surface)
      continue
    assert not text[b].isspace() and not text[e - 1].isspace()
    cleaned = unicodedata.normalize("NFKC", backend._clean(text[b:e]))
    if expands(text[b:e]):
      assert surface in cleaned, (text[b:e], surface)
      continue
    # The piece is what the cleaning makes of exactly these characters.
    assert cleaned == surface, (text[b:e], surface)
    checked += 1
  assert checked >= len(text.split()) // 2
  # Against the tokenizers library's own offsets for the same text, where it
  # cuts the same pieces (its spans keep a word's leading space; ours not).
  enc = fast(text, add_special_tokens=False, return_offsets_mapping=True)
  theirs = [(b + len(text[b:e]) - len(text[b:e].lstrip()), e)
            for b, e in enc["offset_mapping"]]
  hf_ids = tok.to_hf_ids(ids)
  if list(hf_ids) == list(enc["input_ids"]):
    for i, ours, other in zip(ids, map(tuple, spans), theirs):
      if (tok.id_to_piece(i).replace("\u2581", "") and i != unk
          and not expands(text[min(ours[0], other[0]):max(ours[1], other[1])])):
        assert ours == other, (text, tok.id_to_piece(i), ours, other)

"""Character offsets of a tokenizer.json tokenizer whose pieces carry their
word's space (Metaspace: bertjax's own HF exports, DeBERTa-v3, ALBERT,
XLNet): QA's word limit and answer text are read through them."""

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from bertjax.convert import hf_tokenizers  # noqa: E402
from bertjax.finetune import qa  # noqa: E402

CONTEXT = "Return the values with a key."
WORDS = ("Return", "the", "values", "with", "a", "key", ".")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  vocab = [(t, 0.0) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
  vocab += [("\u2581" + w, -1.0) for w in WORDS] + [("\u2581", -2.0)]
  vocab += [(c, -5.0) for c in sorted(set("".join(WORDS)))]
  tok = Tokenizer(models.Unigram(vocab, unk_id=1))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  path = tmp_path_factory.mktemp("metaspace")
  tok.save(str(path / "tokenizer.json"))
  return hf_tokenizers.HfTokenizer(str(path))


def test_pieces_spans_leave_out_the_leading_space(tokenizer):
  ids, offsets = tokenizer.encode_with_offsets(CONTEXT)
  pieces = [tokenizer.id_to_piece(i) for i in ids]
  assert pieces == ["\u2581Return", "\u2581the", "\u2581values", "\u2581with",
                    "\u2581a", "\u2581key", "."]
  assert [CONTEXT[b:e] for b, e in offsets] == list(WORDS)
  np.testing.assert_array_equal(qa.word_index(CONTEXT, offsets), [0, 1, 2, 3, 4, 5, 5])
  # A run of spaces leaves a lone '\u2581' piece: an empty span, in no word's way.
  text = "Return the values  with a key."
  ids, offsets = tokenizer.encode_with_offsets(text)
  assert tokenizer.id_to_piece(ids[3]) == "\u2581" and offsets[3, 0] == offsets[3, 1]
  assert [text[b:e] for b, e in offsets] == ["Return", "the", "values", ""] + list(WORDS[3:])
  np.testing.assert_array_equal(qa.word_index(text, offsets), [0, 1, 2, 3, 3, 4, 5, 5])
  assert _answer(offsets, 3, 4, 1, text) == "with"


def _answer(offsets, start, end, words, context=CONTEXT):
  """The decoded text where the logits favour tokens ``start`` and ``end``."""
  s_log, e_log = np.zeros(len(offsets)), np.zeros(len(offsets))
  s_log[start], e_log[end] = 5.0, 5.0
  b, e, _ = qa.best_span([s_log], [e_log], [np.ones(len(offsets), bool)], [offsets],
                         8, context=context, max_answer_words=words)
  return context[b:e]


def test_one_word_answers_are_whole_words_without_spaces(tokenizer):
  _, offsets = tokenizer.encode_with_offsets(CONTEXT)
  assert _answer(offsets, 3, 3, 1) == "with"
  assert _answer(offsets, 5, 6, 1) == "key."  # '.' is in the word 'key.'
  # 'Return the' is two words: the limit refuses it.
  assert _answer(offsets, 0, 1, 1) in ("Return", "the")
  assert _answer(offsets, 0, 1, 2) == "Return the"


def test_word_limit_reads_spans_that_keep_their_leading_space():
  # The tokenizers library's own offsets for CONTEXT's pieces, spaces kept:
  # another tokenizer may hand QA such spans.
  offsets = np.array([[0, 6], [6, 10], [10, 17], [17, 22], [22, 24], [24, 28], [28, 29]])
  np.testing.assert_array_equal(qa.word_index(CONTEXT, offsets), [0, 1, 2, 3, 4, 5, 5])
  assert _answer(offsets, 3, 3, 1) == "with"
  assert _answer(offsets, 5, 6, 1) == "key."

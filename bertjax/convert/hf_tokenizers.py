"""An imported model's own tokenizer, speaking bertjax's token ids.

Loads, in this order of preference, from a Hugging Face tokenizer directory:
  tokenizer.json            the fast tokenizer's full description (exact)
  vocab.txt                 WordPiece with BERT's basic tokenization: clean-up,
                            CJK splitting, lower-casing and accent stripping as
                            tokenizer_config.json says (do_lower_case,
                            strip_accents, tokenize_chinese_chars)
  vocab.json + merges.txt   byte-level BPE (RoBERTa, GPT-2)
  *.model                   sentencepiece (ALBERT-style: optional lower-casing)
The first three use the ``tokenizers`` package, so ids match transformers'
fast tokenizers exactly; sentencepiece models load with ``sentencepiece``.

bertjax puts [PAD], [UNK], [CLS], [SEP], [MASK] at ids 0..4 (bertjax/batch.py);
HF BERT has them at 0, 100, 101, 102, 103. The import reorders the embedding
rows (``rules.vocab_order``) and this tokenizer applies the same reordering to
every id it returns or takes, so the packer, the objectives and the model all
see bertjax's fixed special ids and nothing else changes.

The interface is that of ``bertjax.data.tokenizer.Tokenizer`` (encode,
encode_batch, word_starts, decode, id_to_piece, piece_to_id, vocab_size,
fingerprint, path), so the data side can use either.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from typing import Any, Iterable, Sequence

import numpy as np

from bertjax import batch as batch_lib
from bertjax import mirror
from bertjax import paths
from bertjax.convert import hf_files
from bertjax.convert import pair_format
from bertjax.convert import rules as R

# Written by the import next to the tokenizer files: the special tokens (in
# bertjax's order) and the model's vocabulary size.
META_FILE = "bertjax_tokenizer.json"
_SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
# How each tokenizer kind marks pieces that begin a word (or continue one).
_WORD_START_PREFIX = {"BPE": "\u0120", "Unigram": "\u2581", "sentencepiece": "\u2581"}
_CONTINUATION_PREFIX = {"WordPiece": "##"}


def _read_json(path: str) -> dict[str, Any]:
  return paths.read_json(path) if paths.exists(path) else {}


def special_tokens(directory: str, defaults: Sequence[str]) -> list[str]:
  """The strings of [PAD], [UNK], [CLS], [SEP], [MASK] in an HF tokenizer dir.

  Read from special_tokens_map.json, then tokenizer_config.json, then
  ``defaults`` (the architecture's usual tokens).
  """
  found = {}
  for name in ("tokenizer_config.json", "special_tokens_map.json"):
    for key, value in _read_json(paths.join(directory, name)).items():
      if key in _SPECIAL_KEYS and value:
        found[key] = value["content"] if isinstance(value, dict) else value
  return [found.get(k, d) for k, d in zip(_SPECIAL_KEYS, defaults)]


def _added_token_flags(directory: str, kind: str) -> dict[str, dict[str, bool]]:
  """Each special token's AddedToken flags (lstrip, rstrip, ...) as the
  tokenizer's files give them: tokenizer.json's added_tokens, else
  tokenizer_config.json's added_tokens_decoder or a token written as a dict.

  They decide how a special token written in the text eats the spaces next
  to it: RoBERTa's ``<mask>`` strips the space on its left, so ``"a <mask>
  b"`` reads ``a``, ``<mask>``, ``Ġb``. A byte-level BPE tokenizer that says
  nothing gets that ``lstrip`` on its mask token, as transformers'
  RobertaTokenizer gives it.
  """
  keys = ("lstrip", "rstrip", "single_word", "normalized")
  flags: dict[str, dict[str, bool]] = {}
  if kind == "BPE":
    flags["<mask>"] = {"lstrip": True}
  cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
  written = [v for k, v in cfg.items() if k in _SPECIAL_KEYS]
  written += list(_read_json(os.path.join(directory, "special_tokens_map.json")).values())
  written += list((cfg.get("added_tokens_decoder") or {}).values())
  written += _read_json(os.path.join(directory, "tokenizer.json")).get("added_tokens") or []
  for token in written:  # later ones win: tokenizer.json is what transformers loads
    if isinstance(token, dict) and token.get("content"):
      flags[token["content"]] = {k: bool(token[k]) for k in keys if k in token}
  return flags


def _wordpiece(directory: str, specials: Sequence[str]):
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
  cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
  tok = Tokenizer(models.WordPiece.from_file(
      os.path.join(directory, "vocab.txt"), unk_token=specials[1],
      max_input_chars_per_word=100))
  tok.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
      strip_accents=cfg.get("strip_accents"), lowercase=cfg.get("do_lower_case", True))
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  return tok


def _byte_level_bpe(directory: str):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
  tok = Tokenizer(models.BPE.from_file(os.path.join(directory, "vocab.json"),
                                       os.path.join(directory, "merges.txt")))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(
      add_prefix_space=cfg.get("add_prefix_space", False))
  tok.decoder = decoders.ByteLevel()
  return tok


class _SentencePiece:
  """The few calls of ``tokenizers.Tokenizer`` that HfTokenizer uses, on sentencepiece.

  Text is cleaned as transformers' ALBERT/XLNet tokenizers do before the
  model sees it: whitespace runs collapsed, `` and '' turned into ", accents
  stripped unless kept, lower-cased if asked; a comma after a digit is split
  off its piece. With ``plain`` (DebertaV2Tokenizer) the text goes to
  sentencepiece as it is, only lower-cased if asked.
  """

  def __init__(self, path: str, lower: bool, keep_accents: bool,
               plain: bool = False):
    import sentencepiece as spm
    self._sp = spm.SentencePieceProcessor(model_file=path)
    self._lower, self._keep_accents = lower, keep_accents
    self._plain = plain

  def _clean(self, text: str) -> str:
    if self._plain:
      return text.lower() if self._lower else text
    text = " ".join(text.strip().split())
    text = text.replace("``", '"').replace("''", '"')
    if not self._keep_accents:
      text = "".join(c for c in unicodedata.normalize("NFKD", text)
                     if not unicodedata.combining(c))
    return text.lower() if self._lower else text

  def _split_digit_comma(self, piece: str) -> list[str]:
    """'▁9,' -> ['▁9', ','], as BERT's and ALBERT's tokenizers split a
    comma after a number, so '9,9' reads as 9 , 9."""
    pieces = self._sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
    if pieces and not piece.startswith("\u2581") and pieces[0].startswith("\u2581"):
      pieces[0] = pieces[0][1:]
      if not pieces[0]:
        pieces = pieces[1:]
    return pieces + [piece[-1]]

  def _splits(self, piece: str) -> bool:
    return (not self._plain and len(piece) > 1 and piece[-1] == ","
            and piece[-2].isdigit())

  def encode_batch(self, texts, add_special_tokens=False):
    del add_special_tokens
    out = []
    for pieces in self._sp.encode([self._clean(t) for t in texts], out_type=str):
      split = []
      for piece in pieces:
        split += self._split_digit_comma(piece) if self._splits(piece) else [piece]
      out.append(_Ids([self._sp.piece_to_id(p) for p in split]))
    return out

  def _cleaned_with_sources(self, text: str) -> tuple[str, list[int]]:
    """``_clean(text)`` and, for each of its characters, the index of the
    character of ``text`` it comes from (character by character; where that
    differs from ``_clean``, e.g. a context-dependent lower case, the two are
    aligned with difflib)."""
    out: list[tuple[str, int]] = []
    lower = (lambda c: c.lower()) if self._lower else (lambda c: c)
    if self._plain:
      out = [(d, i) for i, c in enumerate(text) for d in lower(c)]
    else:
      chars: list[tuple[str, int]] = []
      for i, c in enumerate(text):  # whitespace runs -> one space, ends stripped
        if c.isspace():
          if chars and chars[-1][0] != " ":
            chars.append((" ", i))
        else:
          chars.append((c, i))
      if chars and chars[-1][0] == " ":
        chars.pop()
      for pair in ("``", "''"):  # each pair of quotes -> '"', left to right
        merged, k = [], 0
        while k < len(chars):
          if "".join(c for c, _ in chars[k:k + 2]) == pair:
            merged.append(('"', chars[k][1]))
            k += 2
          else:
            merged.append(chars[k])
            k += 1
        chars = merged
      for c, i in chars:
        if not self._keep_accents:
          c = "".join(d for d in unicodedata.normalize("NFKD", c)
                      if not unicodedata.combining(d))
        out += [(d, i) for d in lower(c)]
    mine = "".join(c for c, _ in out)
    sources = [i for _, i in out]
    cleaned = self._clean(text)
    if mine != cleaned:
      import difflib
      aligned = [len(text) - 1] * len(cleaned)
      for _, a0, a1, b0, b1 in difflib.SequenceMatcher(
          None, mine, cleaned, autojunk=False).get_opcodes():
        for k in range(b0, b1):
          a = min(a0 + (k - b0), max(a1 - 1, a0))
          aligned[k] = sources[a] if a < len(sources) else len(text) - 1
      sources = aligned
    return cleaned, sources

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(HF ids, each piece's [begin, end) characters in ``text``), the ids as
    ``encode_batch``'s. A word's leading space belongs to no piece; a piece
    without characters of its own (a lone word-start mark) gets an empty span."""
    cleaned, sources = self._cleaned_with_sources(text)
    char_of_byte = np.repeat(np.arange(len(cleaned) + 1),
                             [len(c.encode("utf-8")) for c in cleaned] + [1])
    ids, spans = [], []
    for p in self._sp.encode(cleaned, return_type="proto").pieces:
      begin, end = int(char_of_byte[p.begin]), int(char_of_byte[p.end])
      while begin < end and cleaned[begin].isspace():
        begin += 1
      pieces = self._split_digit_comma(p.piece) if self._splits(p.piece) else [p.piece]
      for k, piece in enumerate(pieces):
        # Split pieces take their surface lengths in turn; the last one ends
        # where the piece does.
        size = len(piece.replace("\u2581", ""))
        stop = end if k == len(pieces) - 1 else min(begin + size, end)
        ids.append(self._sp.piece_to_id(piece))
        spans.append((begin, stop))
        begin = stop
    # Cleaned characters -> the characters of the text they came from: a
    # span ends where the next cleaned character's source begins (so '``'
    # cleaned to '"' keeps both quotes), less any whitespace. A character
    # the cleaning expands (the ligature 'ﬁ' -> 'fi') goes to its first
    # piece; the others get an empty span at its end.
    out, last = [], 0
    for b, e in spans:
      start = max(sources[b] if b < len(sources) else len(text), last)
      if e > b:
        stop = max(sources[e] if e < len(sources) else len(text),
                   sources[e - 1] + 1, start)
        while stop > start + 1 and text[stop - 1].isspace():
          stop -= 1
        stop = max(stop, start)
      else:
        stop = start
      out.append((start, stop))
      last = max(last, stop)
    return np.asarray(ids, np.int64), out

  def get_vocab(self):
    return {self._sp.id_to_piece(i): i for i in range(self._sp.get_piece_size())}

  def decode(self, ids, skip_special_tokens=True):
    del skip_special_tokens
    return self._sp.decode(list(ids))

  def add_special_tokens(self, tokens):
    del tokens  # sentencepiece control symbols never come from text anyway


class _Ids:
  def __init__(self, ids):
    self.ids = ids


def _backend(directory: str, specials: Sequence[str]) -> tuple[Any, str]:
  """(a tokenizers.Tokenizer or a sentencepiece adapter, its model kind)."""
  path = lambda name: os.path.join(directory, name)
  if os.path.isfile(path("tokenizer.json")):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path("tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok, json.loads(tok.to_str())["model"]["type"]
  if os.path.isfile(path("vocab.txt")):
    return _wordpiece(directory, specials), "WordPiece"
  if os.path.isfile(path("vocab.json")) and os.path.isfile(path("merges.txt")):
    return _byte_level_bpe(directory), "BPE"
  for name in ("spiece.model", "sentencepiece.bpe.model", "spm.model"):
    if os.path.isfile(path(name)):
      cfg = _read_json(path("tokenizer_config.json"))
      if str(cfg.get("tokenizer_class", "")).startswith("DebertaV2"):
        if cfg.get("split_by_punct"):
          raise ValueError(
              f"{directory}'s DebertaV2Tokenizer has split_by_punct=true, which "
              "bertjax's tokenizer import does not replicate; save the tokenizer "
              "with split_by_punct=false or with its tokenizer.json.")
        return _SentencePiece(path(name), cfg.get("do_lower_case", False), True,
                              plain=True), "sentencepiece"
      # AlbertTokenizer lower-cases and strips accents unless told otherwise.
      albert = str(cfg.get("tokenizer_class", "")).startswith("Albert")
      return _SentencePiece(path(name), cfg.get("do_lower_case", albert),
                            cfg.get("keep_accents", not albert)), "sentencepiece"
  raise ValueError(
      f"{directory} has no tokenizer.json, vocab.txt, vocab.json+merges.txt or "
      "sentencepiece .model; copy the model's tokenizer files into it.")


def fingerprint(directory: str) -> str:
  """sha256 over the names and bytes of a directory's tokenizer files."""
  digest = hashlib.sha256()
  for name in sorted(hf_files.TOKENIZER_FILES + (META_FILE,)):
    full = paths.join(directory, name)
    if paths.exists(full):
      digest.update(name.encode())
      digest.update(paths.path(full).read_bytes())
  return digest.hexdigest()


def write_meta(directory: str, specials: Sequence[str], vocab_size: int) -> None:
  """Records the special tokens and the model's vocab size next to the files."""
  paths.write_text(paths.join(directory, META_FILE), json.dumps(
      {"special_tokens": list(specials), "vocab_size": int(vocab_size)}))


class HfTokenizer:
  """An HF tokenizer directory, returning and taking bertjax token ids.

  Attributes:
    path: the tokenizer directory.
    vocab_size: the model's vocabulary size (rows of the embedding table).
    fingerprint: sha256 of the tokenizer files (``fingerprint``).
    special_ids: the HF ids of [PAD], [UNK], [CLS], [SEP], [MASK].
    order: int64 [vocab_size]; bertjax id i is HF id order[i].
  """

  def __init__(self, directory: str, *, special: Sequence[str] | None = None,
               vocab_size: int | None = None):
    self.path = directory
    # The tokenizers library reads local files: a gs:// directory is mirrored.
    directory = mirror.fetched(directory)
    meta = _read_json(paths.join(directory, META_FILE))
    special = list(special or meta.get("special_tokens") or
                   special_tokens(directory, batch_lib.SPECIAL_TOKENS))
    self._tok, self._kind = _backend(directory, special)
    vocab = self._tok.get_vocab()
    # Checked before adding them below, which would otherwise invent them.
    missing = [t for t in special if t not in vocab]
    if missing:
      raise ValueError(
          f"Tokenizer {directory} has no token {missing[0]!r}; name its special "
          "tokens in special_tokens_map.json.")
    # Specials in the text match as whole tokens, as in transformers, with
    # their files' flags (re-adding one replaces those tokenizer.json gave it).
    self._add_specials(directory, special)
    self.mask_token = special[4]
    # Separators between the two texts of a pair (``pair_format``); None
    # where the files do not say.
    self.pair_separators = pair_format.files_say(directory)
    self.vocab_size = int(vocab_size or meta.get("vocab_size") or max(vocab.values()) + 1)
    self.special_ids = [vocab[t] for t in special]
    self.order = R.vocab_order(self.special_ids, self.vocab_size)
    self._to_bertjax = np.empty_like(self.order)
    self._to_bertjax[self.order] = np.arange(self.vocab_size)
    self.fingerprint = fingerprint(directory)
    pieces = [""] * self.vocab_size
    for piece, i in vocab.items():
      if i < self.vocab_size:
        pieces[int(self._to_bertjax[i])] = piece
    self._pieces = pieces
    self._piece_ids = {p: i for i, p in enumerate(pieces) if p}
    start = _WORD_START_PREFIX.get(self._kind)
    cont = _CONTINUATION_PREFIX.get(self._kind, "")
    self._word_start = np.array(
        [p.startswith(start) if start else not (cont and p.startswith(cont))
         for p in pieces], dtype=bool)
    self._word_start[:batch_lib.NUM_SPECIAL_TOKENS] = True
    # What goes before a sentence that follows another in a document, so that
    # sentences encoded one by one read as the running text does. A byte-level
    # BPE without add_prefix_space (RoBERTa, GPT-2) gives a text's first word
    # no '\u0120': encoded alone, a sentence would be glued to the one before
    # ('mat.Then') and its first word would begin no word. The probe asks the
    # tokenizer itself: WordPiece, sentencepiece and prefix-adding BPEs drop
    # or already add the space ("" for them).
    self.sentence_prefix = (
        " " if self._tok.encode_batch([" a"], add_special_tokens=False)[0].ids
        != self._tok.encode_batch(["a"], add_special_tokens=False)[0].ids else "")

  def _add_specials(self, directory: str, special: Sequence[str]) -> None:
    if self._kind == "sentencepiece":
      self._tok.add_special_tokens(special)  # matches no text (see matches_specials)
      return
    from tokenizers import AddedToken
    flags = _added_token_flags(directory, self._kind)
    self._tok.add_special_tokens([AddedToken(t, special=True, **flags.get(t, {}))
                                  for t in special])

  @property
  def matches_specials(self) -> bool:
    """Whether special-token strings in a text (``mask_token``) encode to
    their ids, as transformers' fast tokenizers match them; sentencepiece read
    without tokenizer.json (the slow tokenizers' files) does not."""
    return self._kind != "sentencepiece"

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    """bertjax ids of many texts, no special tokens added: int32 [n_i] each."""
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [self._to_bertjax[np.asarray(e.ids, np.int64)].astype(np.int32)
            for e in encodings]

  def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [n] bertjax ids, bool [n] word starts) of one text."""
    ids = self.encode_batch([text])[0]
    starts = self._word_start[ids]
    starts[:1] = True  # the first piece of a text always begins a word
    return ids, starts

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """bertjax ids int32 [n] and character spans int32 [n, 2] of one text. A
    word's leading space belongs to no piece (a lone word-start mark gets an
    empty span), whatever the backend."""
    if self._kind == "sentencepiece":
      hf_ids, spans = self._tok.encode_with_offsets(text)
      ids = self._to_bertjax[hf_ids].astype(np.int32)
      return ids, np.asarray(spans, np.int32).reshape(-1, 2)
    encoding = self._tok.encode(text, add_special_tokens=False)
    ids = self._to_bertjax[np.asarray(encoding.ids, np.int64)].astype(np.int32)
    spans = np.asarray(encoding.offsets, np.int32).reshape(-1, 2)
    # The tokenizers library gives a Metaspace piece ('\u2581with') or an
    # untrimmed byte-level one ('\u0120with') its word's leading space; QA
    # would then count the piece in the previous word (max_answer_words) and
    # begin answers with a space.
    for k, (begin, end) in enumerate(spans):
      while begin < end and text[begin].isspace():
        begin += 1
      spans[k, 0] = begin
    return ids, spans

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """bool [n]: whether each id's piece begins a word."""
    return self._word_start[np.asarray(ids)]

  def to_hf_ids(self, ids: np.ndarray) -> np.ndarray:
    """bertjax ids -> the HF tokenizer's ids (same shape)."""
    return self.order[np.asarray(ids)]

  def from_hf_ids(self, ids: np.ndarray) -> np.ndarray:
    """The HF tokenizer's ids -> bertjax ids (same shape)."""
    return self._to_bertjax[np.asarray(ids)]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of bertjax ids (special tokens decode to nothing)."""
    hf_ids = [int(i) for i in self.to_hf_ids(np.fromiter(ids, np.int64))]
    return self._tok.decode(hf_ids, skip_special_tokens=True)

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def piece_to_id(self, piece: str) -> int:
    return self._piece_ids.get(piece, batch_lib.UNK_ID)


def import_tokenizer(hf_dir: str, out_dir: str, defaults: Sequence[str],
                     vocab_size: int) -> HfTokenizer:
  """Copies an HF model's tokenizer files to ``out_dir`` and loads them."""
  copied = hf_files.copy_tokenizer_files(hf_dir, out_dir)
  if not copied:
    raise ValueError(
        f"{hf_dir} has no tokenizer files ({', '.join(hf_files.TOKENIZER_FILES[:5])}"
        ", ...); copy the model's tokenizer into it, bertjax needs its vocabulary.")
  write_meta(out_dir, special_tokens(hf_dir, defaults), vocab_size)
  return HfTokenizer(out_dir)

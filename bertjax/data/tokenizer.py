"""SentencePiece tokenizers trained by bertjax, with BERT's special tokens at fixed ids.

Every tokenizer bertjax trains puts the special tokens at the ids of
``bertjax/batch.py``: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. [CLS],
[SEP] and [MASK] are sentencepiece *control* symbols, so no input text can ever
encode to them; the packer places them. BOS/EOS are disabled.

A tokenizer is identified by its ``fingerprint``: the sha256 of the ``.model``
file. Prepared shards record it, so that shards and tokenizer cannot be mixed up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from typing import Iterable, Iterator

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from bertjax import batch as batch_lib
from bertjax import paths
from bertjax.data import spm_trainer

# config.tokenizer -> sentencepiece model type. Every tokenizer bertjax trains
# falls back to UTF-8 bytes (256 '<0x..>' pieces) for characters outside its
# vocabulary, so no text maps to [UNK]: a run of unseen CJK characters would
# otherwise collapse into one [UNK] and be lost. 'bpe_bytes' is RoBERTa's
# byte-level BPE as sentencepiece offers it; it now trains exactly as 'bpe'
# does, but also refuses an older 'bpe' model without byte fallback. RoBERTa's
# <pad> <unk> <s> </s> <mask> are bertjax's fixed [PAD] [UNK] [CLS] [SEP]
# [MASK] ids under their bertjax names.
_MODEL_TYPES = {"unigram": "unigram", "bpe": "bpe", "bpe_bytes": "bpe"}
MODEL_TYPES = tuple(_MODEL_TYPES)
# Sentencepiece marks the start of a word (a piece preceded by whitespace) with this.
WORD_START = "\u2581"
# Fixed seed of sentencepiece's trainer: the same corpus gives the same model.
_TRAIN_SEED = 0
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\).*?<= (\d+)", re.S)
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def file_fingerprint(path: str) -> str:
  """sha256 hex digest of a file's bytes."""
  digest = hashlib.sha256()
  with paths.path(path).open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def _model_proto(path: str) -> sentencepiece_model_pb2.ModelProto:
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(paths.path(path).read_bytes())
  return proto


def model_type_of(path: str) -> str:
  """What a .model file is: 'unigram' or 'bpe', '_bytes' appended with byte fallback."""
  spec = _model_proto(path).trainer_spec
  name = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(spec.model_type).lower()
  return f"{name}_bytes" if spec.byte_fallback else name


def fits_config(model_type: str, config_tokenizer: str) -> bool:
  """Whether a model of ``model_type_of`` serves ``config.tokenizer``.

  The sentencepiece types must agree; byte fallback is required only by
  'bpe_bytes', so tokenizers trained before every bertjax tokenizer had byte
  fallback still load under 'unigram' and 'bpe'.
  """
  base = model_type.removesuffix("_bytes")
  if config_tokenizer == "bpe_bytes":
    return model_type == "bpe_bytes"
  return base == _MODEL_TYPES.get(config_tokenizer)


class VocabTooLargeError(ValueError):
  """The training text holds fewer distinct pieces than ``vocab_size`` asks;
  ``max_vocab`` is the largest size it allows (sentencepiece's figure)."""

  def __init__(self, message: str, max_vocab: int):
    super().__init__(message)
    self.max_vocab = max_vocab


class Tokenizer:
  """A trained sentencepiece model with bertjax's fixed special-token ids.

  Attributes:
    path: the ``.model`` file.
    vocab_size: number of ids, special tokens included.
    fingerprint: sha256 of the ``.model`` file.
    byte_fallback: whether unknown characters become byte pieces (every
      tokenizer bertjax trains) rather than [UNK] (older ones).
  """

  def __init__(self, model_path: str):
    if not paths.exists(model_path):
      raise ValueError(
          f"Tokenizer model {model_path} does not exist; run `python -m "
          f"bertjax.prepare` with the same --config to train it.")
    self.path = model_path
    model = paths.path(model_path).read_bytes()  # local or gs://
    self._sp = spm.SentencePieceProcessor(model_proto=model)
    self.vocab_size = self._sp.get_piece_size()
    self.fingerprint = hashlib.sha256(model).hexdigest()
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    self.byte_fallback = proto.trainer_spec.byte_fallback
    # sentencepiece gives every text its dummy-prefix '\u2581', so a sentence
    # encoded alone already begins a word (see HfTokenizer.sentence_prefix).
    self.sentence_prefix = ""
    for want, piece in enumerate(batch_lib.SPECIAL_TOKENS):
      if self._sp.id_to_piece(want) != piece:
        raise ValueError(
            f"Tokenizer {model_path} has {self._sp.id_to_piece(want)!r} at id "
            f"{want} instead of {piece!r}; point --config.data_dir at a new "
            f"directory so that bertjax trains a tokenizer with its special ids.")
    # Per-id lookup table: does this piece start a word?
    self._word_start = np.array(
        [self._sp.id_to_piece(i).startswith(WORD_START)
         for i in range(self.vocab_size)], dtype=bool)

  def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Tokenizes one text.

    Returns:
      ids: int32 [n] token ids (never a control id; byte pieces for unknown
        characters, or [UNK] in a tokenizer without byte fallback).
      word_starts: bool [n], True where the piece begins a word ('\u2581...').
    """
    ids = np.asarray(self._sp.encode(text), dtype=np.int32)
    return ids, self._word_start[ids]

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    """Tokenizes many texts at once; returns one int32 [n_i] array per text.

    One thread: prepare's parallelism is its worker processes
    (config.prepare_workers); sentencepiece's own threads would compete with
    them and give each process one malloc arena per thread to keep.
    """
    return [np.asarray(ids, dtype=np.int32)
            for ids in self._sp.encode(texts, num_threads=1)]

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """ids int32 [n] and each piece's [begin, end) characters int32 [n, 2] in
    ``text`` (fine-tuning maps QA answers and tags through them). A word's
    leading space belongs to no piece; of the byte pieces of one character
    (byte fallback) the last gets the character and the others an empty span."""
    proto = self._sp.encode(text, return_type="proto")
    # sentencepiece reports UTF-8 byte offsets; map them to characters.
    char_of_byte = np.repeat(np.arange(len(text) + 1),
                             [len(c.encode("utf-8")) for c in text] + [1])
    ids = np.array([p.id for p in proto.pieces], np.int32)
    offsets = np.array([[char_of_byte[p.begin], char_of_byte[p.end]]
                        for p in proto.pieces], np.int32).reshape(-1, 2)
    for k in range(len(offsets)):  # the '▁' of a word start is its space
      while offsets[k, 0] < offsets[k, 1] and text[offsets[k, 0]].isspace():
        offsets[k, 0] += 1
      offsets[k, 1] = max(offsets[k, 1], offsets[k, 0])
    return ids, offsets

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """bool [n]: whether each id's piece begins a word."""
    return self._word_start[np.asarray(ids)]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of a sequence of ids (control symbols decode to nothing)."""
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    """The piece string of an id (e.g. '\u2581the', '[MASK]')."""
    return self._sp.id_to_piece(int(i))

  def piece_to_id(self, piece: str) -> int:
    """The id of a piece string ([UNK]'s id if the piece is not in the vocab)."""
    return self._sp.piece_to_id(piece)


# sentencepiece's trainer skips, without a word, every sentence longer than
# its max_sentence_length (4192 bytes): a paragraph the splitter could not cut
# (a script it does not know, a one-line file) would never reach the
# vocabulary. Longer ones are given to it in pieces of at most this many bytes.
_TRAINER_LINE_BYTES = 4096
# Sentences go to the trainer's process in writes of about this many bytes.
_FEED_BYTES = 1 << 20


def _trainer_lines(sentence: str) -> Iterator[str]:
  """``sentence`` in pieces of at most _TRAINER_LINE_BYTES UTF-8 bytes, cut at
  the last space before the limit (within a character where there is none)."""
  data = sentence.encode("utf-8")
  while len(data) > _TRAINER_LINE_BYTES:
    cut = data.rfind(b" ", _TRAINER_LINE_BYTES // 2, _TRAINER_LINE_BYTES + 1)
    if cut <= 0:
      cut = _TRAINER_LINE_BYTES
      while cut and data[cut] & 0xC0 == 0x80:  # not inside a character
        cut -= 1
    yield data[:cut].decode("utf-8")
    data = data[cut:].lstrip(b" ")
  if data:
    yield data.decode("utf-8")


def train(sentences: Iterable[str], model_path: str, vocab_size: int,
          model_type: str = "unigram", num_threads: int = 1) -> Tokenizer:
  """Trains a sentencepiece model on sentences and writes it to ``model_path``.

  Training is deterministic (fixed seed, corpus order, a fixed thread count),
  so the same sentences give a byte-identical model and fingerprint. The
  thread count is part of that: sentencepiece's result changes with it, which
  is why it is a config field (tokenizer_train_threads) and not the number of
  cores of the machine at hand.

  Each distinct sentence is trained on once, where it first comes (exact
  repeats are compared by a 16-byte hash, so the check costs about 100 bytes
  a sentence however long it is). Repeated text (licence lines, navigation,
  templated paragraphs) would otherwise weigh in its vocabulary as often as
  it repeats; and sentencepiece 0.2.2 (the newest the ``beam`` and ``test``
  extras allow) spends most of its time in its seed search on such repeats:
  the demo's 15,270-sentence sample (13,681 distinct) took 16.0 s with them,
  2.3 s without.

  Args:
    sentences: training text, one sentence per item (empty ones and repeats
      are skipped).
    model_path: where to write the ``.model`` file (written atomically).
    vocab_size: exact number of ids, the 5 special tokens included.
    model_type: 'unigram', 'bpe' or 'bpe_bytes' (the same as 'bpe'); all
      three fall back to bytes for characters outside the vocabulary.
    num_threads: sentencepiece trainer threads.

  Returns:
    The trained Tokenizer.
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(
        f"Unknown tokenizer type {model_type!r}; set --config.tokenizer to one "
        f"of {', '.join(MODEL_TYPES)}.")
  if vocab_size <= batch_lib.NUM_SPECIAL_TOKENS + 1:
    raise ValueError(
        f"vocab_size={vocab_size} leaves no room for text pieces; set "
        f"--config.vocab_size above {batch_lib.NUM_SPECIAL_TOKENS + 1}.")

  def distinct():
    seen = set()
    for sentence in sentences:
      if not sentence.strip():
        continue
      key = hashlib.blake2b(sentence.encode("utf-8"), digest_size=16).digest()
      if key not in seen:
        seen.add(key)
        yield from _trainer_lines(sentence)

  try:
    model = _train_in_child(distinct(), {
        "model_type": _MODEL_TYPES[model_type],
        "byte_fallback": True,
        "vocab_size": vocab_size,
        "pad_id": batch_lib.PAD_ID, "pad_piece": "[PAD]",
        "unk_id": batch_lib.UNK_ID, "unk_piece": "[UNK]",
        "bos_id": -1, "eos_id": -1,
        # Control symbols take the next free ids in order: 2, 3, 4.
        "control_symbols": list(batch_lib.SPECIAL_TOKENS[2:]),
        "num_threads": num_threads,
        "minloglevel": 2})
  except RuntimeError as e:
    too_high = _TOO_HIGH.search(str(e))
    if too_high:
      raise VocabTooLargeError(
          f"The training corpus is too small for a {model_type} vocabulary of "
          f"{vocab_size}; set --config.vocab_size to at most {too_high.group(2)} "
          f"(or add text).", int(too_high.group(2))) from None
    too_low = _TOO_LOW.search(str(e))
    if too_low:
      # The specials, the 256 byte pieces and one piece per character of the
      # corpus (character_coverage) must all fit.
      raise ValueError(
          f"A vocabulary of {vocab_size} cannot hold the special tokens, 256 "
          f"byte pieces and the corpus's characters; set --config.vocab_size "
          f"to at least {too_low.group(2)}.") from None
    if "empty" in str(e).lower() or "no sentence" in str(e).lower():
      raise ValueError(
          "The tokenizer's training corpus is empty; check --config.dataset / "
          "--config.text_files.") from None
    raise
  os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
  tmp_path = f"{model_path}.tmp-{os.getpid()}"
  with open(tmp_path, "wb") as f:
    f.write(model)
  os.replace(tmp_path, model_path)
  return Tokenizer(model_path)


def _train_in_child(lines: Iterator[str], options: dict) -> bytes:
  """sentencepiece's trainer on ``lines``, run by bertjax/data/spm_trainer.py
  in a child process; returns the model's bytes.

  This process feeds the child and waits on its pipe, so a signal's handler
  (prepare's SIGTERM stop, Ctrl-C) runs at once: the child is then killed,
  and no model written. Raises RuntimeError with the trainer's message when
  it fails; whatever reading ``lines`` raises is raised as itself.
  """
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  with tempfile.TemporaryFile() as errors:
    child = subprocess.Popen(
        [sys.executable, "-m", "bertjax.data.spm_trainer"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=errors, env=env)
    try:
      try:
        child.stdin.write(json.dumps({"parent": os.getpid(), "seed": _TRAIN_SEED,
                                      "options": options}).encode() + b"\n")
        chunk = bytearray()
        for line in lines:
          data = line.encode("utf-8")
          chunk += struct.pack(">I", len(data)) + data
          if len(chunk) >= _FEED_BYTES:
            child.stdin.write(chunk)
            chunk.clear()
        child.stdin.write(chunk + struct.pack(">I", spm_trainer.END))
        child.stdin.close()
      except BrokenPipeError:
        pass  # the trainer stopped early: its status and message say why
      model = child.stdout.read()
      status = child.wait()
    finally:
      if child.poll() is None:  # stopped while it reads or trains
        child.kill()
        child.wait()
      child.stdout.close()
    errors.seek(0)
    message = errors.read().decode("utf-8", "replace").strip()
  if status == spm_trainer.TRAINER_ERROR:
    raise RuntimeError(message)
  if status != 0:
    raise RuntimeError(f"sentencepiece's trainer process ended with status {status}"
                       + (f": {message.splitlines()[-1]}" if message else ""))
  return model

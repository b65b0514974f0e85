"""Trains a sentencepiece model in a process of its own, for bertjax/data/tokenizer.py.

sentencepiece's C++ trainer does not return to Python until it is done, so a
process training in its main thread runs no signal handler meanwhile: a
SIGTERM to prepare waited for the rest of the training (tens of seconds on a
500,000-sentence sample). Trained here, in a child that imports only
sentencepiece, it is stopped at once: the parent, waiting on a pipe, runs its
handler and kills the child, which has written no file.

Protocol on the pipes (``python -m bertjax.data.spm_trainer``):
  stdin   one JSON line: the random seed and the trainer's keyword options;
          then each sentence as a 4-byte big-endian length and its UTF-8
          bytes; then the length ``END``. A stream cut short (the parent
          gone) trains nothing.
  stdout  the model's bytes, once trained.
  stderr  the trainer's error message; exit status ``TRAINER_ERROR``.
"""

import ctypes
import io
import json
import os
import signal
import struct
import sys

END = 0xFFFFFFFF
TRAINER_ERROR = 3
_PR_SET_PDEATHSIG = 1


def _sentences(stream):
  while True:
    head = stream.read(4)
    if len(head) < 4:
      raise EOFError("the sentences were cut short")
    (size,) = struct.unpack(">I", head)
    if size == END:
      return
    yield stream.read(size).decode("utf-8")


def _die_with(parent: int) -> None:
  """A parent killed outright (SIGKILL) takes the trainer with it, where
  Linux allows, instead of leaving it to train for nobody."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent:  # gone before prctl took effect
    sys.exit(1)


def main() -> None:
  # A SIGTERM or Ctrl-C to the whole process group is for the parent to act
  # on: prepare kills this process at once; bertjax.main, which stops at its
  # next safe point, lets the training finish (as it did in-process).
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  stdin = sys.stdin.buffer
  header = json.loads(stdin.readline())
  _die_with(header["parent"])
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (after the check)
  spm.set_random_generator_seed(header["seed"])
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=_sentences(stdin),
                                   model_writer=model, **header["options"])
  except RuntimeError as e:
    sys.stderr.write(str(e))
    sys.exit(TRAINER_ERROR)
  sys.stdout.buffer.write(model.getvalue())


if __name__ == "__main__":
  main()

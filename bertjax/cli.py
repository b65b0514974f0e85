"""Flag parsing shared by the binaries, turning config mistakes into one line.

ml_collections reports a misspelt ``--config.FIELD`` as a traceback; a user
should see one sentence naming the field and the closest valid one instead.
"""

from __future__ import annotations

import logging
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging as absl_logging

_SUGGESTION = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"')


def _messages(error: BaseException):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield str(error)
    error = error.__cause__ or error.__context__


def explain(error: BaseException) -> str:
  """One sentence for a flag-parsing failure."""
  texts = [t.strip() for t in _messages(error) if t.strip()]
  for text in texts:
    match = _SUGGESTION.search(text.replace("\\", ""))
    if match:
      good, bad = match.groups()
      return (f"Unknown config field {bad!r}; did you mean --config.{good}? "
              "Run with --helpfull to list the flags.")
  # The most specific message is the first one-line message that says more
  # than a bare key.
  for text in texts:
    if "\n" not in text and not re.fullmatch(r"['\"]?[\w.]+['\"]?", text):
      return text
  if texts:
    return texts[0].splitlines()[-1].strip()
  return f"Could not parse the flags ({type(error).__name__})."


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags_parser: parses ``argv``, or exits(2) with one clear sentence."""
  try:
    rest = flags.FLAGS(argv)
    for name in ("config",):  # config files load lazily; fail here, not later
      if name in flags.FLAGS and flags.FLAGS[name].present:
        getattr(flags.FLAGS, name).keys()
    return rest
  except Exception as e:  # noqa: BLE001 — every parse failure gets one sentence.
    print(f"error: {explain(e)}", file=sys.stderr)
    sys.exit(2)


class _BertjaxInfoOnly(logging.Filter):
  """Keeps bertjax's INFO lines and every library's warnings and errors."""

  def filter(self, record: logging.LogRecord) -> bool:
    return (record.levelno >= logging.WARNING
            or f"{os.sep}bertjax{os.sep}" in record.pathname)


def quiet_libraries() -> None:
  """Hides the INFO chatter of orbax/TFDS/grain and TFDS progress bars.

  ``--verbosity=1`` (or ``-v 1``) shows everything again.
  """
  if flags.FLAGS["verbosity"].present:
    return
  absl_logging.get_absl_handler().addFilter(_BertjaxInfoOnly())
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()


def run(main) -> None:
  """``app.run`` with the friendly flag parser, turning a ValueError raised by
  bertjax (bad input, refused before any device work) into one line."""

  def wrapped(argv):
    quiet_libraries()
    try:
      return main(argv)
    except ValueError as e:
      if flags.FLAGS["verbosity"].present or not str(e):
        raise
      hint = "" if "--" in str(e) else " (run with -v 1 for the traceback)"
      print(f"error: {e}{hint}", file=sys.stderr)
      return 2

  app.run(wrapped, flags_parser=parse_flags)

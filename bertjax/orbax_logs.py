"""Orbax's log lines around bertjax's checkpoints: what a reader need not see.

``quiet_read_only`` hides the notices orbax prints on every read-only open;
``quiet_handler_override`` its warning when bertjax puts its own jax.Array
handler in place (bertjax/checkpointing.py);
``held_logs`` keeps a restore's lines back until it is known to have worked,
since a failed one is reported in one bertjax line (bertjax/checkpointing.py).
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import warnings


# Orbax's notices on opening a checkpoint directory read-only: expected, not
# worth a notebook user's attention on every ``bertjax.load``.
_READ_ONLY_NOTICES = ("CheckpointManagerOptions.read_only=True, setting",
                      "Given directory is read only=")


class _DropPrefix(std_logging.Filter):
  """Drops the records whose message starts with ``prefix`` (a string or a
  tuple of them)."""

  def __init__(self, prefix: str | tuple[str, ...]):
    super().__init__()
    self._prefix = prefix

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not str(record.msg).startswith(self._prefix)


@contextlib.contextmanager
def quiet_read_only():
  """Hides orbax's expected read-only notices and its "Sharding info not
  provided" warning (params are restored where they fit); other warnings show."""
  absl_logger = std_logging.getLogger("absl")
  notices = _DropPrefix(_READ_ONLY_NOTICES)
  absl_logger.addFilter(notices)
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message="Sharding info not provided")
      yield
  finally:
    absl_logger.removeFilter(notices)


@contextlib.contextmanager
def quiet_handler_override():
  """Hides orbax's warning that a type's handler is being replaced: bertjax
  replaces the jax.Array one on purpose (and says why in its docs)."""
  absl_logger = std_logging.getLogger("absl")
  drop = _DropPrefix("Type handler registry type")
  absl_logger.addFilter(drop)
  try:
    yield
  finally:
    absl_logger.removeFilter(drop)


class _Hold(std_logging.Filter):
  """Holds back log records in ``records``: ``held_logs`` emits them when
  the restore succeeds, else they are dropped."""

  def __init__(self):
    super().__init__()
    self.records = []

  def filter(self, record: std_logging.LogRecord) -> bool:
    self.records.append(record)
    return False


@contextlib.contextmanager
def held_logs():
  """Holds orbax's, asyncio's and root log records for one restore: replayed
  when it succeeds, dropped when it fails (one bertjax line says why)."""
  hold = _Hold()
  loggers = [std_logging.getLogger(n) for n in ("absl", "asyncio", "")]
  for logger in loggers:
    logger.addFilter(hold)
  ok = False
  try:
    yield
    ok = True
  finally:
    for logger in loggers:
      logger.removeFilter(hold)
    if ok:
      for record in hold.records:
        std_logging.getLogger(record.name).handle(record)

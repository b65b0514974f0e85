"""A progress line for long prepares: documents, MB of text per second, ETA."""

from __future__ import annotations

import time
from typing import Iterable, Iterator, Sequence

from absl import logging

# Seconds between two progress lines: often enough to see a prepare move,
# rarely enough not to flood the log.
INTERVAL_S = 10.0


def counted(docs: Iterable[tuple[str, Sequence[str]]], what: str,
            total: int | None = None, interval_s: float | None = None
            ) -> Iterator[tuple[str, Sequence[str]]]:
  """Passes documents through, logging progress every ``interval_s`` seconds.

  The line reads e.g. 'train: 12000/50000 documents, 41.3 MB of text,
  3.2 MB/s, ETA 3 min' (ETA only when ``total`` is known).
  """
  interval_s = INTERVAL_S if interval_s is None else interval_s
  start = last = time.monotonic()
  count = nbytes = 0
  for doc in docs:
    yield doc
    count += 1
    nbytes += sum(len(s) for s in doc[1])
    now = time.monotonic()
    if now - last >= interval_s:
      last = now
      rate = nbytes / 1e6 / max(now - start, 1e-9)
      line = (f"{what}: {count}{f'/{total}' if total else ''} documents, "
              f"{nbytes / 1e6:.1f} MB of text, {rate:.1f} MB/s")
      if total:
        eta = (now - start) / count * (total - count)
        line += f", ETA {eta / 60:.0f} min" if eta >= 60 else f", ETA {eta:.0f} s"
      logging.info("%s", line)

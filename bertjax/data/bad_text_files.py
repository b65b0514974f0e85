"""Which local text files prepare leaves out, decided per file.

A file that is binary (NUL bytes), UTF-16 or otherwise not UTF-8 anywhere is
skipped whole, as is one with no text; never a part of it. Large files are
read in pieces by separate units (bertjax/data/units.py), so one unit may
find a bad byte in a file whose other pieces another unit has already made
into documents. Each unit therefore reports, per file, what it found in its
own pieces (``decode``'s findings merged by ``worse``); ``verdicts`` merges the units'
reports, and ``exclude`` names the units to run again without the files
found bad elsewhere. The verdict, and the byte offset it names, are the same
whatever ``config.prepare_block_mb``: a file is bad iff one of its pieces is
(pieces are cut at character boundaries, and valid pieces join into valid
text), and the offset is the file's first NUL byte, else its first invalid
UTF-8 byte.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

EMPTY = "empty"
NOT_UTF8 = "not UTF-8"
UTF16 = "UTF-16, not UTF-8"
BINARY = "binary (NUL bytes)"

# What to do about each kind of file, said once in the warning.
_FIX = {
    NOT_UTF8: "re-encode them as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove the "
              "bad bytes",
    UTF16: "convert them to UTF-8 (iconv -f utf-16 -t utf-8)",
    BINARY: "leave them out of --config.text_files, or remove the NUL bytes if they are text",
}
_LISTED = 20  # files named in one warning


def decode(data: bytes) -> tuple[str | None, tuple[str, int] | None]:
  """(text, None) of a piece's bytes that are UTF-8 text, else (None,
  (reason, offset of the first bad byte in ``data``)): a NUL byte anywhere
  makes a file binary (the caller makes that UTF-16 at offset 0, its
  byte-order mark, where the file starts with one: its NUL bytes are text);
  else the first invalid UTF-8 byte makes it not UTF-8."""
  nul = data.find(b"\x00")
  if nul >= 0:
    return None, (BINARY, nul)
  try:
    return data.decode("utf-8"), None
  except UnicodeDecodeError as e:
    return None, (NOT_UTF8, e.start)


def worse(a: tuple[str, int] | None, b: tuple[str, int] | None) -> tuple[str, int] | None:
  """One file's two findings merged: NUL bytes (binary, UTF-16) outrank
  invalid UTF-8, as they do within one piece; then the earlier byte."""
  if a is None or b is None:
    return a or b
  rank = lambda f: (f[0] == NOT_UTF8, f[1])
  return min(a, b, key=rank)


def verdicts(tasks: Sequence[Any], receipts: Sequence[dict[str, Any]]
             ) -> dict[str, tuple[str, int | None]]:
  """file name -> (reason, offset of its first bad byte; None for empty) of
  every file skipped whole, from the units' ``run_text`` receipts: bad where
  any unit found a bad byte in it, empty where every unit holding a piece of
  it found only whitespace there."""
  bad: dict[str, tuple[str, int]] = {}
  for receipt in receipts:
    for name, found in receipt["stats"]["bad"].items():
      bad[name] = worse(bad.get(name), tuple(found))
  blank: dict[str, bool] = {}
  for task, receipt in zip(tasks, receipts):
    said = set(receipt["stats"]["blank"])
    for name in {p.name for p in task.pieces} - set(task.excluded):
      blank[name] = blank.get(name, True) and name in said
  out: dict[str, tuple[str, int | None]] = dict(bad)
  out.update({n: (EMPTY, None) for n, b in blank.items() if b and n not in bad})
  return out


def exclude(tasks: Sequence[Any], receipts: Sequence[dict[str, Any]]
            ) -> tuple[list[Any], list[Any]]:
  """(every task with ``excluded`` naming the files of its pieces that
  another unit found bad and it found text in, the tasks among them to run
  again: those whose receipt was not made so; a resumed prepare whose
  reruns finished has none)."""
  bad = {name for r in receipts for name in r["stats"]["bad"]}
  out, todo = [], []
  for task, receipt in zip(tasks, receipts):
    clean = ({p.name for p in task.pieces} - set(receipt["stats"]["bad"])
             - set(receipt["stats"]["blank"]))
    task = dataclasses.replace(task, excluded=tuple(sorted(clean & bad)))
    out.append(task)
    if list(task.excluded) != receipt["stats"]["excluded"]:
      todo.append(task)
  return out, todo


def _by_reason(found: dict[str, tuple[str, int | None]]) -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for name in sorted(found):
    out.setdefault(found[name][0], []).append(name)
  return out


def warn(found: dict[str, tuple[str, int | None]], path_of: dict[str, str], log) -> None:
  """One warning per reason, naming each file (up to _LISTED) with the offset
  of its first bad byte, and what to do about them."""
  for reason, names in sorted(_by_reason(found).items()):
    listed = ", ".join(
        path_of[n] + ("" if found[n][1] is None else f" (first bad byte at offset {found[n][1]})")
        for n in names[:_LISTED])
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    fix = (f"; {_FIX[reason]}, then prepare into a new --config.data_dir to include them"
           if reason in _FIX else "")
    log("Skipped %d %s text file(s) whole: %s%s%s.", len(names), reason, listed, more, fix)


def summary(found: dict[str, tuple[str, int | None]], path_of: dict[str, str]) -> str:
  """'1 binary (NUL bytes): a.bin; 1 not UTF-8: b.txt' for an error."""
  return "; ".join(f"{len(names)} {reason}: {', '.join(path_of[n] for n in names[:5])}"
                   for reason, names in sorted(_by_reason(found).items()))

"""The one path layer: every workdir and data_dir path goes through here.

Paths are ``etils.epath`` paths, so a ``gs://bucket/...`` workdir or data_dir
works wherever a local one does. What differs between a local disk and an
object store is decided here and nowhere else:

* ``absolute`` makes a local path absolute and leaves a URL alone (joining
  ``gs://...`` onto the current directory would write under ``./gs:``).
* ``write_text`` is atomic on both: a temporary file renamed into place
  locally; a single object upload (which GCS makes visible whole) remotely.
* ``JsonLines`` appends rows. An object cannot be appended to, so on a
  remote path the rows written so far are kept and the object is rewritten
  whole on each flush (gcsfs's ``'a'`` mode silently overwrites).
* ArrayRecord, the shard format, reads and writes local files only in its
  open-source build (its Riegeli file layer has no GCS backend), so a remote
  data_dir is mirrored locally (bertjax/mirror.py, built on this module).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from typing import Iterator

from etils import epath

# Directories of unfinished work (a dataset's units), left out of listings
# unless asked for.
SKIP_DIRS = (".staging",)
_SLASHES = re.compile(r"//+")


def is_remote(path: str | os.PathLike) -> bool:
  """True for a URL such as ``gs://bucket/dir`` (anything with ``://``)."""
  return "://" in os.fspath(path)


def absolute(path: str | os.PathLike) -> str:
  """A local path made absolute (``~`` expanded); a URL with its runs of
  slashes after ``scheme://`` made one and a trailing one dropped.

  Every user path enters through here, so ``gs://b//run`` and ``gs://b/run/``
  name the objects of ``gs://b/run`` for every operation: gcsfs and
  tensorstore would take the empty segment for part of the object names
  (``b//run/x`` is another object than ``b/run/x``), while epath drops it, so
  a run's checkpoints, mirror and metrics would otherwise part ways.
  """
  path = os.fspath(path)
  if is_remote(path):
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{_SLASHES.sub('/', rest)}".rstrip("/")
  return os.path.abspath(os.path.expanduser(path))


def path(p: str | os.PathLike, *parts: str) -> epath.Path:
  """``absolute(p)`` (joined with ``parts``) as an ``epath.Path``."""
  return epath.Path(absolute(p)).joinpath(*parts)


def join(base: str | os.PathLike, *parts: str) -> str:
  """``base/part/...`` as a string, for local paths and URLs alike."""
  return os.fspath(path(base).joinpath(*parts))


def exists(p: str | os.PathLike) -> bool:
  return path(p).exists()


def isdir(p: str | os.PathLike) -> bool:
  return path(p).is_dir()


def file_in_the_way(p: str | os.PathLike) -> str | None:
  """The file that stands where the directory ``p`` (or one of its parents)
  should be, or None: a local path only (an object store has no files that
  block a prefix)."""
  if is_remote(p):
    return None
  current = os.path.abspath(os.fspath(p))
  while True:
    if os.path.exists(current) and not os.path.isdir(current):
      return current
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent


def require_directory(p: str | os.PathLike, flag: str) -> None:
  """Raises ValueError, naming ``flag`` (e.g. '--workdir'), when a file
  stands where the directory ``p`` is to be (it need not exist yet)."""
  blocker = file_in_the_way(p)
  if blocker is not None:
    where = "is a file" if blocker == os.path.abspath(os.fspath(p)) else (
        f"lies under the file {blocker}")
    raise ValueError(
        f"{flag}={os.fspath(p)} {where}, not a directory; pass the path of a "
        "directory (it is created if missing).")


def unwritable(p: str | os.PathLike) -> str | None:
  """The local directory that keeps ``p`` from being written: ``p`` itself
  when it exists and is read-only, or, for a ``p`` still to be created, its
  nearest existing parent when that is; None when ``p`` can be written (and
  for a URL, whose permissions only the store knows)."""
  if is_remote(p):
    return None
  current = os.path.abspath(os.fspath(p))
  while not os.path.exists(current) and os.path.dirname(current) != current:
    current = os.path.dirname(current)
  effective = os.access in os.supports_effective_ids
  if os.path.isdir(current) and not os.access(
      current, os.W_OK | os.X_OK, effective_ids=effective):
    return current
  return None


def denial(blocker: str) -> str:
  """Why the local ``blocker`` (from ``unwritable``) cannot be written:
  'read-only filesystem' where it is mounted so, else 'permission denied'."""
  try:
    if os.statvfs(blocker).f_flag & os.ST_RDONLY:
      return "read-only filesystem"
  except OSError:
    pass
  return "permission denied"


def require_writable(p: str | os.PathLike, flag: str, what: str) -> None:
  """Raises ValueError, naming ``what`` (e.g. 'the workdir') and ``flag``,
  when the local directory ``p`` cannot be written or created."""
  blocker = unwritable(p)
  if blocker is None:
    return
  where = "" if blocker == os.path.abspath(os.fspath(p)) else (
      f": {blocker}, where it would be created, is read-only")
  raise ValueError(
      f"Cannot write to {what} {os.fspath(p)} ({denial(blocker)}{where}); make it "
      f"writable or pass another {flag}.")


def require_bucket(p: str | os.PathLike, flag: str) -> None:
  """Raises ValueError, naming ``flag``, when the remote ``p`` lies in a bucket
  that does not exist (a mistyped name would otherwise surface only at the
  first upload, after the data is prepared); a local path passes. Lists the
  bucket's top level, which needs no permission beyond reading its objects."""
  if not is_remote(p) or exists(p):
    return
  scheme, rest = absolute(p).split("://", 1)
  bucket = f"{scheme}://{rest.split('/', 1)[0]}"
  try:
    next(iter(path(bucket).iterdir()), None)
  except FileNotFoundError:
    raise ValueError(
        f"{flag}={os.fspath(p)} lies in the bucket {bucket}, which does not "
        f"exist; create it (gcloud storage buckets create {bucket}) or fix the "
        "bucket's name.") from None


# Sampled by ``file_stamp``: its first, middle and last block of this many bytes.
_STAMP_BLOCK = 1 << 16


def file_stamp(p: str | os.PathLike) -> str:
  """A cheap identity of the content of the file ``p`` as it is now, which an
  edit changes even when it keeps the file's size.

  Locally: size, ``st_mtime_ns`` and the sha256 of the first, middle and last
  64 KiB (a tool that restores the mtime after an edit, or a filesystem with
  coarse times, is still caught where the edit touches a sampled block; the
  file is never read whole unless it is that small). On an object store: the
  object's generation (GCS gives every write a new one), else its checksum
  or ETag, from one metadata request and no read.
  """
  if is_remote(p):
    import fsspec  # pylint: disable=g-import-not-at-top  (gcsfs comes with it)
    fs, inner = fsspec.core.url_to_fs(absolute(p))
    info = fs.info(inner)
    for key in ("generation", "crc32c", "md5Hash", "ETag", "etag"):
      if info.get(key):
        return f"{info.get('size')}:{key}={info[key]}"
    return f"{info.get('size')}:mtime={info.get('mtime') or info.get('updated')}"
  st = os.stat(absolute(p))
  digest = hashlib.sha256()
  with open(absolute(p), "rb") as f:
    for start in sorted({0, max(st.st_size // 2 - _STAMP_BLOCK // 2, 0),
                         max(st.st_size - _STAMP_BLOCK, 0)}):
      f.seek(start)
      digest.update(f.read(_STAMP_BLOCK))
  return f"{st.st_size}:{st.st_mtime_ns}:{digest.hexdigest()[:16]}"


# A ctime older than its stamp by more than this (coarser than any filesystem's
# time granularity) proves, while unchanged, that the content is unchanged.
_CTIME_MARGIN_NS = 2_000_000_000


def stamp_with_ctime(p: str | os.PathLike) -> tuple[str, int | None]:
  """``file_stamp(p)`` and the local file's ``st_ctime_ns`` when it may stand
  for it later (see ``same_stamp``), else None (a URL; a file changed within
  two seconds of the stamp, whose next edit could keep a coarse ctime)."""
  if is_remote(p):
    return file_stamp(p), None
  # Taken before the content is sampled: an edit after it changes the ctime.
  ctime = os.stat(absolute(p)).st_ctime_ns
  stamp = file_stamp(p)
  return stamp, ctime if ctime < time.time_ns() - _CTIME_MARGIN_NS else None


def same_stamp(p: str | os.PathLike, stamp: str, ctime: int | None) -> bool:
  """Whether the file ``p`` still has the content ``stamp`` (from
  ``stamp_with_ctime``), reading no content where it can: nothing changes a
  local file (a write, ``touch -r``, ``rsync -t``, a rename over it) without
  setting its ctime to the present, which no tool can put back, so an
  unchanged size, mtime and ctime is proof; else the stamp is taken again."""
  if ctime is not None and not is_remote(p):
    try:
      st = os.stat(absolute(p))
    except OSError:
      return False
    if st.st_ctime_ns == ctime and f"{st.st_size}:{st.st_mtime_ns}:" == (
        stamp.rsplit(":", 1)[0] + ":"):
      return True
  try:
    return file_stamp(p) == stamp
  except OSError:
    return False


def read_text(p: str | os.PathLike) -> str:
  return path(p).read_text(encoding="utf-8")


def read_json(p: str | os.PathLike):
  return json.loads(read_text(p))


def makedirs(p: str | os.PathLike) -> None:
  """Creates a local directory; a no-op on an object store, which has none."""
  path(p).mkdir(parents=True, exist_ok=True)


def write_text(p: str | os.PathLike, text: str) -> None:
  """Writes ``text`` so that a reader sees the old content or the new, whole."""
  target = path(p)
  if is_remote(target):
    target.write_text(text, encoding="utf-8")
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.parent / tmp_name(target.name)
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, target)


def write_bytes(p: str | os.PathLike, data: bytes) -> None:
  """Writes ``data`` so that a reader sees the old content or the new, whole."""
  target = path(p)
  if is_remote(target):
    target.write_bytes(data)
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.parent / tmp_name(target.name)
  tmp.write_bytes(data)
  os.replace(tmp, target)


def write_json(p: str | os.PathLike, obj, *, indent: int | None = None) -> None:
  write_text(p, json.dumps(obj, indent=indent))


def _row_after(line: str, step: int) -> bool:
  """Whether the JSON row ``line`` logs a step after ``step`` (a line that
  does not parse, such as one cut short by a crash, is kept)."""
  try:
    row = json.loads(line)
  except ValueError:
    return False
  return isinstance(row, dict) and isinstance(row.get("step"), int) and (
      row["step"] > step)


class JsonLines:
  """Appends JSON rows to one file; on an object store, rewrites it whole.

  An object cannot be appended to, so on an object store every upload is the
  whole file. With ``min_interval_s`` > 0 a row is uploaded at once only when
  that long has passed since the last upload (the first row always is);
  ``flush()`` and ``close()`` upload what is pending. Local files get every
  row at once.
  """

  def __init__(self, p: str | os.PathLike, *, min_interval_s: float = 0.0,
               drop_after_step: int | None = None):
    """``drop_after_step``: a run resumed from that step's checkpoint redoes
    the steps after it, so the rows an interrupted run logged for them are
    dropped first (the file is rewritten whole, once); rows without a step
    and rows up to it stay."""
    self.path = path(p)
    self._remote = is_remote(self.path)
    self._min_interval_s = float(min_interval_s)
    self._last_upload = -float("inf")
    self._dirty = False
    if drop_after_step is not None and self.path.exists():
      text = self.path.read_text(encoding="utf-8")
      kept = [line for line in text.splitlines(keepends=True)
              if not _row_after(line, drop_after_step)]
      if len(kept) < len(text.splitlines()):
        write_text(self.path, "".join(kept))
    if self._remote:
      self._text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
      self._file = None
    else:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._file = open(self.path, "a", encoding="utf-8")
      if self._file.tell():
        with open(self.path, "rb") as f:
          f.seek(-1, os.SEEK_END)
          if f.read(1) != b"\n":  # a row cut short by a kill keeps its own line
            self._file.write("\n")

  def write(self, row, *, flush: bool = False) -> bool:
    """Appends ``row``; returns whether the file is now complete where it
    lives (always, locally)."""
    line = json.dumps(row) + "\n"
    if not self._remote:
      self._file.write(line)
      self._file.flush()
      return True
    self._text += line
    self._dirty = True
    if flush or time.monotonic() - self._last_upload >= self._min_interval_s:
      self.flush()
    return not self._dirty

  def write_pending(self) -> bool:
    """Whether rows are waiting for an upload."""
    return self._dirty

  def flush(self) -> None:
    if self._remote and self._dirty:
      self.path.write_text(self._text, encoding="utf-8")
      self._last_upload = time.monotonic()
      self._dirty = False

  def close(self) -> None:
    self.flush()
    if self._file is not None:
      self._file.close()
      self._file = None


def walk_files(root: str | os.PathLike, *, staging: bool = False
               ) -> Iterator[tuple[str, int]]:
  """Yields ``(relative path, size)`` for every file under ``root``, sorted.

  Works on object stores, where ``**`` globs are refused; skips staging
  directories, which hold unfinished work, unless ``staging``.
  """
  root = path(root)
  if not root.exists():
    return
  stack = [root]
  found = []
  while stack:
    directory = stack.pop()
    for child in directory.iterdir():
      if child.is_dir():
        if staging or child.name not in SKIP_DIRS:
          stack.append(child)
      else:
        found.append((os.fspath(child.relative_to(root)), child.stat().length))
  yield from sorted(found)


def tmp_name(name: str) -> str:
  # Per process and thread: Beam runs units on threads of one process too.
  return f".{name}.tmp-{os.getpid()}-{threading.get_ident()}"

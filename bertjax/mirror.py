"""The local mirror of a remote (gs://) directory, for libraries that read
and write local files only.

ArrayRecord, the shard format, reads and writes local files only in its
open-source build (its Riegeli file layer has no GCS backend), so a remote
data_dir is mirrored: ``local_mirror`` names the local copy, ``pull``
fetches what the remote holds, and ``push`` uploads what was prepared,
markers last (bertjax/data/prepare.py). ``fetched`` does the same for one
file or directory a library must read locally (tokenizers, torch).
Paths go through the path layer (bertjax/paths.py), which names these too.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re

from bertjax import paths
from bertjax import workdir_lock

# Written last by ``push`` and checked first by readers: a dataset is only
# trusted once these exist, so a push cut short is never taken for data.
MARKERS = ("dataset_info.json", "features.json", "bertjax_shards.json")
# Files smaller than this (records, markers, which may change at the same
# size) are compared by content hash when the sizes agree.
_COMPARE_BELOW = 1 << 16


# The temporary names the path layer and the staging write under before a
# rename (``paths.tmp_name``, ``<shard>.tmp-<pid>``): a process that died
# between the two left one, which is no data and must not travel between mirror and bucket.
_TMP = re.compile(r"\.tmp-\d+(-\d+)?$")
# Locks (bertjax/workdir_lock.py, bertjax/gcs_lease.py): the mirror's is held
# by this machine, the bucket's by whichever machine prepares; neither is data.
_LOCKS = (workdir_lock.LOCK_FILE, workdir_lock.DATA_LOCK_FILE)


def _travels(rel: str) -> bool:
  """Whether the file ``rel`` is copied between mirror and bucket."""
  return not _TMP.search(rel) and os.path.basename(rel) not in _LOCKS


def _listing(root: str, staging: bool) -> dict[str, tuple[int, bytes | None]]:
  """``relative path -> (size, md5 or None)`` of the files under ``root``
  (staging directories only with ``staging``). On an object store, one
  fresh recursive listing, which carries each object's size and md5 (no
  download, and nothing another process wrote since is missed); locally the
  md5 is left None, to be hashed only where needed."""
  if not paths.is_remote(root):
    return {rel: (size, None) for rel, size in paths.walk_files(root, staging=staging)
            if _travels(rel)}
  import fsspec  # pylint: disable=g-import-not-at-top  (gcsfs comes with it)
  fs, inner = fsspec.core.url_to_fs(root)
  fs.invalidate_cache(inner)
  try:
    found = fs.find(inner, detail=True)
  except FileNotFoundError:
    return {}
  out = {}
  for name, info in found.items():
    rel = os.path.relpath(name, inner)
    parts = rel.split(os.sep)
    if (info.get("type") == "directory" or rel == "." or rel.startswith("..")
        or not _travels(rel)):
      continue
    if not staging and any(part in paths.SKIP_DIRS for part in parts[:-1]):
      continue
    md5 = info.get("md5Hash")
    out[rel] = (int(info.get("size") or 0), base64.b64decode(md5) if md5 else None)
  return out


def _same_content(a: str, a_md5: bytes | None, b: str, b_md5: bytes | None) -> bool:
  """Whether the files ``a`` and ``b`` (of one size, under ``_COMPARE_BELOW``)
  hold the same bytes, by their md5s (a local file's hashed here)."""
  try:
    digests = [md5 if md5 is not None or paths.is_remote(p) else
               hashlib.md5(paths.path(p).read_bytes()).digest()
               for p, md5 in ((a, a_md5), (b, b_md5))]
  except OSError:
    return False
  return digests[0] is not None and digests[0] == digests[1]


def _copy_tree(src: str, dst: str, staging: bool = False) -> int:
  """Copies files of ``src`` missing in ``dst`` or of another size, and small
  files of the same size whose content differs (records and markers may
  change at the same size; hashes read from the listing, so an unchanged
  mirror costs no download); markers last. Staging directories only with
  ``staging``. Returns the number of files copied."""
  have = _listing(dst, staging)
  todo = [(rel, size) for rel, (size, md5) in sorted(_listing(src, staging).items())
          if have.get(rel, (None,))[0] != size or (size < _COMPARE_BELOW and not (
              _same_content(paths.join(src, rel), md5, paths.join(dst, rel),
                            have[rel][1])))]
  todo.sort(key=lambda item: (os.path.basename(item[0]) in MARKERS, item[0]))
  for rel, _ in todo:
    target = paths.path(dst) / rel
    if not paths.is_remote(target):
      target.parent.mkdir(parents=True, exist_ok=True)
      tmp = target.parent / paths.tmp_name(target.name)
      try:
        (paths.path(src) / rel).copy(tmp, overwrite=True)
        os.replace(tmp, target)
      except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: no partial copy left behind
        raise
    else:
      (paths.path(src) / rel).copy(target, overwrite=True)
  return len(todo)


def cache_root() -> str:
  """Where remote data is mirrored: ``$BERTJAX_CACHE_DIR`` or ``~/.cache/bertjax``."""
  return paths.absolute(os.environ.get("BERTJAX_CACHE_DIR") or "~/.cache/bertjax")


def local_mirror(remote: str | os.PathLike) -> str:
  """The local directory that mirrors the remote directory ``remote``."""
  remote = paths.absolute(remote)
  scheme, rest = remote.split("://", 1)
  digest = hashlib.sha256(remote.encode()).hexdigest()[:12]
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rest)[-80:]
  return os.path.join(cache_root(), "mirror", f"{scheme}-{safe}-{digest}")


def fetched(p: str | os.PathLike) -> str:
  """A local path with the content of ``p``: ``p`` itself when local, else its
  mirror, refreshed (a file or a directory), for libraries that read only
  local files (tokenizers, torch, ArrayRecord)."""
  if not paths.is_remote(p):
    return paths.absolute(p)
  remote = paths.absolute(p)
  local = local_mirror(remote)
  if paths.path(remote).is_dir():
    pull(remote, local)
  else:
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = os.path.join(os.path.dirname(local), paths.tmp_name(os.path.basename(local)))
    paths.path(remote).copy(tmp, overwrite=True)
    os.replace(tmp, local)
  return local


def fetched_within(root: str | os.PathLike, p: str | os.PathLike) -> str:
  """``fetched`` for a directory ``p`` under a remote ``root``: its copy lands
  at the same place under ``local_mirror(root)``, so that paths relative to
  the root (a data_dir's datasets and tokenizers) stay valid locally."""
  if not paths.is_remote(p):
    return paths.absolute(p)
  root, p = paths.absolute(root), paths.absolute(p)
  rel = os.path.relpath(p.split("://", 1)[1], root.split("://", 1)[1])
  if rel.startswith(".."):
    raise ValueError(f"{p} is not under {root}")
  local = os.path.join(local_mirror(root), rel)
  pull(p, local)
  return local


def pull(remote: str | os.PathLike, local: str | os.PathLike, *,
         staging: bool = False) -> int:
  """Copies into ``local`` every file of ``remote`` it lacks; returns the count.
  Staging directories (unfinished datasets' units) only with ``staging``."""
  return _copy_tree(paths.absolute(remote), paths.absolute(local), staging)


def push(local: str | os.PathLike, remote: str | os.PathLike, *,
         staging: bool = False) -> int:
  """Uploads every file of ``local`` that ``remote`` lacks, markers last.
  Staging directories only with ``staging``."""
  return _copy_tree(paths.absolute(local), paths.absolute(remote), staging)

"""A byte-for-byte picture of a directory tree, to prove a refusal wrote nothing."""

import hashlib
import os


def tree_hash(path):
  """{relative path: SHA-256 of the file's bytes, or 'dir'} under ``path``;
  None if ``path`` does not exist."""
  if not os.path.exists(path):
    return None
  out = {}
  for dirpath, dirs, files in os.walk(path):
    for name in dirs:
      out[os.path.relpath(os.path.join(dirpath, name), path)] = "dir"
    for name in files:
      full = os.path.join(dirpath, name)
      with open(full, "rb") as f:
        out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
  return out

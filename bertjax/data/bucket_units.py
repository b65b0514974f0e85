"""prepare's units on Beam workers that share nothing but a gs:// data_dir.

A remote data_dir is prepared in a local mirror on the launching machine
(bertjax/data/prepare.py), and its units' tasks name paths in that mirror.
A Beam worker (Dataflow, Spark, Flink, or the local DirectRunner standing in
for them) cannot see the launcher's disk, so around a Beam run:

1. the launcher uploads what the mirror holds and the bucket lacks (the text
   dataset, the tokenizer, the phrase/entity lists the units read);
2. every path in the tasks that lies in the mirror is rewritten to the same
   place in the bucket (``rebase``);
3. the worker reads its inputs through a local copy of what it needs
   (``units.TextSource.open``, ``units.load_tokenizer``, ``Marker.read``: the
   dataset it reads from, pulled once per worker machine into its own cache,
   ``$BERTJAX_CACHE_DIR``), and writes its staged shard and receipt straight
   into the bucket (``staged.Stage`` writes gs:// paths: ArrayRecord locally,
   then one upload, receipt last);
4. the launcher pulls the staged units back into its mirror and publishes
   there, as after a local run; ``prepare`` uploads the result at the end.

A unit's output depends on its input alone, so the shards are the same
bytes as a single-machine prepare's (tests/test_gcs.py). A killed run leaves
finished units' receipts in the bucket's staging; the next run pulls them
and redoes only the others.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from absl import logging

from bertjax import mirror
from bertjax import paths


def rebase(obj: Any, old: str, new: str) -> Any:
  """``obj`` with every string path at or under ``old`` moved under ``new``.

  Walks frozen dataclasses, tuples and lists (the tasks of
  bertjax/data/units.py); other values are returned as they are.
  """
  if isinstance(obj, str):
    if obj == old:
      return new
    if obj.startswith(old.rstrip(os.sep) + os.sep):
      rel = obj[len(old.rstrip(os.sep)) + 1:]
      return paths.join(new, *rel.split(os.sep))
    return obj
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    changes = {f.name: rebase(getattr(obj, f.name), old, new)
               for f in dataclasses.fields(obj)}
    return dataclasses.replace(obj, **changes)
  if isinstance(obj, tuple):
    return tuple(rebase(x, old, new) for x in obj)
  if isinstance(obj, list):
    return [rebase(x, old, new) for x in obj]
  return obj


def _output_dir(task: Any) -> str:
  """The dataset directory a task stages its unit in (units.py's tasks)."""
  for name in ("dataset_dir", "stage_dir"):
    if hasattr(task, name):
      return getattr(task, name)
  raise TypeError(f"{type(task).__name__} names no output directory")


def run(run_unit, tasks: Sequence[Any], *, local_root: str, remote_root: str,
        beam_runner: str, beam_options: Sequence[str]) -> None:
  """Runs ``tasks`` (paths in ``local_root``) on Beam against ``remote_root``."""
  from bertjax.data import workers  # pylint: disable=g-import-not-at-top
  sent = mirror.push(local_root, remote_root)
  logging.info("Uploaded %d files to %s for the Beam workers.", sent, remote_root)
  remote_tasks = [rebase(t, local_root, remote_root) for t in tasks]
  workers.run(run_unit, remote_tasks, workers=1, beam_runner=beam_runner,
              beam_options=beam_options)
  for local_dir in sorted({_output_dir(t) for t in tasks}):
    remote_dir = rebase(local_dir, local_root, remote_root)
    fetched = mirror.pull(remote_dir, local_dir, staging=True)
    logging.info("Fetched %d staged files of %s.", fetched, remote_dir)


def resume(local_root: str, remote_root: str) -> None:
  """Pulls the units a killed Beam run finished, so that they are not redone."""
  mirror.pull(remote_root, local_root, staging=True)


def clean(remote_root: str) -> None:
  """Removes the bucket's staging directories once prepare has finished (its
  datasets are published and its tokenizer's sample is no longer needed)."""
  root = paths.path(remote_root)
  staging = sorted({rel.split("/.staging/")[0]
                    for rel, _ in paths.walk_files(root, staging=True)
                    if "/.staging/" in rel})
  for dataset in staging:
    (root / dataset / ".staging").rmtree()

"""Orbax checkpoints: train state, data-iterator state and config, saved together.

A checkpoint directory ``<workdir>/checkpoints/<step>/`` holds three items:
  state   the TrainState (params, optimizer state, step), sharded arrays
  data    the input pipeline's iterator state and the tokenizer's fingerprint
          (JSON); with several processes also every process's iterator state
          (``iterators``, in process order), since each host reads its own
          share of the corpus and stands at its own position in it
  config  the run's config (JSON), compared with a resumed run's config
          (bertjax/compat.py) before anything is restored
and ``bertjax_manifest.json``, the checksums of all its files
(bertjax/checkpoint_manifest.py), written as soon as orbax has committed it.

Orbax writes each checkpoint into a temporary directory and renames it when
complete, so only fully written checkpoints are listed. Damage after that
(flipped bytes, deleted or truncated files) is found by the checksums: such a
checkpoint is renamed to ``<step>.unreadable`` (``.unreadable.1``, ... if that
exists; kept, never deleted), with one warning line, and the previous one is
tried. A restored state holding NaN/Inf is set aside the same way. When none
is usable the run stops (``NoUsableCheckpoint``); it never starts from step 0
on its own.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bertjax import checkpoint_manifest as manifest_lib
from bertjax import multihost
from bertjax import orbax_logs
from bertjax import paths
from bertjax import state as state_lib

ITEMS = ("state", "data", "config")
# Readers of checkpoints (bertjax.load, fine-tuning's init) call it by this name.
quiet_read_only = orbax_logs.quiet_read_only


def data_item(iterator_state: dict[str, Any], tokenizer_fingerprint: str) -> dict:
  """The ``data`` item. A collective with several processes: orbax writes JSON
  items from process 0 only, so the other hosts' positions travel with it."""
  data = {"iterator": iterator_state, "tokenizer_fingerprint": tokenizer_fingerprint}
  if jax.process_count() > 1:
    data["iterators"] = multihost.gather_json(iterator_state)
  return data


def own_iterator_state(data: dict[str, Any], where: str) -> dict[str, Any]:
  """This process's iterator state from a restored ``data`` item.

  A checkpoint saved by another number of processes (or by several before
  their positions were all saved) has no position for this host's share of
  the corpus: every host then continues from process 0's position in its own
  share, with a warning, and the batches differ from an uninterrupted run's.
  """
  states = data.get("iterators")
  saved_by = 1 if states is None else len(states)
  if saved_by == jax.process_count():
    return dict(data["iterator"] if states is None else states[jax.process_index()])
  logging.warning(
      "%s holds the data position of %d process(es) and this run has %d: each "
      "host continues from process 0's position in its own share of the corpus, "
      "so the batches are not those an uninterrupted run would have read.",
      where, saved_by, jax.process_count())
  return dict(data["iterator"])


class StateMismatch(ValueError):
  """A checkpoint that does not fit the state the config builds (its saved
  shapes differ, or it is intact and does not restore): another model, not
  damage."""


class NoUsableCheckpoint(ValueError):
  """Every checkpoint of the workdir was damaged and has been set aside."""


def _whole_array_writes_on_cpu() -> None:
  """On CPU, orbax writes each replicated array whole from its first replica.

  By default orbax splits a replicated array into one slice per replica, each
  written by the device holding it (``use_replica_parallel``): on a TPU pod
  that spreads the copies to host memory and the writes over the chips and
  hosts. CPU "devices" share the host's memory, so there the slicing is only
  dispatches and a compile per array shape: a tiny BERT's
  state replicated over 8 CPU devices saved in 0.27 s whole against 0.71 s
  in slices (docs/performance.md). Orbax turns it off for GPUs itself; this
  does the same for CPU, once per process, for every save after it. What is
  written is the same arrays in the same files. Orbax's jax.Array handler is
  replaced by one that differs only in that switch and keeps its array
  metadata store (the one attribute orbax itself reads off the handler); a
  handler other than orbax's own, or an orbax without that attribute, is
  left as it is.
  """
  if any(d.platform != "cpu" for d in jax.devices()):
    return
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if (type(handler) is not ocp.type_handlers.ArrayHandler
      or not hasattr(handler, "_array_metadata_store")):
    return  # already replaced (by this or by the user), or another orbax
  whole = _WholeArrayHandler(
      use_replica_parallel=False,
      array_metadata_store=handler._array_metadata_store)  # pylint: disable=protected-access
  with orbax_logs.quiet_handler_override():
    ocp.type_handlers.register_type_handler(jax.Array, whole, override=True)


class _WholeArrayHandler(ocp.type_handlers.ArrayHandler):
  """Orbax's ArrayHandler with replica-parallel writes off (its own type, so
  that ``_whole_array_writes_on_cpu`` sees it has run)."""


class _SealingManager(ocp.CheckpointManager):
  """A CheckpointManager that writes each checkpoint's manifest once committed.

  ``_finalize_checkpoint`` runs after orbax has renamed the finished checkpoint
  into place and before older ones are deleted, in orbax's background thread
  (or inline for a synchronous save), and ``wait_until_finished`` waits for
  it: the train loop never waits for the hashing.
  """

  def __init__(self, *args, **kwargs):
    _whole_array_writes_on_cpu()
    super().__init__(*args, **kwargs)

  def _finalize_checkpoint(self, step: int):
    result = super()._finalize_checkpoint(step)
    if jax.process_index() == 0:
      step_dir = epath.Path(self.directory) / str(step)
      try:
        if step_dir.is_dir():
          manifest_lib.write(step_dir)
      except OSError as e:
        logging.warning("Could not write the checksums of checkpoint %s (%s); it "
                        "will be restored unverified.", step_dir, e)
    return result


def newest_saved_config(workdir: str) -> tuple[int, dict[str, Any], str] | None:
  """(step, saved config, 'The checkpoint at step ... in ...') of the newest
  checkpoint whose config reads, or None; reads only, creates nothing.

  Lets a run refuse a mismatched config before it takes the workdir's lock or
  moves a damaged checkpoint aside.
  """
  directory = paths.join(workdir, "checkpoints")
  for step in reversed(manifest_lib.committed_steps(directory)):
    try:
      saved = manifest_lib.read_json_item(epath.Path(directory) / str(step), "config")
    except ValueError:
      continue  # damaged: set aside once the run holds the workdir
    return step, saved, f"The checkpoint at step {step} in {directory}"
  return None


class Checkpointer:
  """Saves, verifies and restores the three items of a bertjax checkpoint."""

  def __init__(self, workdir: str, *, keep: int = 3, read_only: bool = False,
               subdir: str = "checkpoints"):
    self.directory = paths.join(workdir, subdir)
    if read_only and not paths.isdir(self.directory):
      if paths.exists(workdir) and not paths.isdir(workdir):
        raise ValueError(
            f"{workdir} is a file, not a workdir; pass the directory a run "
            "wrote (`python -m bertjax.main --workdir=...`).")
      raise ValueError(
          f"No checkpoints under {self.directory}; train first with "
          "`python -m bertjax.main --workdir=...` or pass the workdir that has them.")
    if read_only:
      options = ocp.CheckpointManagerOptions(
          read_only=True, create=False, max_to_keep=None, save_interval_steps=0)
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    with orbax_logs.quiet_read_only():
      self._manager = _SealingManager(self.directory, options=options,
                                      item_names=ITEMS)
    self._verdicts: dict[int, manifest_lib.Verdict] = {}
    self.set_aside: list[tuple[int, str, str]] = []  # (step, reason, new name)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def step_dir(self, step: int) -> epath.Path:
    return epath.Path(self.directory) / str(step)

  def saved_config(self, step: int) -> dict[str, Any]:
    """The config the checkpoint of ``step`` was trained with."""
    return manifest_lib.read_json_item(self.step_dir(step), "config")

  def where(self, step: int) -> str:
    """Names the checkpoint of ``step`` at the start of a message."""
    return f"The checkpoint at step {step} in {self.directory}"

  def verify(self, step: int) -> manifest_lib.Verdict:
    """Checks ``step`` against its checksums (remembered for this run)."""
    if step not in self._verdicts:
      self._verdicts[step] = manifest_lib.verify(self.step_dir(step))
    return self._verdicts[step]

  def check_intact(self, step: int) -> None:
    """Raises ValueError naming the damage; for readers that must not move it."""
    verdict = self.verify(step)
    if verdict.status == manifest_lib.DAMAGED:
      raise ValueError(
          f"{self.where(step)} is damaged: {verdict.reason}; pass --step with "
          "another checkpoint, or run bertjax.main on the workdir to set it aside.")

  def _set_aside(self, step: int, reason: str) -> None:
    # Every host reaches the same verdict from the same files; only process 0
    # renames, the others just stop considering the step.
    if jax.process_index() == 0:
      name = manifest_lib.set_aside(self.step_dir(step)).name
    else:
      name = f"{step}{manifest_lib.ASIDE_SUFFIX}"
    logging.warning("Checkpoint %d in %s is unusable (%s); moved it to %s and "
                    "trying the previous one.", step, self.directory, reason, name)
    self.set_aside.append((step, reason, name))
    self._verdicts.pop(step, None)
    self._manager.reload()

  def usable_step(self, accept: Callable[[int], None] | None = None, *,
                  restart_from_scratch: bool = False) -> int | None:
    """The newest checkpoint that verifies; damaged newer ones are set aside.

    Args:
      accept: called with the chosen step before it is returned; raises
        (e.g. compat.IncompatibleCheckpoint) to refuse it. Nothing is moved
        for a refusal.
      restart_from_scratch: when every checkpoint was set aside (now or by an
        earlier run), return None (train from step 0) instead of raising.

    Returns:
      The step, or None for a workdir without checkpoints.

    Raises:
      NoUsableCheckpoint: checkpoints existed but none is usable.
    """
    gone = {s for s, _, _ in self.set_aside}
    for step in sorted(set(self.all_steps()) - gone, reverse=True):
      verdict = self.verify(step)
      if verdict.status == manifest_lib.DAMAGED:
        self._set_aside(step, verdict.reason)
        continue
      if accept is not None:
        accept(step)
      return step
    earlier = [n for n in manifest_lib.set_aside_names(self.directory)
               if n not in {a for _, _, a in self.set_aside}]
    if (self.set_aside or earlier) and not restart_from_scratch:
      parts = [f"{s} -> {a} ({r})" for s, r, a in self.set_aside]
      if earlier:
        parts.append("set aside by an earlier run: " + ", ".join(earlier))
      raise NoUsableCheckpoint(
          f"No usable checkpoint in {self.directory}: {'; '.join(parts)}; pass "
          "--config.restart_from_scratch=True to train from step 0 in this "
          "workdir, or pass a new --workdir.")
    return None

  def check_tokenizer(self, fingerprint: str, step: int | None = None) -> None:
    """Raises ValueError if the checkpoint was trained with another tokenizer."""
    step = self.latest_step() if step is None else step
    if step is None:
      return
    saved = manifest_lib.read_json_item(self.step_dir(step), "data")
    want = saved.get("tokenizer_fingerprint")
    if want and want != fingerprint:
      raise ValueError(
          f"{self.where(step)} was trained with tokenizer {want[:12]} but the "
          f"prepared data has tokenizer {fingerprint[:12]}; point "
          "--config.data_dir at the data it was trained on, or use a new --workdir.")

  def save(self, step: int, state, iterator_state: dict[str, Any], config,
           tokenizer_fingerprint: str, *, force: bool = False) -> bool:
    data = data_item(iterator_state, tokenizer_fingerprint)
    return self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data),
            config=ocp.args.JsonSave(config.to_dict()),
        ),
        force=force)

  def check_fits(self, step: int, abstract_state) -> None:
    """Raises StateMismatch, naming the first array that differs, when the
    state saved at ``step`` (its orbax metadata: names and shapes) does not
    have the leaves and shapes of ``abstract_state``; reads no array.

    Without it a mismatch showed only when orbax failed part-way through a
    restore, with reads of the other arrays left in flight. Metadata that
    cannot be read is left for the restore to report.
    """
    try:
      tree = ocp.StandardCheckpointHandler().metadata(self.step_dir(step) / "state").tree
      saved = {m.name: tuple(m.shape) for m in jax.tree.leaves(tree)
               if isinstance(m, ocp.metadata.ArrayMetadata)}
    except Exception:  # noqa: BLE001 — damaged or older: the restore says so
      return
    wanted = {name: tuple(getattr(a, "shape", ()))  # a Python scalar: ()
              for name, a in ocp.tree.to_flat_dict(abstract_state, sep=".").items()
              if a is not None}
    if not saved.keys() & wanted.keys():
      return  # names of another form (another orbax): the restore decides

    def order(names):  # parameters first: a user knows them; their moments follow
      return sorted(names, key=lambda n: (not n.startswith("params."), n))

    problems = [f"{n} is {saved[n]} in the checkpoint but {wanted[n]} in this config"
                for n in order(saved.keys() & wanted.keys()) if saved[n] != wanted[n]]
    problems += [f"{n} is missing from the checkpoint"
                 for n in order(wanted.keys() - saved.keys())]
    problems += [f"{n} is in the checkpoint but not in this config"
                 for n in order(saved.keys() - wanted.keys())]
    if problems:
      more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
      raise StateMismatch(
          f"{self.where(step)} does not fit the state this config builds: "
          f"{problems[0]}{more}; resume it with the config it was trained "
          "with, or pass a new --workdir.")

  def restore(self, step: int, abstract_state, shardings) -> tuple[Any, dict[str, Any]]:
    """Restores (state placed with ``shardings``, iterator state) of ``step``;
    StateMismatch (``check_fits``) before any read when the state differs."""
    self.check_fits(step, abstract_state)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state, shardings)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            data=ocp.args.JsonRestore(),
        ))
    logging.info("Restored checkpoint %d from %s", step, self.directory)
    return restored["state"], own_iterator_state(restored["data"], self.where(step))

  def restore_latest(self, abstract_state, shardings,
                     accept: Callable[[int], None] | None = None, *,
                     restart_from_scratch: bool = False):
    """Restores the newest usable checkpoint: (step, state, iterator state).

    Checkpoints that fail their checksums (``usable_step``) or hold NaN/Inf
    are set aside and the previous one is tried. A checkpoint that verifies
    but does not restore is not damaged: that raises ValueError and moves
    nothing. Returns None when there is no checkpoint (or, with
    ``restart_from_scratch``, none usable).
    """
    while True:
      step = self.usable_step(accept, restart_from_scratch=restart_from_scratch)
      if step is None:
        return None
      try:
        with orbax_logs.held_logs():
          state, iterator_state = self.restore(step, abstract_state, shardings)
      except StateMismatch:
        raise
      except Exception as e:  # noqa: BLE001 — reported in one line, not guessed at
        self._refuse_restore(step, e)
      bad = state_lib.nonfinite_leaves(state)
      if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        self._set_aside(step, f"NaN/Inf in {bad[0]}{more}")
        continue
      return step, state, iterator_state

  def _refuse_restore(self, step: int, error: Exception):
    first = (str(error).strip().splitlines() or [""])[0][:200]
    cause = f"{type(error).__name__}: {first}"
    if self.verify(step).status == manifest_lib.OK:
      raise StateMismatch(
          f"{self.where(step)} is intact (its checksums match) but does not "
          f"restore into the state this config builds ({cause}); resume it with "
          "the config it was trained with, or pass a new --workdir.") from error
    raise ValueError(
        f"{self.where(step)} has no checksums (an older bertjax, or killed "
        f"before they were written) and does not restore ({cause}); if it is "
        f"damaged, move it aside (mv {self.step_dir(step)} "
        f"{self.step_dir(step)}{manifest_lib.ASIDE_SUFFIX}) and run again to "
        "resume from the previous one.") from error

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


class BestCheckpoint:
  """Keeps, apart from the rolling checkpoints, the one with the lowest
  held-out loss: ``<workdir>/best_checkpoint/<step>/`` plus ``best.json``.

  Only written when the run evaluates during training
  (``config.eval_every_steps > 0``). Restoring it works like any checkpoint:
  ``Checkpointer`` pointed at the same items.
  """

  def __init__(self, workdir: str, *, metric: str = "held-out loss",
               sign: float = 1.0):
    """``metric`` names what is minimised in the log; ``sign`` turns the
    minimised value back into it (-1 where a higher metric is offered
    negated, as fine-tuning's accuracies are)."""
    self.directory = paths.join(workdir, "best_checkpoint")
    self._metric, self._sign = metric, sign
    self._record = paths.join(self.directory, "best.json")
    self._manager = None
    self.best = paths.read_json(self._record) if paths.exists(self._record) else None

  def offer(self, step: int, loss: float, state, iterator_state, config,
            tokenizer_fingerprint: str) -> bool:
    """Saves ``state`` if ``loss`` beats the best so far; returns whether it did."""
    if self.best is not None and not loss < self.best["loss"]:
      return False
    if self._manager is None:
      self._manager = _SealingManager(
          self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=1),
          item_names=ITEMS)
    data = data_item(iterator_state, tokenizer_fingerprint)
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
        config=ocp.args.JsonSave(config.to_dict())), force=True)
    self._manager.wait_until_finished()
    self.best = {"step": int(step), "loss": float(loss)}
    if jax.process_index() == 0:
      paths.write_json(self._record, self.best)
    logging.info("New best %s %.4f at step %d.", self._metric, self._sign * loss, step)
    return True

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()


def best_step(workdir: str) -> int | None:
  """The step ``best_checkpoint/`` holds (``best.json``), or None."""
  record = paths.join(workdir, "best_checkpoint", "best.json")
  return int(paths.read_json(record)["step"]) if paths.exists(record) else None


def open_step(workdir: str, step: int | None) -> tuple["Checkpointer", int]:
  """A read-only Checkpointer holding ``step`` of a pretraining workdir, and
  the step (the latest of ``checkpoints/`` when None; None when the workdir
  has no checkpoint at all).

  A step rotated out of ``checkpoints/`` but kept as the best evaluation's
  is read from ``best_checkpoint/``. ValueError naming the steps there are
  when ``step`` is neither; the caller says what to do when there is none.
  """
  checkpointer = Checkpointer(workdir, read_only=True)
  steps = checkpointer.all_steps()
  if step is None or step in steps:
    return checkpointer, (max(steps) if step is None and steps else step)
  best = best_step(workdir)
  if not steps and best is None:
    return checkpointer, None
  checkpointer.close()
  if step == best:
    return Checkpointer(workdir, read_only=True, subdir="best_checkpoint"), step
  kept = f" (or {best}, the best evaluation's, in best_checkpoint/)" if best else ""
  raise ValueError(f"No checkpoint for step {step} in {checkpointer.directory}; "
                   f"pass --step as one of {sorted(steps)}{kept}.")


def read_while_training(workdir: str, step: int | None, read):
  """``read(step)``, again on the new latest when a run training in
  ``workdir`` removes the latest checkpoint (``keep_checkpoints``) while it
  is read; a step the caller named that goes so is refused in one sentence.
  ``read`` must write nothing before it has read the checkpoint."""
  for _ in range(3):
    try:
      return read(step)
    except FileNotFoundError:
      if step is not None and paths.exists(paths.join(workdir, "checkpoints", str(step))):
        raise  # not the rotation: something else is missing
      if step is not None:
        raise ValueError(
            f"The checkpoint at step {step} in {paths.join(workdir, 'checkpoints')} "
            "was removed while it was read (a run training there keeps only its "
            "last config.keep_checkpoints); pass a --step it still has, or leave "
            "--step out to read the latest.") from None
      logging.info("The latest checkpoint of %s went while it was read (a run is "
                   "training there); reading the new latest.", workdir)
  return read(step)

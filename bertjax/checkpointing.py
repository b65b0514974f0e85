"""Orbax checkpoints: train state, data-iterator state and config, saved together.

A checkpoint directory ``<workdir>/checkpoints/<step>/`` holds three items:
  state   the TrainState (params, optimizer state, step), sharded arrays
  data    the input pipeline's iterator state and the tokenizer's fingerprint
          (JSON)
  config  the run's config (JSON), used to refuse a mismatched resume
Orbax writes each checkpoint into a temporary directory and renames it when
complete, so only fully written checkpoints are ever listed and restored.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

# Fields that fix the shapes of the parameters: a checkpoint can only be
# resumed by a config that agrees on all of them.
MODEL_SHAPE_FIELDS = ("model", "model_size", "vocab_size", "max_position_embeddings",
                      "type_vocab_size", "num_layers", "hidden_size", "num_heads",
                      "mlp_dim", "embedding_size", "layer_sharing", "sentence_head")


class Checkpointer:
  """Saves and restores the three items of a bertjax checkpoint."""

  def __init__(self, workdir: str, *, keep: int = 3, read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if read_only and not os.path.isdir(self.directory):
      raise ValueError(
          f"No checkpoints under {self.directory}; train first with "
          "`python -m bertjax.main --workdir=...` or pass the workdir that has them.")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=not read_only, read_only=read_only)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data", "config"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def saved_config(self, step: int) -> dict[str, Any]:
    restored = self._manager.restore(
        step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return dict(restored["config"])

  def check_compatible(self, config, step: int | None = None) -> None:
    """Raises ValueError if the checkpoint was made by a differently shaped model."""
    step = self.latest_step() if step is None else step
    if step is None:
      return
    saved = self.saved_config(step)
    for field in MODEL_SHAPE_FIELDS:
      if field in saved and saved[field] != config.get(field):
        raise ValueError(
            f"The checkpoint at step {step} in {self.directory} was trained with "
            f"{field}={saved[field]!r} but the config says {config.get(field)!r}; "
            f"pass --config.{field}={saved[field]!r} to resume it, or use a new "
            "--workdir for a different model.")

  def check_tokenizer(self, fingerprint: str, step: int | None = None) -> None:
    """Raises ValueError if the checkpoint was trained with another tokenizer."""
    step = self.latest_step() if step is None else step
    if step is None:
      return
    saved = self._manager.restore(
        step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
    want = saved.get("tokenizer_fingerprint")
    if want and want != fingerprint:
      raise ValueError(
          f"The checkpoint at step {step} in {self.directory} was trained with "
          f"tokenizer {want[:12]} but the prepared data has tokenizer "
          f"{fingerprint[:12]}; point --config.data_dir at the data it was "
          "trained on, or use a new --workdir.")

  def save(self, step: int, state, iterator_state: dict[str, Any], config,
           tokenizer_fingerprint: str, *, force: bool = False) -> bool:
    data = {"iterator": iterator_state, "tokenizer_fingerprint": tokenizer_fingerprint}
    return self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data),
            config=ocp.args.JsonSave(config.to_dict()),
        ),
        force=force)

  def restore(self, step: int, abstract_state, shardings) -> tuple[Any, dict[str, Any]]:
    """Restores (state placed with ``shardings``, iterator state) of ``step``."""
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
    return restored["state"], dict(restored["data"]["iterator"])

  def restore_latest(self, abstract_state, shardings):
    """Restores the newest readable checkpoint: (step, state, iterator state).

    A checkpoint that fails to restore (truncated or corrupted files) is
    renamed to ``<step>.unreadable`` (kept for inspection, never deleted) with
    a warning naming it, and the next older one is tried. Returns None when
    there is no checkpoint at all.
    """
    for step in sorted(self.all_steps(), reverse=True):
      try:
        state, iterator_state = self.restore(step, abstract_state, shardings)
      except Exception as e:  # noqa: BLE001 — any unreadable checkpoint falls back
        aside = os.path.join(self.directory, f"{step}.unreadable")
        logging.warning("Checkpoint %s/%d is unreadable (%s: %s); moved it to %s "
                        "and falling back to the previous one.", self.directory,
                        step, type(e).__name__, str(e)[:200], aside)
        os.rename(os.path.join(self.directory, str(step)), aside)
        self._manager.reload()
        continue
      return step, state, iterator_state
    return None

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

  def __init__(self, workdir: str):
    self.directory = os.path.join(os.path.abspath(workdir), "best_checkpoint")
    self._record = os.path.join(self.directory, "best.json")
    self._manager = None
    self.best = None
    if os.path.exists(self._record):
      with open(self._record, encoding="utf-8") as f:
        self.best = json.load(f)

  def offer(self, step: int, loss: float, state, iterator_state, config,
            tokenizer_fingerprint: str) -> bool:
    """Saves ``state`` if ``loss`` beats the best so far; returns whether it did."""
    if self.best is not None and not loss < self.best["loss"]:
      return False
    if self._manager is None:
      self._manager = ocp.CheckpointManager(
          self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=1),
          item_names=("state", "data", "config"))
    data = {"iterator": iterator_state, "tokenizer_fingerprint": tokenizer_fingerprint}
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
        config=ocp.args.JsonSave(config.to_dict())), force=True)
    self._manager.wait_until_finished()
    self.best = {"step": int(step), "loss": float(loss)}
    if jax.process_index() == 0:
      with open(self._record, "w", encoding="utf-8") as f:
        json.dump(self.best, f)
    logging.info("New best held-out loss %.4f at step %d.", loss, step)
    return True

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()

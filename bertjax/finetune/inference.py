"""A fine-tuned model in Python: what ``bertjax.load`` gives for a fine-tuning
workdir.

  model = bertjax.load("/tmp/ft-local")  # its best evaluation's parameters
  model.predict(["a cat", ("a premise", "a hypothesis")])  # classification, regression
  model.predict([["EU", "rejects", "German", "call"]])     # tagging: words
  model.predict([{"question": "Who?", "context": "..."}])  # extractive QA

``predict`` returns one record per input, as ``predict_<name>.jsonl`` has
them (``predict.records``): the prediction, each class's probability, the
answer ("" for no answer where the task has unanswerable questions).
The parameters are those of ``best_checkpoint/`` (``step`` picks a checkpoint
of ``checkpoints/`` instead). The encoder's architecture and tokenizer come
from the run's ``--init`` (recorded in ``init.json``), which must still be
readable (its config and tokenizer; its weights are not read); everything runs
in float32 with dropout off.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from bertjax import checkpointing
from bertjax import paths
from bertjax.finetune import features as features_lib
from bertjax.finetune import predict as predict_lib
from bertjax.finetune import tasks as tasks_lib


def is_workdir(path: str) -> bool:
  """Whether ``path`` is a fine-tuning workdir with a checkpoint."""
  return paths.exists(paths.join(path, "init.json")) and (
      paths.isdir(paths.join(path, "checkpoints"))
      or paths.isdir(paths.join(path, "best_checkpoint")))


def _saved(workdir: str, step: int | None) -> tuple[str, int, dict[str, Any]]:
  """(checkpoint directory, step, saved config) to load."""
  best = checkpointing.best_step(workdir)
  if best is not None and step in (None, best):  # the best, wherever else it is
    subdir, step = "best_checkpoint", best
  else:
    subdir = "checkpoints"
  with checkpointing.quiet_read_only():
    checkpointer = checkpointing.Checkpointer(workdir, read_only=True, subdir=subdir)
    steps = checkpointer.all_steps()
    if not steps:
      checkpointer.close()
      raise ValueError(f"No checkpoint in {checkpointer.directory} yet; load the workdir "
                       "once the run has saved one (every epoch's end).")
    if step is None:
      step = max(steps)
    if step not in steps:
      checkpointer.close()
      kept = f" (or {best}, the best evaluation's, in best_checkpoint/)" if best else ""
      raise ValueError(f"No checkpoint for step {step} in {checkpointer.directory}; "
                       f"pass step as one of {sorted(steps)}{kept}.")
    config = checkpointer.saved_config(step)
    checkpointer.close()
  return paths.join(workdir, subdir), step, config


def output_names(cfg) -> tuple[str, ...]:
  """The class or tag names the head's outputs stand for."""
  if cfg.get("output_names"):
    return tuple(cfg.output_names.split("\t"))
  if cfg.task_kind not in ("classification", "tagging"):
    return ()
  # A run from before the names were recorded: read its task again.
  try:
    return tasks_lib.load(cfg).label_names
  except ValueError as e:
    raise ValueError(f"This workdir was fine-tuned before bertjax recorded its label "
                     f"names, and its task cannot be read again to find them ({e})") from None


class FineTuned:
  """A fine-tuned encoder and head; ``predict`` (module docstring)."""

  def __init__(self, cfg, model, params, encoder, names: tuple[str, ...]):
    from bertjax import sharding
    from bertjax.finetune import loop
    self.config = cfg
    self.kind = cfg.task_kind
    self.task = tasks_lib.Task(self.kind, [], [], names)
    self._encoder = encoder
    self._mesh = sharding.make_mesh("1,1,1", devices=jax.local_devices()[:1])
    replicated = jax.sharding.NamedSharding(self._mesh, jax.sharding.PartitionSpec())
    self._params = jax.device_put(params, replicated)
    self._step = loop.predict_step(model, self.kind)

  def _examples(self, inputs) -> list[dict[str, Any]]:
    if isinstance(inputs, (str, dict)) or not isinstance(inputs, Sequence):
      raise ValueError("predict takes a list of inputs (one per example), not "
                       f"{type(inputs).__name__}; wrap a single input in a list.")
    out = []
    for i, x in enumerate(inputs):
      if self.kind in ("classification", "regression"):
        if isinstance(x, str):
          out.append({"text_a": x, "label": 0})
        elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x):
          out.append({"text_a": x[0], "text_b": x[1], "label": 0})
        else:
          raise ValueError(f"Input {i} is {x!r}; a {self.kind} model takes a text or a "
                           "(text, text) pair.")
      elif self.kind == "tagging":
        words = x.split() if isinstance(x, str) else x
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
          raise ValueError(f"Input {i} is {x!r}; a tagging model takes a list of words "
                           "(or a text, split at whitespace).")
        out.append({"words": list(words), "tags": [self.task.label_names[0]] * len(words)})
      else:
        if not (isinstance(x, dict) and isinstance(x.get("question"), str)
                and isinstance(x.get("context"), str)):
          raise ValueError(f"Input {i} is {x!r}; a QA model takes "
                           "{'question': ..., 'context': ...}.")
        out.append({"id": str(x.get("id", i)), "question": x["question"],
                    "context": x["context"], "answers": [], "answer_start": -1})
    if (self.kind in ("classification", "regression")
        and len({"text_b" in ex for ex in out}) > 1):
      raise ValueError("predict takes texts or (text, text) pairs, not both in one call.")
    return out

  def logits(self, inputs, batch_size: int = 32
             ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], np.ndarray]:
    """(examples, features, float32 head outputs per feature row) of
    ``inputs``: [rows, classes], [rows, length, tags] or [rows, length, 2]
    (QA start/end; a question may fill several rows). Token ids in the
    features are bertjax's (``tokenizer.to_hf_ids`` maps an import's back)."""
    from bertjax.finetune import loop
    examples = self._examples(inputs)
    if not examples:
      raise ValueError("predict takes at least one input.")
    feats = features_lib.build(self._encoder, self.task, examples, self.config)
    return examples, feats, loop.predict(self._step, self._params, feats, self.kind,
                                         batch_size, self._mesh)

  def predict(self, inputs, batch_size: int = 32) -> list[dict[str, Any]]:
    """One record per input (module docstring)."""
    if isinstance(inputs, Sequence) and not isinstance(inputs, str) and not inputs:
      return []
    examples, feats, logits = self.logits(inputs, batch_size)
    return predict_lib.records(self.task, examples, feats, logits, self.config)

  @property
  def tokenizer(self):
    return self._encoder.tokenizer

  def _not_pretrained(self, what: str):
    raise ValueError(
        f"This is a fine-tuned {self.kind} model (task {self.config.task!r}), whose head "
        f"predicts the task, not {what}; use predict(), or load the pretraining "
        "workdir or Hugging Face directory it was fine-tuned from (its --init) for "
        f"{what}.")

  def fill_mask(self, *args, **kwargs):
    del args, kwargs
    self._not_pretrained("masked tokens")

  def encode(self, *args, **kwargs):
    del args, kwargs
    self._not_pretrained("the pretrained model's outputs")

  embed = encode


@dataclasses.dataclass
class Saved:
  """What a fine-tuning workdir's checkpoint holds, read (``read``)."""
  config: Any  # the run's ConfigDict
  step: int
  init: str  # the --init path it was fine-tuned from
  fields: dict[str, Any]  # the encoder's config fields (from the init)
  tokenizer: Any
  model: Any  # heads.FineTuneModel
  params: Any  # numpy: {'encoder': ..., 'head': ...}


def read(workdir: str, step: int | None = None) -> Saved:
  """The checkpoint ``load`` loads (module docstring), as numpy."""
  import ml_collections
  import orbax.checkpoint as ocp
  from flax import linen as nn
  from bertjax import state as state_lib
  from bertjax.convert import core
  from bertjax.finetune import encoder_init
  from bertjax.models import heads
  workdir = paths.absolute(workdir)
  directory, step, saved = _saved(workdir, step)
  cfg = ml_collections.ConfigDict(saved)
  init = paths.read_json(paths.join(workdir, "init.json"))["init"]
  if not paths.isdir(init):
    raise ValueError(f"{workdir} was fine-tuned from --init={init}, which is gone; its "
                     "architecture and tokenizer are read from there, so put it back "
                     "at that path.")
  # The architecture and tokenizer only: the weights are the checkpoint's.
  fields, tokenizer = encoder_init.load_architecture(init)
  kind = cfg.task_kind
  model = heads.for_task(core.build_model(fields), kind, int(cfg.num_labels), cfg)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  shapes = jax.eval_shape(lambda r: nn.meta.unbox(model.init(
      {"params": r, "dropout": r}, state_lib.dummy_inputs(cfg))["params"]),
      jax.random.key(0))
  item = {"params": jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes)}
  with checkpointing.quiet_read_only():
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        read_only=True), item_names=checkpointing.ITEMS)
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, partial_restore=True,
        restore_args=ocp.checkpoint_utils.construct_restore_args(item))))
    manager.close()
  params = jax.tree.map(np.asarray, restored["state"]["params"])
  return Saved(cfg, step, init, dict(fields), tokenizer, model, params)


def load(workdir: str, step: int | None = None) -> FineTuned:
  """The fine-tuned model of ``workdir`` (module docstring)."""
  from bertjax.finetune import encoder_init
  saved = read(workdir, step)
  separators, single = encoder_init.encoder_layout(saved.fields, saved.tokenizer)
  encoder = features_lib.Encoder(saved.tokenizer, saved.config.seq_len,
                                 pair_separators=separators, single_segment=single)
  return FineTuned(saved.config, saved.model, saved.params, encoder,
                   output_names(saved.config))

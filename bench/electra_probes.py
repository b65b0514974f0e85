r"""Sanity probes of ELECTRA's discriminator on the demo corpus (issue 14).

Trains the tiny ELECTRA with the generator's samples swapped for a
replacement whose difficulty is known, and prints the discriminator's
training AUC and accuracy every 50 steps:

  fixed    every chosen token becomes one rare id: identity alone gives it
           away; a working discriminator reaches AUC ~1 within ~50 steps.
  rowswap  the token at the same position of another row (specials kept):
           the same unigram distribution, detectable from context only.
  dup      the token's left neighbour, repeated: context only, and local.

``--reference=hf`` trains Hugging Face's FlaxElectraForPreTraining of the
same size (built from a config, nothing downloaded) alone on the same
batches, with the same optimizer and loss (λ · mean sigmoid cross-entropy over
the real tokens), to tell a bug in bertjax from the difficulty of the task.

  python bench/electra_probes.py --mode=dup --steps=300 --data_dir=/tmp/d
  python bench/electra_probes.py --mode=dup --steps=300 --data_dir=/tmp/d \
      --reference=hf

Measured (2026-11-25, 2 shared CPU cores, 32 x 64 rows, lr 1e-3): fixed
AUC 1.000 at step 50 (bertjax); rowswap 0.518 at step 400 (bertjax); dup
0.527 (bertjax) and 0.528 (Hugging Face) at step 300. The discriminator's path
works; context-only detection is slow to learn at this size.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import optax

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import models
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline
from bertjax.data import prepare
from bertjax.models import sizes
from bertjax.objectives import electra

_MODE = flags.DEFINE_enum("mode", "fixed", ["fixed", "rowswap", "dup"],
                          "Which replacement the discriminator must detect.")
_STEPS = flags.DEFINE_integer("steps", 200, "Training steps.")
_DATA_DIR = flags.DEFINE_string("data_dir", "/tmp/electra-probes-data",
                                "Where the demo corpus is (or gets) prepared.")
_REFERENCE = flags.DEFINE_enum("reference", "bertjax", ["bertjax", "hf"],
                               "Whose discriminator is trained.")
_FIXED_ID = 7777  # a rare id of the demo's 8000-token vocabulary


def replacements(mode: str, original: jax.Array, positions: jax.Array) -> jax.Array:
  """int32 [B, P]: the token put at each chosen position."""
  at = lambda rows, pos: jnp.take_along_axis(rows, pos, axis=1)
  kept = at(original, positions)
  if mode == "fixed":
    return jnp.full(positions.shape, _FIXED_ID, jnp.int32)
  if mode == "rowswap":
    other = at(jnp.roll(original, 1, axis=0), positions)
  else:  # dup
    other = at(original, jnp.maximum(positions - 1, 0))
  # A special token would give itself away: keep the original there instead.
  return jnp.where(other < batch_lib.NUM_SPECIAL_TOKENS, kept, other)


class ProbeObjective(electra.ElectraObjective):
  """ELECTRA with the generator's samples replaced by ``replacements``."""

  def __init__(self, config, mode: str):
    super().__init__(config)
    self.mode = mode

  def forward(self, apply, inputs, targets):
    generated = apply(inputs, method="generate")
    values = replacements(self.mode, targets["original_tokens"],
                          inputs["masked_positions"])
    tokens = electra.replace_at(inputs["tokens"], inputs["masked_positions"],
                                targets["mlm_weights"], values)
    labels = ((tokens != targets["original_tokens"]) &
              (targets["rtd_weights"] > 0)).astype(jnp.int32)
    judged = apply({**inputs, "tokens": tokens})
    return {"mlm_logits": generated["mlm_logits"], "hidden": judged["hidden"],
            "rtd_logits": judged["rtd_logits"], "rtd_labels": labels}


def bertjax_step(config, objective, mesh):
  """(state, step(state, batch) -> (state, metrics)) of the real train step."""
  model, tx = models.get_model(config), optim.make_optimizer(config)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  step = train.make_train_step(model, objective, tx, shardings, mesh)
  key = jax.random.key(config.seed)
  return state, lambda s, b: step(s, train.to_global(b, mesh), key)


def hf_step(config, objective):
  """The same, for Hugging Face's Flax ELECTRA discriminator trained alone."""
  from transformers import ElectraConfig, FlaxElectraForPreTraining
  size = sizes.resolve(config)
  model = FlaxElectraForPreTraining(ElectraConfig(
      vocab_size=config.vocab_size, embedding_size=config.embedding_size,
      hidden_size=size.hidden_size, num_hidden_layers=size.num_layers,
      num_attention_heads=size.num_heads, intermediate_size=size.mlp_dim,
      max_position_embeddings=config.max_position_embeddings,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      initializer_range=config.initializer_range,
      layer_norm_eps=config.layer_norm_eps), seed=config.seed)
  tx = optim.make_optimizer(config)
  state = (model.params, tx.init(model.params), jnp.zeros((), jnp.int32))

  @jax.jit
  def step(state, batch):
    params, opt_state, i = state
    inputs, targets = objective.corrupt(jax.random.key(config.seed), batch, i)
    values = replacements(objective.mode, targets["original_tokens"],
                          inputs["masked_positions"])
    tokens = electra.replace_at(batch["tokens"], inputs["masked_positions"],
                                targets["mlm_weights"], values)
    labels = ((tokens != batch["tokens"]) & (targets["rtd_weights"] > 0))

    def loss(p):
      logits = model(tokens, attention_mask=(batch["doc_ids"] != 0).astype(jnp.int32),
                     token_type_ids=batch["segment_ids"],
                     position_ids=batch["positions"], params=p).logits
      value, metrics = electra.rtd_loss(logits, labels, targets["rtd_weights"])
      return objective.disc_loss_weight * value, metrics

    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, i + 1), metrics

  return state, lambda s, b: step(s, {k: jnp.asarray(v) for k, v in b.items()})


def main(argv):
  del argv
  config = config_files.shipped("electra").get_config("tiny")
  config.num_train_steps = max(config.num_train_steps, _STEPS.value)
  prepared = prepare.prepare(config, _DATA_DIR.value)
  objective = ProbeObjective(config, _MODE.value)
  mesh = sharding.make_mesh("1,1,1", jax.devices()[:1])
  if _REFERENCE.value == "hf":
    state, step = hf_step(config, objective)
  else:
    state, step = bertjax_step(config, objective, mesh)
  batches = pipeline.make_train_iterator(config, prepared.source("train"),
                                         local_batch_size=config.batch_size)
  names = ("disc_auc", "disc_accuracy", "disc_all_original_accuracy")
  sums, start = {}, time.time()
  with sharding.use_mesh(mesh):
    for i in range(_STEPS.value):
      state, metrics = step(state, next(batches))
      for name in names:
        total, count = sums.get(name, (0.0, 0.0))
        sums[name] = (total + float(metrics[name][0]),
                      count + float(metrics[name][1]))
      if (i + 1) % 50 == 0:
        shown = " ".join(f"{n}={t / max(c, 1e-9):.3f}" for n, (t, c) in sums.items())
        print(f"{_REFERENCE.value} {_MODE.value} step {i + 1} "
              f"({time.time() - start:.0f} s): {shown}", flush=True)
        sums = {}


if __name__ == "__main__":
  app.run(main)

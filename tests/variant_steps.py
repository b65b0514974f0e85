"""Helpers shared by the per-variant tests: golden encoder shapes, one real step."""

import jax

from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline


def encoder_layer_shapes(num_layers: int, hidden: int, heads: int,
                         mlp: int) -> dict[str, tuple[int, ...]]:
  """Parameter shapes of ``num_layers`` unshared BERT encoder layers, written
  from the architecture (q/k/v/out projections per head, two-layer MLP, two
  post-LayerNorms), keyed by their '/'-joined path."""
  head_dim = hidden // heads
  want = {}
  for i in range(num_layers):
    layer = f"encoder/layer_{i}"
    for proj in ("query", "key", "value"):
      want[f"{layer}/attention/{proj}/kernel"] = (hidden, heads, head_dim)
      want[f"{layer}/attention/{proj}/bias"] = (heads, head_dim)
    want[f"{layer}/attention/out/kernel"] = (heads, head_dim, hidden)
    want[f"{layer}/attention/out/bias"] = (hidden,)
    want[f"{layer}/mlp/wi/kernel"] = (hidden, mlp)
    want[f"{layer}/mlp/wi/bias"] = (mlp,)
    want[f"{layer}/mlp/wo/kernel"] = (mlp, hidden)
    want[f"{layer}/mlp/wo/bias"] = (hidden,)
    for norm in ("attention_norm", "mlp_norm"):
      want[f"{layer}/{norm}/scale"] = (hidden,)
      want[f"{layer}/{norm}/bias"] = (hidden,)
  return want


def setup(config, mesh_shape, devices=None):
  """(mesh, fresh train state, jitted train step) of ``config`` on a mesh of
  ``mesh_shape`` over ``devices`` (default: all), as the train loop makes them."""
  mesh = sharding.make_mesh(mesh_shape, devices)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  step_fn = train.make_train_step(model, objectives.get_objective(config), tx,
                                  shardings, mesh)
  return mesh, state, step_fn


def one_train_step(config, source):
  """Runs the real jitted train step once, on one device, on the first batch
  the pipeline makes from ``source``; returns (new state, metrics)."""
  mesh, state, step = setup(config, "1,1,1", jax.devices()[:1])
  it = pipeline.make_train_iterator(config, source,
                                    local_batch_size=config.batch_size)
  with sharding.use_mesh(mesh):
    return step(state, train.to_global(next(it), mesh), jax.random.key(0))


def loss_term_gradients(model, objective, params, inputs, targets,
                        terms=("disc_loss", "mlm_loss")):
  """Each named loss term's own gradient w.r.t. ``params`` (deterministic
  forward, one pass, one backward pass per term): a tuple in ``terms`` order."""
  import jax.numpy as jnp
  from bertjax.objectives import base

  def losses(p):
    out = base.forward(objective, base.bind(model, p, deterministic=True),
                       inputs, targets)
    metrics = objective.loss(out, targets)[1]
    return tuple(metrics[k][0] / metrics[k][1] for k in terms)

  @jax.jit
  def gradients(p):
    _, pullback = jax.vjp(losses, p)
    basis = [tuple(jnp.float32(i == j) for j in range(len(terms)))
             for i in range(len(terms))]
    return tuple(pullback(b)[0] for b in basis)

  return gradients(params)

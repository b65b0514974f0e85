"""The optimizer choice: AdamW and LAMB updates against their formulas."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax import optim


def _config(name: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      optimizer=name, learning_rate=0.1, warmup_steps=0, num_train_steps=10,
      adam_b1=0.9, adam_b2=0.999, adam_eps=1e-6, weight_decay=0.01,
      grad_clip_norm=1e9))


def _params_and_grads():
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(4, 3)).astype(np.float32),
                      "bias": rng.normal(size=(3,)).astype(np.float32)},
            "layer_norm": {"scale": rng.normal(size=(3,)).astype(np.float32)}}
  grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32),
                       params)
  return params, grads


def _first_adam_direction(g, eps):
  # After one step the bias-corrected moments are g and g**2.
  return g / (np.abs(g) + eps)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_first_update_matches_the_formula(name):
  config = _config(name)
  params, grads = _params_and_grads()
  tx = optim.make_optimizer(config)
  updates, _ = tx.update(grads, tx.init(params), params)
  lr, wd, eps = config.learning_rate, config.weight_decay, config.adam_eps

  kernel = params["dense"]["kernel"]
  direction = _first_adam_direction(grads["dense"]["kernel"], eps) + wd * kernel
  if name == "lamb":
    direction = direction * (np.linalg.norm(kernel) / np.linalg.norm(direction))
  np.testing.assert_allclose(updates["dense"]["kernel"], -lr * direction,
                             rtol=1e-5)
  # Biases and LayerNorm parameters: no decay and, under LAMB, no trust ratio.
  for group, leaf in (("dense", "bias"), ("layer_norm", "scale")):
    np.testing.assert_allclose(
        updates[group][leaf],
        -lr * _first_adam_direction(grads[group][leaf], eps), rtol=1e-5)


def test_lamb_update_norm_follows_the_weight_norm():
  # The trust ratio makes a decayed tensor's step size lr * ||w||: scaling the
  # weights by 10 scales the step by 10, whatever the gradient's size.
  config = _config("lamb")
  params, grads = _params_and_grads()
  tx = optim.make_optimizer(config)
  norms = []
  for scale in (1.0, 10.0):
    scaled = jax.tree.map(lambda p: p * scale, params)
    updates, _ = tx.update(grads, tx.init(scaled), scaled)
    norms.append(float(jnp.linalg.norm(updates["dense"]["kernel"])))
    np.testing.assert_allclose(
        norms[-1], config.learning_rate * np.linalg.norm(
            scaled["dense"]["kernel"]), rtol=1e-5)
  assert norms[1] == pytest.approx(10 * norms[0], rel=1e-5)


def test_unknown_optimizer_is_a_one_line_error():
  with pytest.raises(ValueError, match="--config.optimizer"):
    optim.make_optimizer(_config("sgd"))


def test_initializer_range_sets_the_std_of_kernels_and_tables_only():
  from bertjax import models
  from bertjax import sharding
  from bertjax import state as state_lib
  from bertjax import config_files
  config = config_files.load("configs/bert.py:tiny")
  config.vocab_size = 1000
  config.initializer_range = 0.06
  model = models.get_model(config)
  state, _ = state_lib.create_train_state(
      model, optim.make_optimizer(config), config,
      sharding.make_mesh(config.mesh_shape))
  params = state.params
  table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
  kernel = np.asarray(params["encoder"]["layer_0"]["mlp"]["wi"]["kernel"])
  # Truncated at 2 std: the std of the draws is 0.88 of the nominal one.
  for weights in (table, kernel):
    assert weights.std() == pytest.approx(0.06 * 0.880, rel=0.03)
  np.testing.assert_array_equal(
      params["embeddings"]["layer_norm"]["scale"], 1.0)
  np.testing.assert_array_equal(
      params["encoder"]["layer_0"]["mlp"]["wi"]["bias"], 0.0)

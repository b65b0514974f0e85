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


def _norm(tree) -> float:
  """Global norm in float64, independent of the code under test."""
  return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2)
                           for x in jax.tree.leaves(tree))))


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_clip_by_global_norm_is_optaxs_clipping(max_norm):
  import optax
  _, grads = _params_and_grads()
  assert 0.5 < _norm(grads) < 1e9  # the two cases: clipped, and not
  ours, _ = optim.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
  theirs, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
  if max_norm > _norm(grads):
    # Not clipped: multiplied by exactly 1, the gradients themselves.
    jax.tree.map(np.testing.assert_array_equal, ours, grads)
  else:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                 ours, theirs)
    assert _norm(ours) == pytest.approx(max_norm, rel=1e-6)


def test_the_optimizer_clips_with_the_norm_it_is_given():
  # The train step passes the norm it computed for the non-finite guard;
  # the update must use that one, not compute its own. Given twice the true
  # norm, a clipped update is half as long as given the true norm (Adam's
  # first step divides that scale away, so test the clipping transform, then
  # the plumbing through update_if_finite below).
  _, grads = _params_and_grads()
  clip = optim.clip_by_global_norm(0.5)
  true = _norm(grads)
  own, _ = clip.update(grads, None)
  given, _ = clip.update(grads, None, grad_norm=jnp.float32(true))
  doubled, _ = clip.update(grads, None, grad_norm=jnp.float32(2 * true))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), own, given)
  assert _norm(doubled) == pytest.approx(0.25, rel=1e-5)


def test_update_if_finite_passes_the_norm_to_the_optimizer():
  import optax
  from bertjax import guards
  params, grads = _params_and_grads()
  config = _config("adamw")
  config.grad_clip_norm = 0.5
  tx = optim.make_optimizer(config)
  opt_state = tx.init(params)
  true = jnp.float32(_norm(grads))
  finite = jnp.bool_(True)
  run = lambda norm: guards.update_if_finite(finite, tx, grads, params, opt_state, norm)
  p_true, o_true = run(true)
  p_none, _ = run(None)  # computed inside: the same update
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), p_true, p_none)
  # Adam's first moment is (1 - b1) * clipped gradient: a norm given as
  # twice the true one halves it.
  _, o_double = run(2 * true)
  mu = lambda o: o[1][0].mu["dense"]["kernel"]
  np.testing.assert_allclose(mu(o_double), 0.5 * mu(o_true), rtol=1e-5)
  # A plain optax transformation (no extra arguments) still works.
  plain = optax.sgd(0.1)
  p_plain, _ = guards.update_if_finite(finite, plain, grads, params,
                                       plain.init(params), true)
  np.testing.assert_allclose(p_plain["dense"]["bias"],
                             params["dense"]["bias"] - 0.1 * grads["dense"]["bias"],
                             rtol=1e-6)


@pytest.mark.parametrize("finite", [True, False])
def test_both_guard_forms_give_the_same_state(finite):
  # update_by_cond (CPU, TPU) and update_by_select (GPU) must agree bit for
  # bit: a finite step applies the same update, a skipped one returns the
  # old params and optimizer state unchanged.
  from bertjax import guards
  params, grads = _params_and_grads()
  config = _config("adamw")
  config.grad_clip_norm = 0.5
  tx = optim.make_optimizer(config)
  opt_state = tx.init(params)
  opt_state = tx.update(grads, opt_state, params)[1]  # non-zero moments
  norm = jnp.float32(_norm(grads))
  flag = jnp.bool_(finite)
  by_cond = jax.jit(guards.update_by_cond, static_argnums=1)(
      flag, tx, grads, params, opt_state, norm)
  by_select = jax.jit(guards.update_by_select, static_argnums=1)(
      flag, tx, grads, params, opt_state, norm)
  jax.tree.map(np.testing.assert_array_equal, by_cond, by_select)
  changed = not np.array_equal(by_cond[0]["dense"]["kernel"],
                               params["dense"]["kernel"])
  assert changed == finite
  if not finite:
    jax.tree.map(np.testing.assert_array_equal, by_select, (params, opt_state))


def test_update_if_finite_selects_on_a_gpu_and_conds_elsewhere(monkeypatch):
  from bertjax import guards
  from bertjax.models import attention
  params, grads = _params_and_grads()
  tx = optim.make_optimizer(_config("adamw"))
  opt_state = tx.init(params)

  def jaxpr():  # the text names nested primitives too (where is a jit)
    return str(jax.make_jaxpr(lambda f: guards.update_if_finite(
        f, tx, grads, params, opt_state))(jnp.bool_(True)))

  cpu = jaxpr()
  assert " cond[" in cpu
  monkeypatch.setattr(attention, "compiles_for_gpu", lambda: True)
  gpu = jaxpr()
  # No cond; a jnp.where more per leaf of params and optimizer state.
  leaves = len(jax.tree.leaves((params, opt_state)))
  wheres = lambda text: text.count("jit[name=_where")
  assert " cond[" not in gpu
  assert wheres(gpu) - wheres(cpu) == leaves


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

"""The projections' product with the CPU kernel-gradient form
(bertjax/models/projection.py): same values and gradients as autodiff's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import layers
from bertjax.models import projection

# (x shape, kernel shape, contracted axes): the feed-forward's first kernel,
# a query/key/value kernel [embed, heads, kv], the output kernel
# [heads, kv, embed] (two contracted axes) and the feed-forward's second.
_CASES = [((2, 6, 8), (8, 24), 1), ((2, 6, 8), (8, 2, 4), 1),
          ((2, 6, 2, 4), (2, 4, 8), 2), ((2, 6, 24), (24, 8), 1)]


def _numbers(x_ndim, count):
  return ((tuple(range(x_ndim - count, x_ndim)), tuple(range(count))), ((), ()))


@pytest.mark.parametrize("x_shape,k_shape,count", _CASES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("impl", ["project", "flat"])
def test_values_and_gradients_match_autodiff(x_shape, k_shape, count, dtype, impl):
  kx, kk, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, x_shape, dtype)
  kernel = jax.random.normal(kk, k_shape, dtype)
  numbers = _numbers(len(x_shape), count)
  assert projection.is_projection(x, kernel, numbers) == count

  def ref(x, kernel):
    return jax.lax.dot_general(x, kernel, numbers)

  def ours(x, kernel):
    return getattr(projection, impl)(x, kernel, count)

  y_ref, vjp_ref = jax.vjp(ref, x, kernel)
  y, vjp = jax.vjp(ours, x, kernel)
  g = jax.random.normal(kg, y.shape, dtype)
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(y_ref, np.float32))
  tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
  for got, want in zip(vjp(g), vjp_ref(g)):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(want, np.float32), rtol=tol, atol=tol)


def test_is_projection_refuses_other_products():
  x, kernel = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
  # Batch axes, a contraction not on the trailing / leading axes, or a
  # kernel with no output axes are left to lax.dot_general.
  assert projection.is_projection(x, jnp.ones((2, 4, 5)),
                                  (((2,), (1,)), ((0,), (0,)))) == 0
  assert projection.is_projection(jnp.ones((4, 3, 2)), kernel,
                                  (((0,), (0,)), ((), ()))) == 0
  assert projection.is_projection(x, jnp.ones((5, 4)),
                                  (((2,), (1,)), ((), ()))) == 0
  assert projection.is_projection(x, jnp.ones((4,)),
                                  (((2,), (0,)), ((), ()))) == 0
  assert projection.is_projection(x, kernel, (((2,), (0,)), ((), ()))) == 1


def _transposes_activations(fn, *args) -> bool:
  """Whether the gradient of ``fn`` copies the activations transposed
  (``project``'s kernel gradient) rather than contracting them in place."""
  jaxpr = jax.make_jaxpr(jax.grad(fn))(*args).jaxpr
  producer = {out: eqn for eqn in jaxpr.eqns for out in eqn.outvars}
  return any(eqn.primitive.name == "optimization_barrier"
             and producer.get(v) is not None
             and producer[v].primitive.name == "transpose"
             for eqn in jaxpr.eqns for v in eqn.invars if not hasattr(v, "val"))


def _depends(jaxpr, var, on) -> bool:
  """Whether ``var`` is computed from ``on`` in the flat ``jaxpr``."""
  producer = {out: eqn for eqn in jaxpr.eqns for out in eqn.outvars}
  seen, todo = set(), [var]
  while todo:
    v = todo.pop()
    if v is on:
      return True
    if id(v) in seen or v not in producer:
      continue
    seen.add(id(v))
    todo.extend(a for a in producer[v].invars if hasattr(a, "aval")
                and not hasattr(a, "val"))
  return False


@pytest.mark.parametrize("impl", ["project", "flat"])
@pytest.mark.parametrize("k_shape,count", [((8, 24), 1), ((24, 8), 1), ((2, 4, 6), 2)])
def test_backward_products_are_ordered_in_the_program(impl, k_shape, count):
  """The input and kernel gradients are independent products; both forms
  order them in the program (through optimization barriers): the kernel
  gradient is computed from values that wait for the input gradient, and
  the input gradient handed back waits for the kernel gradient."""
  x = jnp.ones((2, 6) + k_shape[:count])
  kernel = jnp.ones(k_shape)
  g = jnp.ones((2, 6) + k_shape[count:])

  def backward(x, kernel, g):
    return jax.vjp(lambda x, k: getattr(projection, impl)(x, k, count), x, kernel)[1](g)

  jaxpr = jax.make_jaxpr(backward)(x, kernel, g).jaxpr
  rows = 12  # inner != outer in every case, so shapes tell the products apart
  inner = int(np.prod(k_shape[:count]))
  outer = int(np.prod(k_shape[count:]))
  dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  input_grad = [e.outvars[0] for e in dots if e.outvars[0].aval.shape == (rows, inner)]
  kernel_grad = [e.outvars[0] for e in dots if e.outvars[0].aval.shape == (inner, outer)]
  assert len(input_grad) == 1 and len(kernel_grad) == 1
  assert _depends(jaxpr, kernel_grad[0], input_grad[0])
  dx_out, dkernel_out = jaxpr.outvars
  assert _depends(jaxpr, dx_out, kernel_grad[0])
  assert _depends(jaxpr, dkernel_out, kernel_grad[0])
  # Without the barriers neither product would read the other's result.
  plain = jax.make_jaxpr(lambda x, k, g: jax.vjp(
      lambda x, k: jax.lax.dot_general(x, k, _numbers(x.ndim, count)), x, k)[1](g))(
          x, kernel, g).jaxpr
  plain_dots = [e.outvars[0] for e in plain.eqns if e.primitive.name == "dot_general"]
  assert not any(_depends(plain, plain.outvars[0], d) for d in plain_dots
                 if _depends(plain, plain.outvars[1], d))


@pytest.mark.parametrize("k_shape,transposed", [((8, 24), True),
                                                ((24, 8), False)])
def test_gathered_takes_the_form_on_cpu_when_the_input_is_narrower(
    k_shape, transposed, monkeypatch):
  """Activations no wider than the output are transposed (the feed-forward's
  first kernel, attention kernels); a wider input (the feed-forward's second
  kernel) keeps autodiff's form of the product (``flat``); off the CPU,
  autodiff's everywhere."""
  dot = layers.gathered("embed", "mlp")
  x = jnp.ones((2, 6, k_shape[0]))

  def loss(kernel):
    return jnp.sum(dot(x, kernel, (((2,), (0,)), ((), ()))) ** 2)

  kernel = jnp.ones(k_shape)
  assert projection.form(kernel, 1) == ("transposed" if transposed else "flat")
  assert _transposes_activations(loss, kernel) == transposed
  monkeypatch.setattr(projection, "enabled", lambda: False)
  assert not _transposes_activations(loss, kernel)
  assert "optimization_barrier" not in str(jax.make_jaxpr(jax.grad(loss))(kernel))


@pytest.mark.parametrize("flat_heads", [True, False])
@pytest.mark.parametrize("k_shape,count", [((8, 2, 4), 1), ((2, 4, 8), 2)])
def test_attention_kernels_take_the_flat_product_where_the_host_asks(
    flat_heads, k_shape, count, monkeypatch):
  """The 3-D attention kernels: one 2-D matmul with autodiff's gradients (no
  transposed activations) on a host without AVX-512, ``project`` elsewhere;
  a 2-D kernel keeps ``project`` either way. Same values in every form."""
  monkeypatch.setattr(projection, "flat_heads", lambda: flat_heads)
  dot = layers.gathered("embed", "heads") if count == 1 else layers.gathered("heads", "embed")
  x = jax.random.normal(jax.random.key(3), (2, 6) + k_shape[:count])
  numbers = _numbers(x.ndim, count)
  kernel = jax.random.normal(jax.random.key(4), k_shape)

  def loss(kernel):
    return jnp.sum(dot(x, kernel, numbers) ** 2)

  assert projection.form(kernel, count) == ("flat" if flat_heads else "transposed")
  assert _transposes_activations(loss, kernel) == (not flat_heads)
  if flat_heads:  # the product the jaxpr holds is 2-D: [rows, inner] x [inner, outer]
    jaxpr = str(jax.make_jaxpr(lambda k: dot(x, k, numbers))(kernel))
    assert "f32[12,8] = dot_general" in jaxpr
  np.testing.assert_allclose(dot(x, kernel, numbers),
                             jax.lax.dot_general(x, kernel, numbers), rtol=1e-5, atol=1e-5)
  wide = jnp.ones((8, 24))
  assert projection.form(wide, 1) == "transposed"

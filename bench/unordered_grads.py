"""The projections' backward pass as it was before its two products were
ordered (``ab_step`` variant ``unordered_grads``).

``bertjax/models/projection.py`` makes each projection's kernel gradient
wait for its input gradient, and what reads the input gradient wait for the
kernel gradient, in the program (XLA:CPU's runtime still overlaps the two;
see docs/performance.md). This variant restores the earlier
forms, the same products with nothing ordering them: ``project`` without
the barriers, ``flat`` as a plain 2-D product left to autodiff, and the
feed-forward's second kernel (input wider than output) as the plain
``lax.dot_general`` it was.
"""

from __future__ import annotations

import functools
import math

import jax
from jax import lax

from bertjax.models import projection


def _numbers(x_ndim: int, count: int):
  return ((tuple(range(x_ndim - count, x_ndim)), tuple(range(count))), ((), ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def project(x, kernel, count, precision=None):
  """``projection.project``'s product and gradient forms, unordered."""
  return lax.dot_general(x, kernel, _numbers(x.ndim, count), precision=precision)


def _fwd(x, kernel, count, precision):
  return project(x, kernel, count, precision), (x, kernel)


def _bwd(count, precision, residuals, g):
  x, kernel = residuals
  inner = math.prod(kernel.shape[:count])
  outer = math.prod(kernel.shape[count:])
  dx = projection.input_gradient(g, kernel, count, precision)
  xt = projection.transposed(x.reshape(-1, inner))
  dkernel = lax.dot_general(xt, g.reshape(-1, outer), (((1,), (0,)), ((), ())),
                            precision=precision)
  return dx.astype(x.dtype), dkernel.reshape(kernel.shape).astype(kernel.dtype)


project.defvjp(_fwd, _bwd)


def flat(x, kernel, count, precision=None):
  """One 2-D product, both gradients left to autodiff."""
  inner = math.prod(kernel.shape[:count])
  outer = math.prod(kernel.shape[count:])
  y = lax.dot_general(x.reshape(-1, inner), kernel.reshape(inner, outer),
                      (((1,), (0,)), ((), ())), precision=precision)
  return y.reshape(x.shape[:x.ndim - count] + kernel.shape[count:])


def patch():
  """Puts the unordered forms in place; returns what ``restore`` needs."""
  saved = (projection.project, projection.flat, projection.form)
  form = projection.form

  def unordered_form(kernel, count):
    chosen = form(kernel, count)
    if chosen == "flat" and kernel.ndim == 2:
      return "plain"  # layers.gathered then calls lax.dot_general itself
    return chosen

  projection.project, projection.flat, projection.form = project, flat, unordered_form
  return saved


def restore(saved):
  projection.project, projection.flat, projection.form = saved

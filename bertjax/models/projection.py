"""The product of a dense projection, ``x @ kernel``, with the backward pass
written for XLA:CPU's matmul libraries.

Autodiff's kernel gradient contracts the activations over their leading
(batch and length) axes: ``x^T g``. XLA:CPU hands a product to YNNPACK only
when its left operand is row-major with the contracted axis innermost, so it
either runs that product on Eigen with a transposed operand (the feed-forward
kernels: 5-10% slower than YNNPACK on these shapes) or transposes the
gradient ``g`` and produces the kernel gradient in a transposed layout that
is copied once more before the optimizer reads it (the attention kernels).
``project`` instead transposes ``x`` once, behind an optimization barrier so
that XLA does not fold the transpose back into the product, and computes the
kernel gradient as a plain row-major ``x^T @ g`` in the kernel's own layout.
It does so only where ``x`` is no wider than the output (``transpose_pays``):
the feed-forward's second kernel keeps autodiff's form of the product
(``flat``), because the transpose of its 3072-wide input would fuse into the
fusion that recomputes the GELU, which XLA:CPU then runs strided (slower
than what it saves).

The input gradient is written as a 2-D product too (``input_gradient``),
sparing XLA:CPU a transposed copy of every 3-D attention kernel a step.
Forward values are ``lax.dot_general``'s; the input gradient has the same
sums (bit-identical in the A/B runs), the kernel gradient the same sums in
another order (equal to float rounding). Used only when the step compiles
for a CPU (``enabled``): TPU and GPU compilers pick their own layouts for
the product.
On a host without AVX-512 the attention's 3-D kernels take ``flat``
instead (``form``, ``flat_heads``): one 2-D product with autodiff's
forms of the two gradients, which was faster there than the transposed
activations; so does every kernel whose input is wider than its output.

Both forms order their backward pass in the program (``_gradients``): the
kernel gradient's operand waits for the input gradient, and the input
gradient is handed on only with the kernel gradient. This was meant to keep
XLA:CPU from running the two independent products at once on split cores;
a trace shows that its runtime still does (it starts an op when the buffers
it reads are ready, and a barrier adds no buffer), and the two products
take as long together either way. The ordered program is bit-identical and
was measured faster all the same (a 2-core Zen 3 host: BERT-base's step
0.6-2.1% in three A/Bs, BERT-large's 1-2% in the latest), for a reason not
traced.
Measured in docs/performance.md (issue 17).
"""

from __future__ import annotations

import functools
import math

import jax
from jax import custom_derivatives
from jax import lax
import jax.numpy as jnp

from bertjax.models import attention as attention_lib


def enabled() -> bool:
  """Whether projections take ``project``'s backward pass: when the step
  being traced compiles for a CPU (``attention.compile_platform``)."""
  return attention_lib.compile_platform() == "cpu"


def is_projection(lhs: jax.Array, rhs: jax.Array, dimension_numbers) -> int:
  """The number of contracted axes when ``dimension_numbers`` is a plain
  projection, ``lhs``'s trailing axes against ``rhs``'s leading ones in order
  and no batch axes; else 0."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_contract, rhs_contract = tuple(lhs_contract), tuple(rhs_contract)
  count = len(lhs_contract)
  if lhs_batch or rhs_batch or not count or len(rhs_contract) != count:
    return 0
  if lhs_contract != tuple(range(lhs.ndim - count, lhs.ndim)):
    return 0
  if rhs_contract != tuple(range(count)) or min(lhs.ndim, rhs.ndim) <= count:
    return 0
  return count


def transpose_pays(kernel: jax.Array, count: int) -> bool:
  """Whether the activations are no wider than the output: transposing them
  costs no more than transposing the output gradient would."""
  return math.prod(kernel.shape[:count]) <= math.prod(kernel.shape[count:])


@functools.lru_cache(maxsize=None)
def _host_has_avx512() -> bool:
  """Whether this host's CPU has AVX-512 (Linux's /proc/cpuinfo flags);
  True where that cannot be read, so that such a host keeps ``project``."""
  try:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
      for line in f:
        if line.startswith("flags"):
          return "avx512f" in line.split()
  except OSError:
    pass
  return True


def flat_heads() -> bool:
  """Whether the attention's 3-D kernels take ``flat``: on hosts without
  AVX-512. There (a Zen 3 host, AVX2) the transposed activations of
  ``project`` cost more than they save on these kernels, and the 2-D product
  with autodiff's gradient was 4% faster a BERT-base step; with AVX-512
  (Zen 5) ``project`` was 2.5-3% faster (docs/performance.md)."""
  return not _host_has_avx512()


def form(kernel: jax.Array, count: int) -> str:
  """How a plain projection onto ``kernel`` is written when the step
  compiles for a CPU: 'flat' (``flat``) or 'transposed' (``project``)."""
  if kernel.ndim > 2 and flat_heads():
    return "flat"
  return "transposed" if transpose_pays(kernel, count) else "flat"


def transposed(x: jax.Array) -> jax.Array:
  """``x.T`` materialised row-major: the barrier keeps XLA from folding the
  transpose into the product's dimension numbers."""
  return lax.optimization_barrier(x.T)


def _forward_numbers(x_ndim: int, count: int):
  return ((tuple(range(x_ndim - count, x_ndim)), tuple(range(count))),
          ((), ()))


def input_gradient(g: jax.Array, kernel: jax.Array, count: int,
                   precision=None) -> jax.Array:
  """``g @ kernel^T`` over the kernel's output axes, as a 2-D product:
  ``g`` [rows, outer] against the kernel seen as [inner, outer]. Written on
  the 3-D kernels themselves, XLA:CPU copies each kernel into a transposed
  layout every step first (BERT-large: 96 copies of 4 MB)."""
  inner = math.prod(kernel.shape[:count])
  outer = math.prod(kernel.shape[count:])
  dx = lax.dot_general(g.reshape(-1, outer), kernel.reshape(inner, outer),
                       (((1,), (1,)), ((), ())), precision=precision)
  return dx.reshape(g.shape[:g.ndim - (kernel.ndim - count)]
                    + kernel.shape[:count])


def _kernel_gradient(rows, g, precision, transpose_x: bool):
  """``rowsᵀ @ g`` for ``rows`` [rows, inner] and ``g`` [rows, outer]: from a
  row-major copy of ``rowsᵀ`` where ``transpose_x``, else as autodiff writes
  it (the rows contracted in place)."""
  if transpose_x:
    return lax.dot_general(transposed(rows), g, (((1,), (0,)), ((), ())),
                           precision=precision)
  return lax.dot_general(rows, g, (((0,), (0,)), ((), ())), precision=precision)


def _gradients(x, kernel, g, count, precision, transpose_x: bool,
               want_dx: bool = True, want_dkernel: bool = True):
  """The gradients of ``x @ kernel`` that are wanted (None for the others);
  when both are, ordered in the program (module doc): the input gradient,
  then the kernel gradient."""
  inner = math.prod(kernel.shape[:count])
  outer = math.prod(kernel.shape[count:])
  rows = x.reshape(-1, inner)
  g2 = g.reshape(-1, outer)
  if not want_dkernel:
    return input_gradient(g, kernel, count, precision).astype(x.dtype), None
  if not want_dx:
    # (A barrier would keep an input gradient nobody reads alive: XLNet's
    # positions, a constant, are projected too.)
    dkernel = _kernel_gradient(rows, g2, precision, transpose_x)
    return None, dkernel.reshape(kernel.shape).astype(kernel.dtype)
  dx = input_gradient(g, kernel, count, precision)
  # The kernel gradient's operand comes out of a barrier with dx, so its
  # product comes after dx in the program ...
  dx, rows = lax.optimization_barrier((dx, rows))
  dkernel = _kernel_gradient(rows, g2, precision, transpose_x)
  # ... and dx leaves through a barrier with the kernel gradient, so what
  # reads dx comes after that product. (XLA:CPU's runtime may still overlap
  # them: the barriers add no buffer dependency.)
  dx, dkernel = lax.optimization_barrier((dx, dkernel))
  return dx.astype(x.dtype), dkernel.reshape(kernel.shape).astype(kernel.dtype)


def _ordered(forward, transpose_x: bool):
  """``forward(x, kernel, count, precision)`` with ``_gradients`` as its
  backward pass (``transpose_x`` chooses the kernel gradient's form).

  With symbolic zeros the forward pass learns which of ``x`` and ``kernel``
  are differentiated, and hands that to the backward pass as the static
  shape of an empty array (residuals must be arrays)."""
  fn = jax.custom_vjp(forward, nondiff_argnums=(2, 3))

  def fwd(x, kernel, count, precision):
    wanted = jnp.zeros((int(x.perturbed), int(kernel.perturbed), 0), x.value.dtype)
    return (forward(x.value, kernel.value, count, precision),
            (x.value, kernel.value, wanted))

  def bwd(count, precision, residuals, g):
    x, kernel, wanted = residuals
    if isinstance(g, custom_derivatives.SymbolicZero):
      return None, None
    return _gradients(x, kernel, g, count, precision, transpose_x,
                      want_dx=wanted.shape[0] == 1,
                      want_dkernel=wanted.shape[1] == 1)

  fn.defvjp(fwd, bwd, symbolic_zeros=True)
  return fn


def _project(x: jax.Array, kernel: jax.Array, count: int,
             precision=None) -> jax.Array:
  """``x``'s last ``count`` axes contracted with ``kernel``'s first ``count``
  (``is_projection``), as ``lax.dot_general``; the kernel gradient from a
  row-major copy of ``xᵀ`` (module doc)."""
  return lax.dot_general(x, kernel, _forward_numbers(x.ndim, count),
                         precision=precision)


def _flat(x: jax.Array, kernel: jax.Array, count: int,
          precision=None) -> jax.Array:
  """``project``'s product as one 2-D matmul, ``x`` seen as [rows, inner]
  and the kernel as [inner, outer] (bitcasts), with autodiff's forms of the
  two gradients, ordered (module doc)."""
  inner = math.prod(kernel.shape[:count])
  outer = math.prod(kernel.shape[count:])
  y = lax.dot_general(x.reshape(-1, inner), kernel.reshape(inner, outer),
                      (((1,), (0,)), ((), ())), precision=precision)
  return y.reshape(x.shape[:x.ndim - count] + kernel.shape[count:])


project = _ordered(_project, transpose_x=True)
flat = _ordered(_flat, transpose_x=False)

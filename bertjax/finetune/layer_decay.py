"""Fine-tuning's optimizer: pretraining's, with layer-wise learning-rate decay.

``config.layer_decay`` < 1 scales each parameter's update by ``decay ** depth``
(ELECTRA's recipe): depth 0 for the task head, L - i for encoder layer i of L,
L + 1 for the embeddings. Layers stacked by ``nn.scan`` (a leading 'layers'
axis) get one factor per slice.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import optim


def layerwise_scales(params: Any, decay: float) -> Any:
  """Per-parameter learning-rate factors: ``decay ** depth`` where depth is 0 for
  the head, L - i for encoder layer i of L, L + 1 for the embeddings (ELECTRA's
  recipe). Scanned layers (leading 'layers' axis) get a factor per layer."""
  names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  found = [int(m.group(1)) for n in names for m in [re.search(r"'layer_(\d+)'", n)] if m]
  scanned = [leaf.shape[0] for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
             if "'layers'" in jax.tree_util.keystr(p)]
  num = max(found) + 1 if found else (scanned[0] if scanned else 0)

  def scale(path, leaf):
    name = jax.tree_util.keystr(path)
    if not name.startswith("['encoder']"):
      return jnp.ones((), jnp.float32)
    m = re.search(r"'layer_(\d+)'", name)
    if m:
      return jnp.float32(decay ** (num - int(m.group(1))))
    if "'layers'" in name:
      f = decay ** (num - np.arange(leaf.shape[0]))
      return jnp.asarray(f, jnp.float32).reshape((-1,) + (1,) * (leaf.ndim - 1))
    if "embed" in name.lower():
      return jnp.float32(decay ** (num + 1))
    return jnp.ones((), jnp.float32)

  return jax.tree_util.tree_map_with_path(scale, params)


def make_optimizer(config, abstract_params) -> optax.GradientTransformation:
  """The pretraining optimizer, its updates scaled per layer when
  ``config.layer_decay`` < 1."""
  tx = optim.make_optimizer(config)
  if config.layer_decay >= 1.0:
    return tx
  scales = layerwise_scales(abstract_params, float(config.layer_decay))

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, f: u * f.astype(u.dtype), updates, scales), state

  return optax.chain(tx, optax.GradientTransformation(
      lambda _: optax.EmptyState(), update))

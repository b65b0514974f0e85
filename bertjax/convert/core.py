"""HF state dicts <-> bertjax params, driven by an architecture's mapping.

Parameters are nested dicts of numpy arrays here (the ``params`` of a
TrainState, unboxed); the model dimensions come from explicit config fields
(``num_layers, hidden_size, num_heads, mlp_dim``), which an imported model
needs because its sizes need not be a row of ``bertjax/models/sizes.py``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Collection, Mapping

import numpy as np

from bertjax import convert
from bertjax.convert import rules as R

DIM_FIELDS = ("num_layers", "hidden_size", "num_heads", "mlp_dim")
MODEL_FIELDS = ("model", "vocab_size", "max_position_embeddings", "type_vocab_size",
                *DIM_FIELDS, "dropout_rate", "attention_dropout_rate")
# Model fields that only some configs have: configs/roberta.py's sentence_head
# (no pooler/NSP), configs/albert.py's embedding_size and layer_sharing,
# configs/electra.py's generator sizes, and
# what an import records for the way back (the HF model_type, RoBERTa's
# position offset, the vocabulary reordering).
OPTIONAL_FIELDS = ("sentence_head", "embedding_size", "layer_sharing", "hf_model_type",
                   "hf_position_offset", "hf_special_ids", "layer_norm_eps",
                   "hidden_act",
                   # configs/deberta.py's attention and decoder fields.
                   "position_buckets", "max_relative_positions", "pos_att_type",
                   "share_att_key", "norm_rel_ebd", "position_biased_input",
                   "emd_layers", "hf_legacy_mlm_head",
                   # configs/electra.py's generator.
                   "generator_hidden_fraction", "generator_num_layers",
                   "generator_hidden_size", "generator_num_heads", "generator_mlp_dim",
                   # configs/deberta_v3.py: ELECTRA towers of DeBERTa blocks.
                   "encoder", "gdes",
                   # configs/xlnet.py's relative distance clamp and memory.
                   "clamp_len", "mem_len")
# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
_LEGACY_SUFFIXES = {".gamma": ".weight", ".beta": ".bias"}


def model_dims(config: Mapping[str, Any]) -> dict[str, Any]:
  """The model fields of a config, with explicit dimensions.

  A config from ``python -m bertjax.convert`` carries num_layers, hidden_size,
  num_heads and mlp_dim; one of bertjax's own configs has a ``model_size``
  row of ``bertjax/models/sizes.py`` instead.
  """
  from bertjax.models import sizes
  out = {k: config[k] for k in MODEL_FIELDS if k not in DIM_FIELDS}
  for k in OPTIONAL_FIELDS:
    if k in config:
      out[k] = config[k]
  if all(config.get(k) for k in DIM_FIELDS):
    out.update({k: int(config[k]) for k in DIM_FIELDS})
  else:
    size = sizes.get_size(config["model_size"])
    out.update(num_layers=size.num_layers, hidden_size=size.hidden_size,
               num_heads=size.num_heads, mlp_dim=size.mlp_dim)
  return out


def vocab_order(config: Mapping[str, Any]) -> np.ndarray | None:
  """The vocabulary reordering of an imported model, None for bertjax's own."""
  special = config.get("hf_special_ids")
  if not special:
    return None
  return R.vocab_order(list(special), int(config["vocab_size"]))


def build_model(config: Mapping[str, Any], dtype: Any = None):
  """The flax module of a config (bertjax's own or imported), float32 by default."""
  import jax.numpy as jnp
  dims = model_dims(config)
  mapping = convert.mapping_for_config(dims)
  return mapping.build_model(dims, jnp.float32 if dtype is None else dtype)


def _dummy_inputs():
  import jax.numpy as jnp
  inputs = {k: jnp.zeros((1, 8), jnp.int32) for k in ("tokens", "segment_ids", "positions")}
  inputs["doc_ids"] = jnp.ones((1, 8), jnp.int32)
  inputs["masked_positions"] = jnp.zeros((1, 1), jnp.int32)
  return inputs


def _boxed_init(model, rng):
  return model.init({"params": rng, "dropout": rng}, _dummy_inputs(),
                    deterministic=True)["params"]


def fresh_params(shapes: Mapping[str, Any], paths: list[tuple[str, ...]],
                 seed: int) -> dict[str, Any]:
  """bertjax's initialisation of the parameters at ``paths``, in numpy.

  Kernels: truncated normal with std 0.02 (``layers.kernel_init``); biases
  zeros; LayerNorm scales ones. Computing only the few missing head
  parameters on the host avoids compiling the whole model's init.
  """
  from bertjax.models import layers
  rng = np.random.default_rng(seed)
  out: dict[str, Any] = {}
  for path in paths:
    shape = tuple(R.get_path(shapes, path).shape)
    if path[-1] in ("kernel", "embedding"):
      # As jax's truncated_normal(stddev): a normal of std ``stddev`` cut at
      # two standard deviations, not rescaled afterwards.
      x = rng.standard_normal(shape)
      while (bad := np.abs(x) > 2).any():
        x[bad] = rng.standard_normal(int(bad.sum()))
      value = x * layers.KERNEL_STDDEV
    elif path[-1] == "scale":
      value = np.ones(shape)
    else:
      value = np.zeros(shape)
    R.set_path(out, path, value.astype(np.float32))
  return out


def _leaf_paths(tree: Mapping[str, Any]) -> list[tuple[str, ...]]:
  """The key paths of a nested dict's leaves."""
  return [(k, *rest) for k, v in tree.items()
          for rest in (_leaf_paths(v) if isinstance(v, Mapping) else [()])]


def param_shapes(model) -> dict[str, Any]:
  """The params tree of ``model`` as jax.ShapeDtypeStruct leaves (no compute)."""
  import jax
  from flax import linen as nn
  return nn.meta.unbox(jax.eval_shape(lambda r: _boxed_init(model, r), jax.random.key(0)))


def _normalise(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for name, array in tensors.items():
    for old, new in _LEGACY_SUFFIXES.items():
      if name.endswith(old):
        name = name[:-len(old)] + new
    out[name] = array
  return out


def _name_in(mapping: ModuleType, tensors: Mapping[str, np.ndarray],
             rule: R.Rule) -> str | None:
  """The name ``rule``'s tensor has in ``tensors``: the full name, or the
  name without BASE_PREFIX in a bare base model (BertModel, AlbertModel)."""
  names = [rule.hf]
  if rule.hf.startswith(mapping.BASE_PREFIX):
    names.append(rule.hf[len(mapping.BASE_PREFIX):])
  return next((n for n in names if n in tensors), None)


def dropped_rows(mapping: ModuleType, config: Mapping[str, Any],
                 tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """HF name -> the leading rows that ``skip_rows`` rules drop on import
  (e.g. RoBERTa's position rows below padding_idx + 1), as saved."""
  tensors = _normalise(tensors)
  out = {}
  for rule in mapping.rules(config):
    name = _name_in(mapping, tensors, rule) if rule.skip_rows else None
    if name is not None:
      out[rule.hf] = R.dropped_rows(rule, tensors[name])
  return out


def hf_to_params(mapping: ModuleType, config: Mapping[str, Any],
                 tensors: Mapping[str, np.ndarray], shapes: Mapping[str, Any],
                 order: np.ndarray | None, seed: int = 0,
                 ) -> tuple[dict[str, Any], list[str], list[str]]:
  """Fills a bertjax params tree from an HF state dict.

  Args:
    mapping: the architecture's mapping module (e.g. ``bertjax.convert.bert``).
    config: model fields with explicit dimensions (``model_dims``).
    tensors: HF name -> numpy array, as saved (any float dtype).
    shapes: the params tree of the model with shape-carrying leaves
      (``param_shapes``).
    seed: initialises the heads the checkpoint lacks (``fresh_params``),
      and the mapping's ``FRESH_ONLY`` parts that the model has.
    order: the vocabulary reordering (``rules.vocab_order``) or None.

  Returns:
    (float32 params, names of freshly initialised heads, HF names not used).

  Raises:
    ValueError: if the encoder or part of a head is missing, or a shape differs.
  """
  tensors = _normalise(tensors)
  found: dict[str, tuple[R.Rule, np.ndarray]] = {}
  used = set()
  for rule in mapping.rules(config):
    name = _name_in(mapping, tensors, rule)
    if name is not None:
      found[rule.hf] = (rule, tensors[name])
      used.add(name)
  params = {}
  initialised = []
  heads: dict[str, list[R.Rule]] = {}
  for rule in mapping.rules(config):
    heads.setdefault(rule.head, []).append(rule)
  for head, head_rules in heads.items():
    have = [r for r in head_rules if r.hf in found]
    if not have and head != "encoder":
      initialised.append(head)
      fresh = fresh_params(shapes, [r.path for r in head_rules], seed + len(initialised))
      for rule in head_rules:
        R.set_path(params, rule.path, R.get_path(fresh, rule.path))
      continue
    if len(have) != len(head_rules):
      lost = [r.hf for r in head_rules if r.hf not in found]
      raise ValueError(
          f"The checkpoint has part of the {head} but lacks {lost[:3]}"
          f"{' ...' if len(lost) > 3 else ''}; is config.json's num_hidden_layers "
          "right, and is the weights file complete?")
    for rule in head_rules:
      shape = R.get_path(shapes, rule.path).shape
      array = np.asarray(found[rule.hf][1], np.float32)
      R.set_path(params, rule.path, R.to_bertjax(rule, array, shape, order))
  for head in getattr(mapping, "FRESH_ONLY", ()):
    # A part of the model that the HF class has no tensors for (DeBERTa's
    # SOP head, RoBERTa's NSP head): fresh where the config builds it.
    if head in shapes and head not in params:
      initialised.append(head)
      leaves = [(head, *p) for p in _leaf_paths(shapes[head])]
      fresh = fresh_params(shapes, leaves, seed + len(initialised))
      params[head] = fresh[head]
  unused = sorted(n for n in tensors if n not in used and n not in mapping.IGNORED
                  and mapping.BASE_PREFIX + n not in mapping.IGNORED)
  return params, initialised, unused


def params_to_hf(mapping: ModuleType, config: Mapping[str, Any],
                 params: Mapping[str, Any], order: np.ndarray | None,
                 kept: Mapping[str, np.ndarray] | None = None,
                 heads: Collection[str] | None = None) -> dict[str, np.ndarray]:
  """The HF state dict (full ``HF_ARCHITECTURE`` names) of bertjax params.

  ``kept`` holds the rows an import dropped (``dropped_rows``); rows a
  ``skip_rows`` rule needs and ``kept`` lacks are written as zeros.
  ``heads``: only the rules of these parts ('encoder', 'pooler', ...); None = all.
  """
  kept = kept or {}
  return {rule.hf: R.to_hf(rule, np.asarray(R.get_path(params, rule.path)), order,
                           kept.get(rule.hf))
          for rule in mapping.rules(config) if heads is None or rule.head in heads}

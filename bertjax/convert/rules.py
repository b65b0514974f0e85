"""The one mechanism behind every architecture's mapping: tensor rules.

A ``Rule`` ties one Hugging Face tensor (by its state-dict name) to one
bertjax parameter (by its path in the params tree) and says how the array
changes shape on the way. Two kinds cover the BERT family:

  linear   HF ``nn.Linear.weight`` [out, in] <-> flax kernel, whose leading
           ``in_axes`` axes flatten to ``in`` and the rest to ``out``
           (Dense [in, out]; DenseGeneral q/k/v [embed, heads, kv]; attention
           out [heads, kv, embed]). The array is transposed and reshaped.
  reshape  everything else (biases, LayerNorm scale/bias, embedding tables):
           the same values, reshaped ([H] <-> [heads, kv] for q/k/v biases).

Transposes and reshapes move values without arithmetic, so converting there
and back is bit-identical.

A rule with ``skip_rows`` drops the first rows of an HF table that bertjax
has no use for (RoBERTa's position table starts at padding_idx + 1, bertjax's
at 0); the caller keeps those rows (``dropped_rows``) to put them back on
export, so the round trip stays bit-identical.

Rules marked ``vocab`` have the vocabulary on axis 0 (word embeddings, MLM
output bias). Their rows are reordered on import so that the five special
tokens sit at bertjax's fixed ids (``bertjax/batch.py``: [PAD]=0 .. [MASK]=4)
and restored on export; see ``vocab_order``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from bertjax import batch as batch_lib


@dataclasses.dataclass(frozen=True)
class Rule:
  """One HF tensor <-> one bertjax parameter.

  Attributes:
    hf: the HF state-dict name, e.g. 'bert.encoder.layer.0.attention.self.query.weight'.
    path: the bertjax params path, e.g. ('encoder', 'layer_0', 'attention', 'query', 'kernel').
    kind: 'linear' or 'reshape' (see the module docstring).
    in_axes: for 'linear', how many leading kernel axes make the input dimension.
    hf_ndim: for 'reshape', the rank of the HF tensor (trailing bertjax axes
      are merged down to it: q/k/v biases [heads, kv] -> [H]).
    vocab: axis 0 runs over the vocabulary (rows are reordered).
    head: the part of the model the tensor belongs to ('encoder', 'pooler',
      'mlm', 'nsp', 'sop'); a checkpoint may lack whole heads, never part of one.
    skip_rows: leading rows of the HF tensor (axis 0) with no bertjax
      counterpart; dropped on import, restored on export.
  """
  hf: str
  path: tuple[str, ...]
  kind: str = "reshape"
  in_axes: int = 1
  hf_ndim: int = 1
  vocab: bool = False
  head: str = "encoder"
  skip_rows: int = 0


def linear(hf: str, path: Sequence[str], in_axes: int = 1, head: str = "encoder") -> list[Rule]:
  """The kernel and bias rules of one HF ``nn.Linear`` named ``hf``."""
  path = tuple(path)
  return [Rule(f"{hf}.weight", path + ("kernel",), "linear", in_axes, head=head),
          Rule(f"{hf}.bias", path + ("bias",), head=head)]


def layer_norm(hf: str, path: Sequence[str], head: str = "encoder") -> list[Rule]:
  """The scale and bias rules of one HF ``nn.LayerNorm`` named ``hf``."""
  path = tuple(path)
  return [Rule(f"{hf}.weight", path + ("scale",), head=head),
          Rule(f"{hf}.bias", path + ("bias",), head=head)]


def embedding(hf: str, path: Sequence[str], vocab: bool = False) -> Rule:
  """The rule of one HF ``nn.Embedding`` named ``hf`` (a [rows, H] table)."""
  return Rule(f"{hf}.weight", tuple(path) + ("embedding",), hf_ndim=2, vocab=vocab)


def vocab_order(special_ids: Sequence[int], vocab_size: int) -> np.ndarray:
  """Where each bertjax id's row comes from in the HF vocabulary.

  bertjax id k < 5 takes the HF id of its special token; the HF ids 0..4 that
  this displaces fill the rows the specials left; every other id keeps its
  place. The reordering is a permutation, so it loses nothing.

  Args:
    special_ids: the HF ids of [PAD], [UNK], [CLS], [SEP], [MASK] (in the
      order of ``bertjax.batch.SPECIAL_TOKENS``), distinct.
    vocab_size: rows of the vocabulary.

  Returns:
    int64 [vocab_size] ``order`` with ``bertjax_row[i] = hf_row[order[i]]``.
  """
  special_ids = [int(i) for i in special_ids]
  n = batch_lib.NUM_SPECIAL_TOKENS
  if len(special_ids) != n or len(set(special_ids)) != n:
    raise ValueError(
        f"Need {n} distinct special-token ids ({', '.join(batch_lib.SPECIAL_TOKENS)}), "
        f"got {special_ids}; check the tokenizer's special_tokens_map.json.")
  if not all(0 <= i < vocab_size for i in special_ids):
    raise ValueError(
        f"Special-token ids {special_ids} fall outside the vocabulary of "
        f"{vocab_size}; check config.json's vocab_size against the tokenizer.")
  order = np.arange(vocab_size)
  freed = [i for i in special_ids if i >= n]  # HF rows the specials vacate
  displaced = [i for i in range(n) if i not in special_ids]  # HF rows 0..4 to move
  order[:n] = special_ids
  order[freed] = displaced
  return order


def to_bertjax(rule: Rule, array: np.ndarray, shape: Sequence[int],
               order: np.ndarray | None) -> np.ndarray:
  """One HF array -> the bertjax parameter of ``shape``."""
  if rule.kind == "linear":
    array = array.T
  if rule.vocab and order is not None:
    if array.shape[0] != len(order):  # before indexing: a row past the end
      raise ValueError(
          f"HF tensor {rule.hf} has {array.shape[0]} vocabulary rows but "
          f"config.json's vocab_size is {len(order)}; set vocab_size to "
          f"{array.shape[0]} in config.json if the weights are right, or pass "
          "--from_hf the weights saved with this config.json.")
    array = array[order]
  array = array[rule.skip_rows:]
  if array.size != int(np.prod(shape)):
    raise ValueError(
        f"HF tensor {rule.hf} has shape {array.shape} but bertjax expects "
        f"{tuple(shape)} at {'/'.join(rule.path)}; the checkpoint does not match "
        "its config.json.")
  return np.ascontiguousarray(array.reshape(shape))


def dropped_rows(rule: Rule, array: np.ndarray) -> np.ndarray:
  """The rows of an HF array that ``to_bertjax`` drops ([skip_rows, ...])."""
  return np.array(array[:rule.skip_rows])


def to_hf(rule: Rule, array: np.ndarray, order: np.ndarray | None,
          head_rows: np.ndarray | None = None) -> np.ndarray:
  """One bertjax parameter -> its HF array.

  ``head_rows`` are the rows a ``skip_rows`` rule dropped on import
  (``dropped_rows``); without them those rows are zeros.
  """
  array = np.asarray(array)
  if rule.kind == "linear":
    n_in = int(np.prod(array.shape[:rule.in_axes]))
    array = array.reshape(n_in, -1).T
  elif array.ndim < rule.hf_ndim:  # leading unit axes (XLNet's mask_emb [1, 1, H])
    array = array.reshape((1,) * (rule.hf_ndim - array.ndim) + array.shape)
  else:
    array = array.reshape(array.shape[:rule.hf_ndim - 1] + (-1,))
  if rule.vocab and order is not None:
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    array = array[inverse]
  if rule.skip_rows:
    if head_rows is None:
      head_rows = np.zeros((rule.skip_rows,) + array.shape[1:], array.dtype)
    if head_rows.shape != (rule.skip_rows,) + array.shape[1:]:
      raise ValueError(
          f"The kept rows of {rule.hf} have shape {head_rows.shape}, not "
          f"{(rule.skip_rows,) + array.shape[1:]}; they belong to another import.")
    array = np.concatenate([head_rows.astype(array.dtype), array])
  return np.ascontiguousarray(array)


def get_path(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
  """tree[path[0]][path[1]]..., or a ValueError naming the missing path."""
  node = tree
  for key in path:
    if key not in node:
      raise ValueError(
          f"bertjax parameter {'/'.join(path)} does not exist; the mapping and "
          "the model disagree (is the config's model the right architecture?).")
    node = node[key]
  return node


def set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
  """Sets tree[path[0]]...[path[-1]] = value, making dicts on the way."""
  node = tree
  for key in path[:-1]:
    node = node.setdefault(key, {})
  node[path[-1]] = value

"""PyTorch train steps of the variants that train through attention masks
(XLNet, UniLM), for ``bench/step_bench.py --compare``.

Each step does the work of bertjax's step on the same batch: the inputs,
masks and prediction slots come from bertjax's own objective (its
``corrupt`` at step 0, on the host), so both sides see the same
permutation order or UniLM mask, the same number of predicted slots and
the same targets; the loss, AdamW (bertjax's decay mask: no decay on
biases and LayerNorm) and gradient clipping follow bertjax's step.
Each function returns (run one step, 0.0): PyTorch compiles nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import objectives


def corrupted(config, batch: dict[str, np.ndarray]):
  """bertjax's (model inputs, targets) of ``batch`` at step 0, as numpy."""
  objective = objectives.get_objective(config)
  inputs, targets = objective.corrupt(
      jax.random.key(config.seed), {k: jnp.asarray(v) for k, v in batch.items()},
      jnp.int32(0))
  return jax.tree.map(np.asarray, (inputs, targets))


def _adamw(config, named: Iterable[tuple[str, Any]],
           no_decay: Callable[[str], bool]):
  """torch.optim.AdamW with the config's hyperparameters and decay groups."""
  import torch
  named = list(named)
  return torch.optim.AdamW(
      [{"params": [p for n, p in named if not no_decay(n)],
        "weight_decay": config.weight_decay},
       {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(config.adam_b1, config.adam_b2),
      eps=config.adam_eps)


def xlnet_step(config, batch: dict[str, np.ndarray]) -> tuple[Callable[[], None], float]:
  """HF ``XLNetLMHeadModel`` (config.json from convert/xlnet.py) in PyTorch.

  bertjax's order as ``perm_mask`` (1 where token i may not read token j),
  its prediction slots as ``target_mapping`` [B, P, S] one-hot, labels the
  slots' tokens (-100 on slots with weight 0): mean cross-entropy over the
  predicted tokens from the query stream, as bertjax's loss.
  """
  import torch
  import transformers
  from bertjax import batch as batch_lib
  from bertjax.convert import core
  from bertjax.convert import xlnet as xlnet_mapping
  torch.manual_seed(0)
  fields = xlnet_mapping.hf_config(core.model_dims(config), batch_lib.PAD_ID)
  model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**fields))
  model.train(config.dropout_rate > 0 or config.attention_dropout_rate > 0)
  # bertjax decays every tensor but the LayerNorms and the Dense biases
  # (its lm_bias and r_*_bias are decayed).
  opt = _adamw(config, model.named_parameters(),
               lambda n: "layer_norm" in n or (n.endswith(".bias")
                                               and not n.startswith("lm_loss")))
  inputs, targets = corrupted(config, batch)
  seq_len = inputs["tokens"].shape[1]
  # bertjax also hides other documents and padding; the batch has neither.
  perm_mask = torch.from_numpy((~inputs["perm_visible"]).astype(np.float32))
  target_mapping = torch.nn.functional.one_hot(
      torch.from_numpy(inputs["masked_positions"].astype(np.int64)),
      seq_len).float()
  labels = torch.from_numpy(np.where(targets["mlm_weights"] > 0,
                                     targets["mlm_targets"], -100).astype(np.int64))
  ids = torch.from_numpy(inputs["tokens"].astype(np.int64))
  types = torch.from_numpy(inputs["segment_ids"].astype(np.int64))

  def run():
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, token_type_ids=types, perm_mask=perm_mask,
                 target_mapping=target_mapping, labels=labels,
                 use_mems=False).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
    opt.step()

  return run, 0.0


def unilm_step(config, batch: dict[str, np.ndarray],
               hf_config: Any) -> tuple[Callable[[], None], float]:
  """HF ``BertForPreTraining`` (``hf_config``, a BertConfig) in PyTorch
  under bertjax's UniLM masks.

  bertjax's cloze-corrupted tokens, and each row's UniLM mask as a
  [B, S, S] ``attention_mask`` (BERT's encoder takes a 3-D mask); loss =
  mean cross-entropy at the cloze positions + mean NSP cross-entropy over
  the bidirectional rows, as bertjax's UniLM loss.
  """
  import torch
  import transformers
  from bertjax.objectives import unilm_masks
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(hf_config)
  model.train(config.dropout_rate > 0 or config.attention_dropout_rate > 0)
  opt = _adamw(config, model.named_parameters(),
               lambda n: n.endswith("bias") or "LayerNorm" in n)
  inputs, targets = corrupted(config, batch)
  tokens = inputs["tokens"]
  labels = np.full(tokens.shape, -100, np.int64)
  rows = np.arange(tokens.shape[0])[:, None]
  slots = targets["mlm_weights"] > 0
  labels[np.broadcast_to(rows, slots.shape)[slots],
         inputs["masked_positions"][slots]] = targets["mlm_targets"][slots]
  ids = torch.from_numpy(tokens.astype(np.int64))
  types = torch.from_numpy(inputs["segment_ids"].astype(np.int64))
  # bertjax ANDs the UniLM mask with the document mask; one document a row here.
  mask = torch.from_numpy(inputs["attention_mask"].astype(np.int64))
  labels_t = torch.from_numpy(labels)
  nsp_labels = torch.from_numpy(targets["nsp_labels"].astype(np.int64))
  scored = torch.from_numpy(
      (targets["unilm_mask_type"] == unilm_masks.BIDIRECTIONAL)
      & targets["example_mask"])
  vocab = int(hf_config.vocab_size)

  def run():
    opt.zero_grad(set_to_none=True)
    out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    cross_entropy = torch.nn.functional.cross_entropy
    loss = cross_entropy(out.prediction_logits.reshape(-1, vocab),
                         labels_t.reshape(-1))
    if bool(scored.any()):
      loss = loss + cross_entropy(out.seq_relationship_logits[scored],
                                  nsp_labels[scored])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
    opt.step()

  return run, 0.0

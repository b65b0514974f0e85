r"""Times the jitted bertjax train step, optionally against HF Flax and PyTorch.

  python bench/step_bench.py --config=configs/bert.py:base \
      --config.batch_size=8 --config.seq_len=128 --config.max_predictions_per_seq=20 \
      --config.dropout_rate=0 --config.attention_dropout_rate=0 --compare

Prints one JSON line. Each system's step is compiled (jit) or warmed up apart,
then timed for ``--steps`` rounds (of ``--in_flight`` steps each, waited for
once at the round's end; default 1); with ``--compare`` the rounds are
interleaved (bertjax, HF Flax, PyTorch, bertjax, ...) so that load from other
processes on a shared machine hits all three alike. Reported: median step
seconds, tokens/s (batch x seq_len per step), useful-FLOP MFU against
the peak (an accelerator's datasheet figure; on a CPU the best float32
matmul rate of short samples taken after every round,
``bertjax.flops.matmul_flops_per_second``, whose median is reported too)
and the tokens/s ratios; beside
HF Flax also HF's matmul FLOPs per step (``hf_mlm_flops``) and their ratio
to bertjax's, the speedup an equal FLOP rate would give.

The comparison is the same work wherever the libraries allow it: same sizes,
batch, sequence length, masking rate, initialiser scale and optimizer (AdamW
with bertjax's decay mask and clipping; torch.optim.AdamW + clip_grad_norm_).
HF's masked-LM models compute vocabulary logits at every position (their
design); bertjax computes them only at the predicted slots, and also runs the
NSP head, which HF's ``*ForMaskedLM`` do not have. Needs the ``bench`` extra.

DeBERTa (``--config=configs/deberta.py:base``) is compared with PyTorch's
``DebertaV2ForMaskedLM`` of the same config (``convert/deberta.py``'s
config.json), alone: transformers has no Flax DeBERTa. bertjax's step also
runs the enhanced mask decoder (``emd_layers`` extra passes of the last
layer), which transformers' model does not have; pass
``--config.emd_layers=0`` for the same layers on both sides.

ELECTRA-small (generator and discriminator, ``--compare`` against the same
step written with HF's PyTorch ElectraForPreTraining and ElectraForMaskedLM):

  python bench/step_bench.py --config=configs/electra.py:small \
      --config.batch_size=8 --config.dropout_rate=0 \
      --config.attention_dropout_rate=0 --compare

XLNet-base (``--config=configs/xlnet.py:base``; both streams counted in
``bertjax/flops.py``) is compared with HF's PyTorch ``XLNetLMHeadModel`` of
the same config (``convert/xlnet.py``'s config.json), alone: transformers
has no Flax XLNet LM head. Both sides get the same order and prediction
slots: bertjax's objective draws them once on the host (step 0), and
PyTorch receives them as ``perm_mask`` and ``target_mapping``
(``bench/torch_attention_steps.py``). What differs: bertjax draws a fresh
order inside every step (dynamic masking), PyTorch reuses the one it was
given; and transformers (like XLNet's original code) scatters the query
stream's P slots to all S positions through ``target_mapping`` before its
attention, so its query-stream attention scores S rows where bertjax
scores P (the useful FLOPs count P for both).

UniLM-base (``--config=configs/unilm.py:base``) is BERT's encoder under
UniLM's masks: it is compared with PyTorch ``BertForPreTraining`` of the
same sizes, given bertjax's cloze-corrupted tokens and each row's UniLM mask
as a [B, S, S] ``attention_mask``, loss = cloze + NSP over the bidirectional
rows as in bertjax. That is the same work up to the MLM head, which
transformers runs at every position (bertjax at the predicted slots), and
bertjax's in-step masking; HF Flax BERT takes only [B, S] masks, so it is
not timed.

  python bench/step_bench.py --config=configs/xlnet.py:base \
      --config.batch_size=4 --config.seq_len=128 \
      --config.max_predictions_per_seq=22 --config.dropout_rate=0 \
      --config.attention_dropout_rate=0 --compare
"""

from __future__ import annotations

# Malloc tunables that reuse XLA:CPU's per-step buffers, as the binaries have
# them (bertjax/host_memory.py; BERTJAX_MALLOC_TUNABLES=0 to time without):
# restarts the process once, before anything below runs.
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables()

import json
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from absl import logging

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import flops
from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.models import sizes

import torch_attention_steps  # bench/, beside this file

_CONFIG = config_files.define_config_flag("Train config file, e.g. configs/bert.py:tiny.")
_STEPS = flags.DEFINE_integer("steps", 15, "Timed steps per system.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_COMPARE = flags.DEFINE_bool("compare", False, "Also time HF Flax and PyTorch.")
_IN_FLIGHT = flags.DEFINE_integer(
    "in_flight", 1,
    "Steps per timed sample, waited for once at its end (bertjax, HF Flax and "
    "PyTorch's BERT steps): 1 waits for every step; more lets the host queue "
    "the next step while the device runs one, as the training loop does, so "
    "the host's per-step dispatch is hidden. Reported: sample time / steps.")
_TORCH_COMPILE = flags.DEFINE_bool(
    "torch_compile", False,
    "Wrap the PyTorch model in torch.compile (default mode); compile time is "
    "spent in the warm-up steps and reported as the PyTorch compile_s.")


def synthetic_batch(config, seed: int = 0) -> dict[str, np.ndarray]:
  """A full sentence-pair Batch: [CLS] A [SEP] B [SEP], A and B half each."""
  b, s = config.batch_size, config.seq_len
  rng = np.random.default_rng(seed)
  out = batch_lib.empty_batch(b, s)
  a_len = (s - 3) // 2
  b_len = s - 3 - a_len
  tokens = rng.integers(batch_lib.NUM_SPECIAL_TOKENS, config.vocab_size, (b, s))
  tokens[:, 0] = batch_lib.CLS_ID
  tokens[:, 1 + a_len] = batch_lib.SEP_ID
  tokens[:, s - 1] = batch_lib.SEP_ID
  out["tokens"] = tokens.astype(np.int32)
  out["segment_ids"][:, 2 + a_len:] = 1
  out["positions"][:] = np.arange(s, dtype=np.int32)
  out["doc_ids"][:] = 1
  out["word_starts"][:] = True
  out["special"][:] = False
  out["special"][:, [0, 1 + a_len, s - 1]] = True
  out["a_lengths"][:] = a_len
  out["b_lengths"][:] = b_len
  out["example_id"][:, 0] = np.arange(b)
  out["example_mask"][:] = True
  return out


def hf_masked_inputs(config, batch: dict[str, np.ndarray], seed: int = 0):
  """Masked-LM inputs for HF models at bertjax's rate: (ids, labels[-100])."""
  rng = np.random.default_rng(seed + 1)
  ids = batch["tokens"].copy()
  chosen = (rng.random(ids.shape) < config.mask_rate) & ~batch["special"]
  labels = np.where(chosen, ids, -100)
  ids[chosen] = batch_lib.MASK_ID
  return ids.astype(np.int32), labels.astype(np.int64)


def bertjax_step(config, return_compiled: bool = False):
  """bertjax's jitted step on this host's devices.

  Returns (run one, compile s), and the compiled executable third with
  ``return_compiled`` (bench/profile_step.py reads its HLO).
  """
  mesh = sharding.make_mesh(config.mesh_shape)
  model = models.get_model(config)
  objective = objectives.get_objective(config)
  tx = optim.make_optimizer(config)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  step_fn = train.make_train_step(model, objective, tx, shardings, mesh,
                                  microbatches=int(config.get("microbatches", 1)))
  batch = train.to_global(synthetic_batch(config), mesh)
  rng = jax.random.key(config.seed)
  start = time.perf_counter()
  compiled = step_fn.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - start
  box = {"state": state}

  def run(sync: bool = True):
    box["state"], metrics = compiled(box["state"], batch, rng)
    if sync:
      jax.block_until_ready(metrics)

  if return_compiled:
    return run, compile_s, compiled
  return run, compile_s


def _hf_config(config):
  import transformers
  size = sizes.resolve(config)
  if config.model == "deberta":
    from bertjax.convert import core
    from bertjax.convert import deberta as deberta_mapping
    fields = deberta_mapping.hf_config(core.model_dims(config), batch_lib.PAD_ID)
    return transformers.DebertaV2Config(**fields)
  return transformers.BertConfig(
      vocab_size=config.vocab_size, hidden_size=size.hidden_size,
      num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
      intermediate_size=size.mlp_dim, hidden_act="gelu",
      hidden_dropout_prob=config.dropout_rate,
      attention_probs_dropout_prob=config.attention_dropout_rate,
      max_position_embeddings=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size, layer_norm_eps=1e-12,
      initializer_range=0.02)


def hf_flax_step(config) -> tuple[Callable[[], None], float]:
  """HF FlaxBertForMaskedLM with the same optimizer; (run one, compile s)."""
  import optax
  import transformers
  # dtype is the compute dtype (parameters stay float32), as in bertjax.
  model = transformers.FlaxBertForMaskedLM(
      _hf_config(config), seed=0, dtype=jnp.dtype(config.dtype))
  tx = optim.make_optimizer(config)
  batch = synthetic_batch(config)
  ids, labels = hf_masked_inputs(config, batch)
  ids, types = jnp.asarray(ids), jnp.asarray(batch["segment_ids"])
  attention = jnp.ones_like(ids)
  targets = jnp.asarray(np.maximum(labels, 0).astype(np.int32))
  weights = jnp.asarray((labels >= 0).astype(np.float32))
  train_mode = config.dropout_rate > 0 or config.attention_dropout_rate > 0

  def step(params, opt_state, rng):
    def loss_fn(p):
      logits = model(ids, attention_mask=attention, token_type_ids=types,
                     params=p, dropout_rng=rng, train=train_mode).logits
      nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
      return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = model.params
  opt_state = tx.init(params)
  rng = jax.random.key(0)
  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(
      params, opt_state, rng).compile()
  compile_s = time.perf_counter() - start
  box = {"params": params, "opt": opt_state}

  def run(sync: bool = True):
    box["params"], box["opt"], loss = compiled(box["params"], box["opt"], rng)
    if sync:
      loss.block_until_ready()

  return run, compile_s


def torch_device():
  """'cuda' where PyTorch sees a GPU, else 'cpu'."""
  import torch
  return "cuda" if torch.cuda.is_available() else "cpu"


def torch_step(config, compile_model: bool = False) -> tuple[Callable[[], None], float]:
  """HF BertForMaskedLM (DebertaV2ForMaskedLM for DeBERTa) in PyTorch, AdamW +
  clipping; (run one, 0).

  On a GPU: the model and batch on CUDA, SDPA attention, the fused AdamW, and
  for ``config.dtype == 'bfloat16'`` bf16 autocast over float32 parameters
  (the same mixed precision as bertjax and HF Flax). ``compile_model`` wraps
  the model in ``torch.compile``.
  """
  import contextlib
  import torch
  import transformers
  torch.manual_seed(0)
  device = torch_device()
  model_cls = (transformers.DebertaV2ForMaskedLM if config.model == "deberta"
               else transformers.BertForMaskedLM)
  extra = {} if config.model == "deberta" else {"attn_implementation": "sdpa"}
  model = model_cls._from_config(_hf_config(config), **extra).to(device)
  model.train(config.dropout_rate > 0 or config.attention_dropout_rate > 0)
  decay = [p for n, p in model.named_parameters()
           if not (n.endswith("bias") or "LayerNorm" in n)]
  no_decay = [p for n, p in model.named_parameters()
              if n.endswith("bias") or "LayerNorm" in n]
  opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": config.weight_decay},
       {"params": no_decay, "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(config.adam_b1, config.adam_b2),
      eps=config.adam_eps, **({"fused": True} if device == "cuda" else {}))
  forward = torch.compile(model) if compile_model else model
  batch = synthetic_batch(config)
  ids, labels = hf_masked_inputs(config, batch)
  ids_t = torch.from_numpy(ids.astype(np.int64)).to(device)
  types = torch.from_numpy(batch["segment_ids"].astype(np.int64)).to(device)
  if not config.type_vocab_size:  # DeBERTa-v3 has no segment table
    types = torch.zeros_like(types)
  labels_t = torch.from_numpy(labels).to(device)
  if config.dtype == "bfloat16":
    autocast = lambda: torch.autocast(device, dtype=torch.bfloat16)
  else:
    autocast = contextlib.nullcontext

  def run(sync: bool = True):
    opt.zero_grad(set_to_none=True)
    with autocast():
      loss = forward(input_ids=ids_t, token_type_ids=types, labels=labels_t).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
    opt.step()
    if device == "cuda" and sync:
      torch.cuda.synchronize()

  return run, 0.0


def _electra_configs(config):
  """HF ElectraConfigs of the discriminator and generator of a bertjax config."""
  import transformers
  from bertjax.models import electra
  common = dict(vocab_size=config.vocab_size, embedding_size=config.embedding_size,
                hidden_act="gelu", hidden_dropout_prob=config.dropout_rate,
                attention_probs_dropout_prob=config.attention_dropout_rate,
                max_position_embeddings=config.max_position_embeddings,
                type_vocab_size=config.type_vocab_size, layer_norm_eps=1e-12)
  out = []
  for size in (sizes.resolve(config), electra.generator_size(config)):
    out.append(transformers.ElectraConfig(
        hidden_size=size.hidden_size, num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads, intermediate_size=size.mlp_dim, **common))
  return out


def torch_electra_step(config) -> tuple[Callable[[], None], float]:
  """HF ElectraForPreTraining + ElectraForMaskedLM in PyTorch (CPU), the same
  step as bertjax's: generator MLM at the masked positions, Gumbel-max
  samples (no gradient), discriminator on every real token, loss = MLM +
  λ · discriminator, AdamW + clipping; (run one, 0)."""
  import torch
  import transformers
  torch.manual_seed(0)
  disc_config, gen_config = _electra_configs(config)
  disc = transformers.ElectraForPreTraining(disc_config)
  gen = transformers.ElectraForMaskedLM(gen_config)
  gen.electra.embeddings = disc.electra.embeddings  # shared, as in bertjax
  gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
  train_mode = config.dropout_rate > 0 or config.attention_dropout_rate > 0
  disc.train(train_mode)
  gen.train(train_mode)
  named = dict(disc.named_parameters())
  named.update({f"g.{k}": v for k, v in gen.named_parameters()})
  unique = {id(p): (n, p) for n, p in named.items()}.values()
  decay = [p for n, p in unique if not (n.endswith("bias") or "LayerNorm" in n)]
  no_decay = [p for n, p in unique if n.endswith("bias") or "LayerNorm" in n]
  opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": config.weight_decay},
       {"params": no_decay, "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(config.adam_b1, config.adam_b2),
      eps=config.adam_eps)
  batch = synthetic_batch(config)
  ids, labels = hf_masked_inputs(config, batch)
  ids_t = torch.from_numpy(ids.astype(np.int64))
  original = torch.from_numpy(batch["tokens"].astype(np.int64))
  real = torch.from_numpy(~batch["special"])
  types = torch.from_numpy(batch["segment_ids"].astype(np.int64))
  labels_t = torch.from_numpy(labels)
  chosen = labels_t >= 0
  params = [p for _, p in unique]

  def run():
    opt.zero_grad(set_to_none=True)
    out = gen(input_ids=ids_t, token_type_ids=types, labels=labels_t)
    with torch.no_grad():
      logits = out.logits[chosen] / config.generator_temperature
      gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_min(1e-20)))
      fake = original.clone()
      fake[chosen] = torch.argmax(logits + gumbel, dim=-1)
      replaced = ((fake != original) & real).float()
    rtd = disc(input_ids=fake, token_type_ids=types).logits
    disc_loss = torch.nn.functional.binary_cross_entropy_with_logits(
        rtd[real], replaced[real])
    loss = out.loss + config.disc_loss_weight * disc_loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, config.grad_clip_norm)
    opt.step()

  return run, 0.0


def benchmark(config, *, steps: int = 15, warmup: int = 2,
              compare: bool = False, torch_compile: bool = False,
              in_flight: int = 1) -> dict[str, Any]:
  """Runs the benchmark; returns the record printed as JSON (see module doc)."""
  if in_flight < 1 or (in_flight > 1 and (
      config.model in ("electra", "xlnet") or config.objective == "unilm")):
    raise ValueError(
        f"--in_flight={in_flight} is not possible here; pass a positive value, "
        f"and 1 for ELECTRA, XLNet and UniLM, whose PyTorch steps always wait.")
  systems = {"bertjax": bertjax_step(config)}
  if compare and config.model == "electra":
    # HF has no joint ELECTRA pretraining model: the PyTorch step is written
    # here from its two models (torch_electra_step); no HF Flax counterpart.
    systems["torch"] = torch_electra_step(config)
  elif compare and config.model == "xlnet":
    # No Flax XLNet LM head in transformers: PyTorch only.
    systems["torch"] = torch_attention_steps.xlnet_step(
        config, synthetic_batch(config))
  elif compare and config.objective == "unilm":
    # HF Flax BERT takes no [B, S, S] mask: PyTorch only.
    systems["torch"] = torch_attention_steps.unilm_step(
        config, synthetic_batch(config), _hf_config(config))
  elif compare:
    if config.model != "deberta":  # transformers has no Flax DeBERTa
      systems["hf_flax"] = hf_flax_step(config)
    systems["torch"] = torch_step(config, compile_model=torch_compile)
  logging.info("compiled: %s", {k: round(v[1], 2) for k, v in systems.items()})
  for name, (run, _) in list(systems.items()):
    start = time.perf_counter()
    for _ in range(warmup):
      run()
    if name == "torch" and torch_compile:  # torch.compile compiles on first call
      systems[name] = (run, time.perf_counter() - start)
  times: dict[str, list[float]] = {name: [] for name in systems}
  # On a CPU the peak is measured, and a shared host can give less for a
  # while: a short matmul sample after every round, the best of them kept,
  # so that one slow window cannot inflate the MFU.
  on_cpu = jax.devices()[0].platform == "cpu"
  peaks: list[float] = []
  for i in range(steps):
    for name, (run, _) in systems.items():
      start = time.perf_counter()
      for _ in range(in_flight - 1):
        run(sync=False)
      run()
      times[name].append((time.perf_counter() - start) / in_flight)
    if on_cpu:
      peaks.append(flops.matmul_flops_per_second(repeats=3))
    # Progress on stderr: a long comparison on a busy host shows it is alive.
    logging.info("round %d/%d: %s", i + 1, steps,
                 {k: round(v[-1], 3) for k, v in times.items()})
  tokens = config.batch_size * config.seq_len
  peak = max(peaks) if on_cpu else flops.peak_flops_per_second()
  useful = flops.step_flops(config)
  record: dict[str, Any] = {
      "model": f"{config.model}-{config.model_size}",
      "objective": config.get("objective", "bert"),
      "batch_size": int(config.batch_size), "seq_len": int(config.seq_len),
      "dtype": config.dtype, "steps": steps, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform,
      "device_kind": jax.devices()[0].device_kind, "peak_flops_per_s": peak,
      **({"peak_flops_per_s_median": statistics.median(peaks)} if on_cpu else {}),
      "useful_flops_per_step": useful,
      "attention_impl": config.get("attention_impl", "auto"),
      "in_flight": in_flight,
  }
  if "torch" in systems:
    record["torch_compile"] = bool(torch_compile)
  for name, (_, compile_s) in systems.items():
    median = statistics.median(times[name])
    record[name] = {
        "compile_s": round(compile_s, 3),
        "step_s_median": round(median, 5),
        "step_s_min": round(min(times[name]), 5),
        "tokens_per_s": round(tokens / median, 1),
        # The same useful FLOPs for every system: the work a step must do.
        "mfu": round(useful / median / peak, 4),
    }
  for other in ("hf_flax", "torch"):
    if other in record:
      record[f"speedup_vs_{other}"] = round(
          record["bertjax"]["tokens_per_s"] / record[other]["tokens_per_s"], 3)
  if compare and "hf_flax" in systems:
    # The speedup bertjax would show if both ran their matmuls at the same
    # FLOP rate: the ceiling of what skipping work alone can give.
    hf_flops = hf_mlm_flops(config)
    record["hf_matmul_flops_per_step"] = hf_flops
    record["flop_ratio_hf_to_bertjax"] = round(hf_flops / useful, 3)
  return record


def hf_mlm_flops(config) -> float:
  """Matmul FLOPs of HF's ``*BertForMaskedLM`` train step (forward + backward).

  Every layer at every position, and the MLM transform and vocabulary
  logits at all T = B * S positions, not only the predicted slots (no
  pooler or NSP head): ``flops.step_flops``'s encoder terms without the
  sparse last layer, plus ``6 * (H*H + H*V) * T``.
  """
  size = sizes.resolve(config)
  h = size.hidden_size
  tokens = int(config.batch_size) * int(config.seq_len)
  encoder = flops.encoder_flops(size, int(config.seq_len), tokens)
  return encoder + 6.0 * (h * h + h * int(config.vocab_size)) * tokens


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  record = benchmark(_CONFIG.value, steps=_STEPS.value, warmup=_WARMUP.value,
                     compare=_COMPARE.value, torch_compile=_TORCH_COMPILE.value,
                     in_flight=_IN_FLIGHT.value)
  print(json.dumps(record), flush=True)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)

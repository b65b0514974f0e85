"""DeBERTa-v3 (configs/deberta_v3.py): ELECTRA's step with DeBERTa encoders."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import config_files
from bertjax import models
from bertjax import objectives
from bertjax import state as state_lib
from bertjax import train
from bertjax.convert import core
from bertjax.convert import workdir as convert_workdir
from bertjax.data import pipeline

import variant_steps

v3_config = config_files.shipped("deberta_v3")  # configs/deberta_v3.py


def shapes(params):
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def deberta_layers(prefix, num_layers, hidden, heads, mlp):
  """Golden shapes of a DeBERTa stack of ``num_layers`` (share_att_key: no
  position projections): the first L-1 in ``encoder``, the last apart."""
  want = {}
  for name, shape in variant_steps.encoder_layer_shapes(
      num_layers, hidden, heads, mlp).items():
    last = f"encoder/layer_{num_layers - 1}/"
    name = name.replace(last, "last_layer/")
    want[f"{prefix}/{name}"] = shape
  return want


def test_tiny_golden_parameter_shapes():
  config = v3_config.get_config("tiny")
  assert (config.model, config.objective, config.encoder) == (
      "electra", "electra", "deberta")
  assert config.gdes and config.generator_temperature == 1.0
  V, H, F, S = 8000, 128, 512, 32
  want = {
      # Shared word table, its LayerNorm; no absolute positions, no segments.
      "embeddings/word_embeddings/embedding": (V, H),
      "embeddings/layer_norm/scale": (H,),
      "embeddings/layer_norm/bias": (H,),
      # GDES: the discriminator's own delta over the shared table.
      "discriminator_word_delta": (V, H),
      "generator/mlm_head/dense/kernel": (H, H),
      "generator/mlm_head/dense/bias": (H,),
      "generator/mlm_head/layer_norm/scale": (H,),
      "generator/mlm_head/layer_norm/bias": (H,),
      "generator/mlm_head/output_bias": (V,),
      "discriminator/head_dense/kernel": (H, H),
      "discriminator/head_dense/bias": (H,),
      "discriminator/head_prediction/kernel": (H, 1),
      "discriminator/head_prediction/bias": (1,),
  }
  for tower in ("generator", "discriminator"):
    want[f"{tower}/encoder/relative/embedding"] = (2 * S, H)
    want[f"{tower}/encoder/relative/layer_norm/scale"] = (H,)
    want[f"{tower}/encoder/relative/layer_norm/bias"] = (H,)
  # The discriminator has 2 layers, the generator half: 1, same width.
  want.update(deberta_layers("discriminator/encoder", 2, H, 2, F))
  want.update(deberta_layers("generator/encoder", 1, H, 2, F))
  model = models.get_model(config)
  params = jax.eval_shape(lambda r: model.init(
      {"params": r}, state_lib.dummy_inputs(config), deterministic=True),
      jax.random.key(0))["params"]
  assert shapes(params) == want


def test_the_generator_is_sized_as_electras_by_fraction_and_depth():
  # The config used to ship explicit generator sizes, so that
  # --config.generator_hidden_fraction was accepted and silently ignored.
  from bertjax import compat
  from bertjax.models import electra as electra_model
  from bertjax.models import sizes
  base = v3_config.get_config("base")
  config = base.copy_and_resolve_references()
  config.generator_hidden_fraction = 0.5  # 6 of the 12 heads of 64
  assert electra_model.generator_size(config) == sizes.Size(6, 384, 6, 1536)
  # An explicit width wins over the fraction, as in configs/electra.py.
  config.update(generator_hidden_size=256, generator_num_heads=4,
                generator_mlp_dim=1024)
  assert electra_model.generator_size(config) == sizes.Size(6, 256, 4, 1024)
  # A checkpoint of the config as it was (the same generator, given by
  # explicit sizes with the fraction 0.25 unused) resumes; another width not.
  saved = dict(compat.as_json(base), generator_hidden_fraction=0.25,
               generator_hidden_size=768, generator_num_heads=12,
               generator_mlp_dim=3072)
  assert {c.kind for c in compat.check(saved, base, "The checkpoint")
          if c.field.startswith("generator_")} == {compat.SAFE}
  with pytest.raises(compat.IncompatibleCheckpoint, match=(
      r"config says generator_hidden_fraction=0\.5, .*, which changes the saved "
      r"state's layout")):
    compat.check(saved, dict(compat.as_json(base), generator_hidden_fraction=0.5),
                 "The checkpoint")


@pytest.fixture(scope="module")
def trained(demo_data, tmp_path_factory):
  """(config, workdir) of the tiny config trained 8 steps on short rows: the
  real loop, which every test below reads instead of compiling its own step."""
  c = v3_config.get_config("tiny")
  c.data_dir = demo_data.data_dir
  c.batch_size, c.seq_len, c.max_predictions_per_seq = 8, 32, 5
  c.shuffle_window = 32
  c.num_train_steps, c.warmup_steps = 8, 1
  c.log_every_steps, c.checkpoint_every_steps = 1, 8
  c.eval_every_steps, c.eval_max_batches = 0, 1
  workdir = str(tmp_path_factory.mktemp("deberta_v3"))
  record = train.train_and_evaluate(c, workdir)
  assert np.isfinite(record["disc_auc"]) and np.isfinite(record["mlm_accuracy"])
  return c, workdir


def test_training_lowers_a_finite_loss(trained):
  _, workdir = trained
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
  assert sorted(losses) == list(range(1, 9))
  assert np.all(np.isfinite(list(losses.values())))
  # MLM + 50 x RTD starts near ln(8000) + 50 ln 2 = 43.6 and falls by a
  # third within a few steps as the discriminator finds the base rate.
  assert losses[8] < 0.8 * losses[1], losses


def test_gdes_splits_the_gradients(trained, demo_data):
  config, workdir = trained
  saved, params, _ = convert_workdir.load_params(workdir)
  model = core.build_model(saved)
  objective = objectives.get_objective(config)
  it = pipeline.make_train_iterator(config, demo_data.source("train"),
                                    local_batch_size=config.batch_size)
  batch = {k: jnp.asarray(v) for k, v in next(it).items()}
  inputs, targets = jax.jit(objective.corrupt)(jax.random.key(0), batch, jnp.int32(0))

  disc, gen = variant_steps.loss_term_gradients(model, objective, params,
                                                  inputs, targets)
  table = lambda g: float(jnp.abs(g["embeddings"]["word_embeddings"]["embedding"]).max())
  delta = lambda g: float(jnp.abs(g["discriminator_word_delta"]).max())
  # The discriminator trains its delta, never the shared table; the
  # generator trains the table, never the delta.
  assert table(disc) == 0.0 and delta(disc) > 0.0
  assert table(gen) > 0.0 and delta(gen) == 0.0


def test_discriminator_exports_as_a_debertav2model(trained, tmp_path):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  config, workdir = trained
  out = str(tmp_path / "hf")
  convert_workdir.export_hf(workdir, out)
  hf, info = transformers.DebertaV2Model.from_pretrained(
      out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  hf.eval()
  # The discriminator's hidden states, bertjax against transformers, on two
  # rows, one with padding.
  saved, params, _ = convert_workdir.load_params(workdir)
  model = core.build_model(saved)
  rng = np.random.default_rng(0)
  b, length = 2, 24
  tokens = rng.integers(5, config.vocab_size, (b, length)).astype(np.int32)
  valid = np.ones((b, length), bool)
  valid[1, 17:] = False
  tokens[~valid] = 0
  inputs = {"tokens": jnp.asarray(tokens),
            "segment_ids": jnp.zeros((b, length), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(length), (b, length)),
            "doc_ids": jnp.asarray(valid.astype(np.int32))}
  ours = np.asarray(jax.jit(model.apply)({"params": params}, inputs)["hidden"])
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(valid.astype(np.int64))
                ).last_hidden_state.numpy()
  np.testing.assert_allclose(ours[valid], theirs[valid], rtol=1e-4, atol=1e-4)
  # GDES is folded: the exported table is the shared table + the delta, and
  # the delta has moved away from its zeros.
  delta = np.asarray(params["discriminator_word_delta"])
  assert np.abs(delta).max() > 0
  np.testing.assert_allclose(
      hf.embeddings.word_embeddings.weight.detach().numpy(),
      np.asarray(params["embeddings"]["word_embeddings"]["embedding"]) + delta,
      rtol=0, atol=1e-6)


def test_finetuned_tower_refuses_export_and_writes_nothing(trained, tmp_path):
  # Fine-tuning the run's workdir fine-tunes its DeBERTa discriminator tower,
  # a model no transformers task class loads as such: the export says how to
  # get one (export the pretraining run, fine-tune that) and writes nothing.
  from bertjax.finetune import loop
  _, workdir = trained
  rows = "".join(f"{'good code' if i % 2 else 'bad code'} {i},{'yes' if i % 2 else 'no'}\n"
                 for i in range(16))
  (tmp_path / "train.csv").write_text("sentence,label\n" + rows)
  cfg = config_files.shipped("finetune").get_config("local")
  for k, v in dict(train_files=str(tmp_path / "train.csv"),
                   eval_files=str(tmp_path / "train.csv"), seq_len=32, batch_size=8,
                   num_epochs=1.0, log_every_steps=1000,
                   checkpoint_every_steps=1000).items():
    setattr(cfg, k, v)
  tuned = str(tmp_path / "ft")
  result = loop.run(cfg, workdir, tuned)
  assert result["step"] == 2 and result["num_examples"] == 16
  out = tmp_path / "hf"
  with pytest.raises(ValueError, match="DeBERTa tower of an ELECTRA-style run"):
    convert_workdir.export_hf(tuned, str(out))
  assert not out.exists()

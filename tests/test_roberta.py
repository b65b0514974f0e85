"""RoBERTa: MLM-only objective, no sentence head, document-blocked attention,
dynamic masking and the byte-fallback BPE tokenizer."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import models
from bertjax import objectives
from bertjax import state as state_lib
from bertjax.data import tokenizer as tokenizer_lib
import variant_steps

roberta = config_files.shipped("roberta")  # configs/roberta.py, loaded by path


def test_tiny_golden_parameter_shapes():
  config = roberta.get_config("tiny")
  model = models.get_model(config)
  params = jax.eval_shape(
      lambda r: model.init({"params": r}, state_lib.dummy_inputs(config),
                           deterministic=True), jax.random.key(0))["params"]
  V, H, F, P = 8000, 128, 512, 512
  want = {
      "embeddings/word_embeddings/embedding": (V, H),
      "embeddings/position_embeddings/embedding": (P, H),
      "embeddings/type_embeddings/embedding": (1, H),
      "embeddings/layer_norm/scale": (H,),
      "embeddings/layer_norm/bias": (H,),
      "mlm_head/dense/kernel": (H, H),
      "mlm_head/dense/bias": (H,),
      "mlm_head/layer_norm/scale": (H,),
      "mlm_head/layer_norm/bias": (H,),
      "mlm_head/output_bias": (V,),
  }
  want.update(variant_steps.encoder_layer_shapes(2, H, 2, F))
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  # No pooler and no NSP head: RoBERTa trains no sentence-level task.
  assert {k: tuple(v.shape) for k, v in flat.items()} == want


def two_document_batch(seq_len=24):
  """One full_sentences-style row: doc 1 = [CLS] 8 tokens [SEP], doc 2 =
  7 tokens [SEP], then padding."""
  b = batch_lib.empty_batch(2, seq_len)
  rng = np.random.default_rng(0)
  tokens = np.zeros(seq_len, np.int32)
  tokens[0], tokens[9], tokens[17] = batch_lib.CLS_ID, batch_lib.SEP_ID, batch_lib.SEP_ID
  tokens[1:9] = rng.integers(5, 1000, 8)
  tokens[10:17] = rng.integers(5, 1000, 7)
  b["tokens"][:] = tokens
  b["doc_ids"][:, :10], b["doc_ids"][:, 10:18] = 1, 2
  b["positions"][:, :10] = np.arange(10)
  b["positions"][:, 10:18] = np.arange(1, 9)
  b["special"][:] = np.isin(tokens, [0, 2, 3]) | (np.arange(seq_len) >= 18)
  b["word_starts"][:, :18] = True
  b["example_mask"][:] = True
  b["example_id"][:, 0] = [0, 1]
  # Row 1 differs from row 0 only in document 2's tokens.
  b["tokens"][1, 10:17] = rng.integers(5, 1000, 7)
  return b


def test_attention_between_documents_is_blocked_unless_allowed():
  config = roberta.get_config("tiny")
  config.dropout_rate = config.attention_dropout_rate = 0.0
  config.seq_len, config.max_predictions_per_seq = 24, 4
  config.sparse_last_layer = False  # every row's hidden state is read
  model = models.get_model(config)
  batch = {k: jnp.asarray(v) for k, v in two_document_batch().items()}
  params = jax.jit(lambda r: model.init(
      {"params": r}, state_lib.dummy_inputs(config)))(jax.random.key(1))["params"]
  for across in (False, True):
    config.attend_across_documents = across
    objective = objectives.get_objective(config)

    @jax.jit
    def hidden(params, objective=objective):
      inputs, _ = objective.corrupt(jax.random.key(0), batch, jnp.int32(0))
      # Score the clean tokens: only the attention pattern is under test.
      inputs = dict(inputs, tokens=batch["tokens"])
      return model.apply({"params": params}, inputs)["hidden"]

    h = np.asarray(hidden(params))
    doc1_change = np.abs(h[0, :10] - h[1, :10]).max()
    assert np.abs(h[0, 10:17] - h[1, 10:17]).max() > 1e-2  # doc 2 differs
    if across:
      assert doc1_change > 1e-3
    else:
      assert doc1_change == 0.0  # doc 1 never sees doc 2's tokens


def test_dynamic_masks_change_every_step():
  config = roberta.get_config("tiny")
  config.seq_len, config.max_predictions_per_seq = 24, 4
  batch = {k: jnp.asarray(v) for k, v in two_document_batch().items()}
  corrupt = jax.jit(objectives.get_objective(config).corrupt)
  a = corrupt(jax.random.key(0), batch, jnp.int32(3))[0]["masked_positions"]
  b = corrupt(jax.random.key(0), batch, jnp.int32(4))[0]["masked_positions"]
  c = corrupt(jax.random.key(0), batch, jnp.int32(3))[0]["masked_positions"]
  np.testing.assert_array_equal(a, c)  # a pure function of (seed, step)
  assert not np.array_equal(a, b)  # a new mask at the next step


def test_tiny_config_runs_a_real_train_step(demo_data):
  config = roberta.get_config("tiny")
  config.data_dir = demo_data.data_dir
  config.tokenizer = "unigram"  # the shared demo shards' tokenizer
  config.batch_size, config.seq_len, config.max_predictions_per_seq = 8, 48, 8
  config.shuffle_window = 32
  state, metrics = variant_steps.one_train_step(config, demo_data.source("train"))
  assert not any(name.startswith("nsp") for name in metrics)  # MLM only
  for name in ("loss", "mlm_loss", "mlm_accuracy", "grad_norm"):
    total, count = (float(x) for x in metrics[name])
    assert np.isfinite(total) and count > 0, name


def test_byte_fallback_bpe_never_emits_unknown(tmp_path):
  sentences = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)]
  tok = tokenizer_lib.train(sentences, os.path.join(tmp_path, "t.model"), 320,
                            "bpe_bytes")
  assert tokenizer_lib.model_type_of(tok.path) == "bpe_bytes"
  text = "Zürich 漢字 fox"  # none of these characters was in training
  ids, word_starts = tok.encode(text)
  assert batch_lib.UNK_ID not in ids.tolist()
  assert tok.decode(ids) == text
  assert word_starts.sum() == 3  # three words
  for want, piece in enumerate(batch_lib.SPECIAL_TOKENS):
    assert tok.id_to_piece(want) == piece

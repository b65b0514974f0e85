"""ERNIE 1.0's device-side masking: whole units at three levels (word,
phrase, entity) mixed at the configured rates, within the 15% budget, with
BERT's 80/10/10 replacement; and the objective's refusal of bad fields."""

import jax
import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import objectives
from bertjax.objectives import ernie

ernie_config = config_files.shipped("ernie")  # configs/ernie.py, loaded by path


def level_batch(rows=1500, seq_len=100, seed=0):
  """Rows of 1-2 token words; disjoint phrase and entity units of 2-3 words
  covering about 30% of the tokens each; [CLS] ... [SEP] ... [SEP]."""
  rng = np.random.default_rng(seed)
  b = batch_lib.empty_batch(rows, seq_len)
  kind = np.zeros((rows, seq_len), np.int8)  # 0 word, 1 phrase, 2 entity
  for i in range(rows):
    n = seq_len - int(rng.integers(0, 20))
    sep = int(rng.integers(20, n - 20))
    b["tokens"][i, :n] = rng.integers(5, 900, n)
    b["tokens"][i, [0, sep, n - 1]] = [batch_lib.CLS_ID, batch_lib.SEP_ID,
                                      batch_lib.SEP_ID]
    b["special"][i, :n] = False
    b["special"][i, [0, sep, n - 1]] = True
    b["doc_ids"][i, :n] = 1
    starts = [np.ones(seq_len, bool) for _ in range(3)]
    t = 1
    while t < n - 1:
      if t == sep:
        t += 1
        continue
      k = int(rng.choice(3, p=[0.4, 0.3, 0.3]))
      words = 1 if k == 0 else int(rng.integers(2, 4))
      end = t
      for w in range(words):
        size = int(rng.integers(1, 3))
        if end + size > (sep if t < sep else n - 1):
          break
        for s in starts:
          s[end + 1:end + size] = False  # inner sub-tokens
        if w > 0 and k:
          starts[k][end] = False  # inner word of the unit
        end += size
      if end == t:  # no room: a one-token word
        end = t + 1
      kind[i, t:end] = k
      t = end
    for name, s in zip(("word_starts", "phrase_starts", "entity_starts"), starts):
      b[name][i] = s
  b["example_id"][:, 0] = np.arange(rows)
  b["example_mask"][:] = True
  return b, kind


def masked_sets(config, batch, seed=0):
  objective = objectives.get_objective(config)
  keys = jax.random.split(jax.random.key(seed), len(batch["tokens"]))
  out = jax.jit(lambda k, b: ernie.mask_knowledge(
      k, b, objective.mlm, objective.level_rates))(keys, batch)
  return jax.tree.map(np.asarray, out)


@pytest.fixture(scope="module")
def level_run():
  config = ernie_config.get_config("tiny")
  config.max_predictions_per_seq = 20
  config.ernie_level_rates = "0.5,0.3,0.2"
  batch, kind = level_batch()
  return config, batch, kind, masked_sets(config, batch)


def unit_ids(starts):
  return np.cumsum(starts) - 1


def test_budget_specials_and_whole_units(level_run):
  config, batch, kind, out = level_run
  rates = []
  for i in range(len(kind)):
    chosen = out["masked_positions"][i][out["mlm_weights"][i] > 0]
    candidates = int((~batch["special"][i]).sum())
    budget = min(20, max(1, round(0.15 * candidates)))
    assert len(chosen) <= budget and not batch["special"][i, chosen].any()
    rates.append(len(chosen) / candidates)
    # Whole units of the row's level: every unit touched is taken entirely.
    level = ("word_starts", "phrase_starts", "entity_starts")[out["ernie_level"][i]]
    unit = unit_ids(batch[level][i])
    hit = np.zeros(len(unit), bool)
    hit[chosen] = True
    for u in np.unique(unit[chosen]):
      members = (unit == u) & ~batch["special"][i]
      assert hit[members].all()
  # 15% of ~88 candidates with units of 1-6 tokens skipped on overflow: the
  # mean rate stays within 1.5 points of 15% (rows: sd of the mean ~0.05 pt).
  assert abs(np.mean(rates) - 0.15) < 0.015, np.mean(rates)


def whole_long_units(batch, i, name, chosen):
  """Whether the mask holds at least one unit of 2+ words of ``name`` and
  every such unit it touches entirely."""
  unit = unit_ids(batch[name][i])
  words = np.bincount(unit, weights=batch["word_starts"][i] & ~batch["special"][i])
  hit = np.zeros(len(unit), bool)
  hit[chosen] = True
  touched = [u for u in np.unique(unit[chosen]) if words[u] >= 2]
  return bool(touched) and all(
      hit[(unit == u) & ~batch["special"][i]].all() for u in touched)


def test_levels_mix_at_the_configured_rates(level_run):
  _, batch, kind, out = level_run
  # Read each row's level from its mask alone: phrase (entity) rows take
  # whole phrases (entities) first, which a word-level row almost never does.
  inferred, phrase_share = [], []
  for i in range(len(kind)):
    chosen = out["masked_positions"][i][out["mlm_weights"][i] > 0]
    phrase = whole_long_units(batch, i, "phrase_starts", chosen)
    entity = whole_long_units(batch, i, "entity_starts", chosen)
    inferred.append(-1 if phrase and entity else 1 if phrase else 2 if entity else 0)
    phrase_share.append(np.mean(kind[i, chosen] == 1))
  inferred, phrase_share = np.array(inferred), np.array(phrase_share)
  # A word-level row covers a whole phrase and no partial one by chance ~1%.
  assert (inferred == out["ernie_level"]).mean() > 0.97
  # Phrases hold ~30% of the tokens, twice the budget: phrase rows spend
  # nearly all of it on them, word rows about 30%.
  assert phrase_share[inferred == 1].mean() > 0.85
  assert 0.2 < phrase_share[inferred == 0].mean() < 0.4
  n = len(kind)
  for k, p in enumerate((0.5, 0.3, 0.2)):
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(np.mean(inferred == k) - p) < 4 * sd + 0.015, k


def test_replacement_is_80_10_10(level_run):
  _, batch, _, out = level_run
  used = out["mlm_weights"] > 0
  pos = out["masked_positions"]
  new = np.take_along_axis(out["tokens"], pos, 1)[used]
  old = np.take_along_axis(batch["tokens"], pos, 1)[used]
  masked = np.mean(new == batch_lib.MASK_ID)
  kept = np.mean(new == old)  # includes random draws of the same id (~0.1%)
  # ~19k draws: sd 0.003 and 0.002; 4 sd tolerance.
  assert abs(masked - 0.8) < 0.012 and abs(kept - 0.1) < 0.009
  np.testing.assert_array_equal(out["mlm_targets"][used], old)


def test_objective_checks_its_fields():
  config = ernie_config.get_config("tiny")
  assert isinstance(objectives.get_objective(config), ernie.ErnieObjective)
  for field, value, match in (("ernie_level_rates", "0.5,0.5", "ernie_level_rates"),
                              ("ernie_level_rates", "0.5,0.6,-0.1", "ernie_level_rates"),
                              ("knowledge_spans", False, "knowledge_spans"),
                              ("whole_word_masking", True, "whole_word_masking")):
    bad = config.copy_and_resolve_references()
    bad[field] = value
    with pytest.raises(ValueError, match=match):
      objectives.get_objective(bad)

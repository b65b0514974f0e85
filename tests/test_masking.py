"""Statistical and exact checks of the jittable masking primitives."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax.objectives import masking


def bert_count(n, rate, max_predictions):
  """BERT's rule in doubles: min(P, max(1, round(rate * n))); 0 if n = 0."""
  return 0 if n == 0 else min(max_predictions, max(1, round(rate * n)))


@functools.partial(jax.jit, static_argnames=("rate", "max_predictions"))
def _choose_rows(keys, candidates, *, rate, max_predictions):
  return jax.vmap(functools.partial(
      masking.choose_positions, rate=rate,
      max_predictions=max_predictions))(keys, candidates)


@functools.partial(jax.jit, static_argnames=("rate", "max_predictions"))
def _choose_words(keys, candidates, word_starts, *, rate, max_predictions):
  return jax.vmap(functools.partial(
      masking.choose_whole_words, rate=rate,
      max_predictions=max_predictions))(keys, candidates, word_starts)


def _keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def test_prediction_budget_follows_bert_rule_exactly():
  seq_len, rate, max_predictions = 128, 0.15, 20
  n = jnp.arange(seq_len + 1)
  got = np.asarray(masking.prediction_budget(n, seq_len, rate, max_predictions))
  want = [bert_count(i, rate, max_predictions) for i in range(seq_len + 1)]
  np.testing.assert_array_equal(got, want)
  # The half-way case float32 gets wrong: 0.15 * 30 = 4.5 rounds to even 4.
  assert got[30] == 4


def test_choose_positions_count_rule_and_validity():
  rows, seq_len, max_predictions, rate = 1000, 64, 10, 0.15
  rs = np.random.RandomState(0)
  # Candidate densities from empty rows to full rows.
  density = rs.rand(rows, 1)
  density[:20] = 0.0
  candidates = rs.rand(rows, seq_len) < density
  positions, weights = _choose_rows(
      _keys(rows), jnp.asarray(candidates), rate=rate,
      max_predictions=max_predictions)
  positions, weights = np.asarray(positions), np.asarray(weights)
  for r in range(rows):
    count = int(weights[r].sum())
    assert count == bert_count(candidates[r].sum(), rate, max_predictions)
    np.testing.assert_array_equal(weights[r, :count], 1.0)
    np.testing.assert_array_equal(weights[r, count:], 0.0)
    np.testing.assert_array_equal(positions[r, count:], 0)
    used = positions[r, :count]
    assert candidates[r, used].all()
    assert (np.diff(used) > 0).all()  # unique and ascending


def test_choose_positions_is_uniform_over_candidates():
  draws, seq_len = 4000, 32
  candidates = np.zeros(seq_len, bool)
  candidates[5:25] = True  # 20 candidates -> budget round(3.0) = 3
  positions, weights = _choose_rows(
      _keys(draws, seed=1), jnp.tile(jnp.asarray(candidates), (draws, 1)),
      rate=0.15, max_predictions=8)
  hits = np.zeros(seq_len)
  for p, w in zip(np.asarray(positions), np.asarray(weights)):
    hits[p[w > 0]] += 1
  freq = hits / draws
  # Each candidate: p = 3/20 = 0.15, sd = sqrt(.15 * .85 / 4000) ~ 0.0056;
  # tolerance ~5 sd.
  np.testing.assert_allclose(freq[candidates], 0.15, atol=0.03)
  assert (freq[~candidates] == 0).all()


def test_choose_positions_rejects_more_slots_than_tokens():
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    masking.choose_positions(jax.random.key(0), jnp.ones(8, bool), rate=0.15,
                             max_predictions=9)


def test_whole_words_all_or_nothing_within_budget():
  rows, seq_len, max_predictions, rate = 600, 64, 16, 0.15
  rs = np.random.RandomState(2)
  word_starts = rs.rand(rows, seq_len) < 0.5
  word_starts[:, 0] = True
  special = rs.rand(rows, seq_len) < 0.1
  word_starts |= special  # a special token is a one-token word
  # The token after a special starts a new word.
  word_starts[:, 1:] |= special[:, :-1]
  candidates = ~special
  positions, weights = _choose_words(
      _keys(rows, seed=3), jnp.asarray(candidates), jnp.asarray(word_starts),
      rate=rate, max_predictions=max_predictions)
  positions, weights = np.asarray(positions), np.asarray(weights)
  chosen_total = candidate_total = 0
  for r in range(rows):
    chosen = np.zeros(seq_len, bool)
    chosen[positions[r][weights[r] > 0]] = True
    assert not (chosen & special[r]).any()
    word = np.cumsum(word_starts[r]) - 1
    sizes = np.bincount(word, weights=candidates[r], minlength=seq_len)
    for w in np.unique(word[chosen]):
      assert chosen[word == w].all(), "a word was split"
    budget = bert_count(candidates[r].sum(), rate, max_predictions)
    count = chosen.sum()
    # Prefix rule: stops only at a word that would overflow the budget.
    assert budget - sizes.max() < count <= budget
    chosen_total += count
    candidate_total += candidates[r].sum()
  # Words average 2 tokens here, so the prefix rule loses about half a word
  # per row: the rate stays within 2 points of 15%.
  assert 0.13 < chosen_total / candidate_total <= 0.15 + 1e-9


def test_replace_tokens_80_10_10_split_and_ranges():
  rows, seq_len, slots, vocab_size = 2000, 48, 16, 50000
  rs = np.random.RandomState(4)
  tokens = rs.randint(batch_lib.NUM_SPECIAL_TOKENS, vocab_size,
                      (rows, seq_len)).astype(np.int32)
  # Used slots avoid position 0, where the unused slots point.
  positions = np.stack([np.sort(rs.choice(seq_len - 1, slots, replace=False))
                        for _ in range(rows)]).astype(np.int32) + 1
  weights = np.ones((rows, slots), np.float32)
  weights[:, -4:] = 0.0  # unused slots must not change anything
  positions[:, -4:] = 0
  replace = jax.jit(jax.vmap(functools.partial(
      masking.replace_tokens, vocab_size=vocab_size, mask_token_rate=0.8,
      random_token_rate=0.1)))
  out = np.asarray(replace(_keys(rows, seed=5), tokens, positions, weights))
  touched = np.zeros_like(tokens, bool)
  for r in range(rows):
    touched[r, positions[r, :-4]] = True
  np.testing.assert_array_equal(out[~touched], tokens[~touched])
  new, old = out[touched], tokens[touched]
  # 24000 slots: sd of a fraction <= 0.0033; tolerance ~4.5 sd.
  is_mask = new == batch_lib.MASK_ID
  is_random = (~is_mask) & (new != old)
  assert abs(is_mask.mean() - 0.8) < 0.015
  assert abs(is_random.mean() - 0.1) < 0.015
  assert abs((new == old).mean() - 0.1) < 0.015
  randoms = new[is_random]
  assert randoms.min() >= batch_lib.NUM_SPECIAL_TOKENS
  assert randoms.max() < vocab_size


def test_example_keys_static_dynamic_and_order_free():
  ids = jnp.asarray([[3, 0], [3, 1], [7, 0], [9, 2]], jnp.int32)
  zeros = jnp.zeros(4, jnp.int32)

  def bits(keys):
    return np.asarray(jax.vmap(jax.random.bits)(keys))

  root = jax.random.key(0)
  static = functools.partial(masking.example_keys, root, masking="static",
                             dupe_factor=3)
  base = bits(static(ids, zeros, 0))
  np.testing.assert_array_equal(base, bits(static(ids, zeros + 3, 11)))
  assert (base != bits(static(ids, zeros + 1, 0))).all()
  assert len(set(base.tolist())) == 4
  perm = np.array([2, 0, 3, 1])
  np.testing.assert_array_equal(base[perm], bits(static(ids[perm], zeros, 0)))

  dynamic = functools.partial(masking.example_keys, root, masking="dynamic",
                              dupe_factor=3)
  step0 = bits(dynamic(ids, zeros, 0))
  np.testing.assert_array_equal(step0, bits(dynamic(ids, zeros + 5, 0)))
  assert (step0 != bits(dynamic(ids, zeros, 1))).all()
  with pytest.raises(ValueError, match="--config.masking"):
    masking.example_keys(root, ids, zeros, 0, masking="sometimes",
                         dupe_factor=3)

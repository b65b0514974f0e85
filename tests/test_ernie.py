"""ERNIE 1.0: phrase/entity units marked at prepare time and carried through
the packers and pair rebuilds; the tiny config's model and train step. The
device-side masking at three mixed levels is in test_ernie_masking.py."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import models
from bertjax import state as state_lib
from bertjax.data import knowledge
from bertjax.data import packing
from bertjax.data import pipeline
from bertjax.data import prepare
from bertjax.objectives import ernie
from bertjax.objectives import nsp
from bertjax.objectives import sop
import variant_steps

ernie_config = config_files.shipped("ernie")  # configs/ernie.py, loaded by path

KNOWLEDGE = batch_lib.KNOWLEDGE_FIELDS


class PieceTokenizer:
  """Stand-in tokenizer: id i decodes to PIECES[i]; the test says where words start."""

  def __init__(self, pieces):
    self.pieces = pieces

  def decode(self, ids):
    return "".join(self.pieces[int(i)] for i in ids)


def words_doc(sentences, vocab):
  """Documents whose every word is one token, except that ',' and '.' are
  extra (non-start) tokens of the word before them."""
  tokens, starts, lengths = [], [], []
  for sentence in sentences:
    n = 0
    for word in sentence.split():
      core = word.rstrip(",.")
      for k, piece in enumerate([core] + list(word[len(core):])):
        tokens.append(vocab.setdefault(piece, len(vocab)))
        starts.append(k == 0)
        n += 1
    lengths.append(n)
  return {"tokens": np.array(tokens, np.int32), "word_starts": np.array(starts),
          "sentence_lengths": np.array(lengths, np.int32)}


def reader_for(vocab):
  pieces = [""] * len(vocab)
  for piece, i in vocab.items():
    pieces[i] = piece
  return knowledge.WordReader(PieceTokenizer(pieces))


# --- prepare time: the chunker and the gazetteer -----------------------------

def test_marking_clears_inner_starts_of_whole_matches_only():
  vocab = {}
  doc = words_doc(["the event loop runs in New York today.",
                   "an event, loop here and New York.",
                   "it stops the event.", "Loop again in new york"], vocab)
  marker = knowledge.Marker(phrases=frozenset({("event", "loop")}),
                            entities=frozenset({("New", "York")}))
  out = marker.mark(doc, reader_for(vocab))
  ws = doc["word_starts"]
  pieces = reader_for(vocab)._tok.pieces
  text = [pieces[t] for t in doc["tokens"]]
  cleared = {name: [text[i] for i in np.flatnonzero(ws & ~out[name])]
             for name in KNOWLEDGE}
  # A comma and a sentence end break a unit (a final "." does not), and
  # entities are case-sensitive while phrases are not ("new york" is no entity).
  assert cleared["phrase_starts"] == ["loop"]
  assert cleared["entity_starts"] == ["York", "York"]
  assert not (out["phrase_starts"] & ~ws).any()
  assert not (out["entity_starts"] & ~ws).any()


def filler_words(count=400):
  """Distinct lower-case pseudo-words, most frequent first in zipf_corpus."""
  syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
  rng = np.random.default_rng(123)
  out = []
  while len(out) < count:
    word = "".join(rng.choice(syllables, int(rng.integers(2, 4))))
    if word not in out:
      out.append(word)
  return out


FILLERS = filler_words()
# A planted name, spelt with letters the fillers use (a small sentencepiece
# vocabulary has no piece for rare letters).
NAME = ["Tamo", "Tevi", "Tobu"]


def zipf_corpus(rng, num_sentences=3000):
  """Sentences of Zipf-distributed filler words, with a collocation ("event
  loop") and a capitalised name (NAME) planted mid-sentence."""
  p = 1.0 / np.arange(1, len(FILLERS) + 1)
  p /= p.sum()
  draws = rng.choice(len(FILLERS), (num_sentences, 14), p=p)
  sentences = []
  for row in draws:
    words = [FILLERS[k] for k in row[:int(rng.integers(6, 14))]]
    # Rarer than the 50th filler (~3% of sentences), so no function word.
    u = rng.random()
    if u < 0.012:
      words[2:2] = ["event", "loop"]
    elif u < 0.024:
      words[1:1] = NAME
    elif u < 0.027:
      words[3:3] = ["event"]  # "event" alone too: cohesive, not glued
    sentences.append(" ".join(["The"] + words) + ".")
  return sentences


def test_chunker_finds_planted_collocation_and_name_and_nothing_random():
  rng = np.random.default_rng(0)
  vocab = {}
  docs = [words_doc(zipf_corpus(rng)[i::10], vocab) for i in range(10)]
  reader = reader_for(vocab)
  marker = knowledge.fit(docs, reader, knowledge.Settings())
  assert ("event", "loop") in marker.phrases
  assert tuple(NAME) in marker.entities
  # Sentence-initial "The" is not a name, and no phrase edge is one of the
  # 50 most frequent words (about the first 50 fillers under a Zipf law).
  assert not any(e[0] == "The" for e in marker.entities)
  frequent = set(FILLERS[:40])
  assert not any(p[0] in frequent or p[-1] in frequent for p in marker.phrases)
  # Independent filler draws have PMI near 0: every phrase is a piece of a
  # planted sequence.
  planted = (("event", "loop"), tuple(w.lower() for w in NAME))
  assert all(any(p == q[k:k + len(p)] for q in planted for k in range(len(q)))
             for p in marker.phrases), marker.phrases


def test_gazetteer_file_replaces_the_default_and_missing_file_is_an_error(tmp_path):
  path = tmp_path / "names.txt"
  path.write_text("# people\nGuido van Rossum\n\nNew York,\n")
  config = ernie_config.get_config("tiny")
  config.ernie_gazetteer = str(path)
  settings = knowledge.Settings.from_config(config)
  vocab = {}
  doc = words_doc(["Guido van Rossum lives in New York."], vocab)
  marker = knowledge.fit([doc], reader_for(vocab), settings)
  assert marker.entities == {("Guido", "van", "Rossum"), ("New", "York")}
  # A different gazetteer content is a different fingerprint.
  before = settings.fingerprint()
  path.write_text("Guido van Rossum\n")
  assert knowledge.Settings.from_config(config).fingerprint() != before
  config.ernie_gazetteer = str(tmp_path / "missing.txt")
  with pytest.raises(ValueError, match="ernie_gazetteer"):
    knowledge.Settings.from_config(config)


def local_text(root, rng):
  sentences = zipf_corpus(rng, 2400)
  for k in range(24):
    (root / f"doc{k}.txt").write_text(" ".join(sentences[k::24]) + "\n")
  return str(root / "*.txt")


@pytest.fixture(scope="module")
def knowledge_data(tmp_path_factory):
  """The planted corpus prepared with knowledge_spans (vocab 300)."""
  root = tmp_path_factory.mktemp("ernie_text")
  config = ernie_config.get_config("tiny")
  config.dataset = "bertjax_local_text"
  config.text_files = local_text(root, np.random.default_rng(1))
  config.vocab_size = 300
  config.data_dir = str(tmp_path_factory.mktemp("ernie_data"))
  return config, prepare.prepare(config, config.data_dir)


def test_prepared_shards_mark_planted_units_and_mismatches_are_refused(knowledge_data):
  config, prepared = knowledge_data
  assert prepared.tokenized_dir.rstrip("/").split("/")[-2].endswith("__knowledge")
  lists = os.path.join(config.data_dir, "knowledge", "bertjax_local_text")
  assert "event loop\n" in open(os.path.join(lists, "phrases.txt")).read()
  assert " ".join(NAME) + "\n" in open(os.path.join(lists, "entities.txt")).read()
  tok = prepared.tokenizer()
  source = prepared.source("train")
  found = 0
  for i in range(len(source)):
    doc = source[i]
    ws = doc["word_starts"]
    starts = np.flatnonzero(ws).tolist() + [len(ws)]
    words = [tok.decode(doc["tokens"][a:b]).strip()
             for a, b in zip(starts[:-1], starts[1:])]
    for name, units in (("phrase_starts", (["event", "loop"], NAME)),
                        ("entity_starts", (NAME,))):
      assert not (doc[name] & ~ws).any()
      cleared = np.flatnonzero(ws & ~doc[name])
      # Every planted occurrence is one unit, and nothing else is merged.
      want = [starts[k + j] for unit in units for k in range(len(words))
              if words[k:k + len(unit)] == unit for j in range(1, len(unit))]
      assert sorted(want) == cleared.tolist(), name
      found += len(want)
  assert found > 50
  # Reuse is silent; other knowledge settings on the same shards are refused.
  assert prepare.prepare(config, config.data_dir).tokenized_dir == prepared.tokenized_dir
  other = config.copy_and_resolve_references()
  other.ernie_phrase_min_pmi = 1.0
  with pytest.raises(ValueError, match="point --config.data_dir at a new directory"):
    prepare.prepare(other, config.data_dir)


# --- host packing and in-step pair rebuilds carry the units ---------------

def unit_docs(count, seed=0, with_knowledge=True):
  """Documents of unique token ids (id - 1000 * (d + 1) = offset), so a row
  names the document offsets of its tokens; random nested boundaries."""
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(count):
    lengths = rng.integers(3, 30, int(rng.integers(2, 12))).astype(np.int32)
    n = int(lengths.sum())
    ws = rng.random(n) < 0.7
    ws[np.cumsum(lengths) - lengths] = True
    doc = {"tokens": (1000 * (d + 1) + np.arange(n)).astype(np.int32),
           "word_starts": ws, "sentence_lengths": lengths}
    if with_knowledge:
      doc["phrase_starts"] = ws & (rng.random(n) < 0.6)
      doc["entity_starts"] = ws & (rng.random(n) < 0.4)
      for name in KNOWLEDGE:
        doc[name][np.cumsum(lengths) - lengths] = True
    docs.append(doc)
  return docs


@pytest.mark.parametrize("layout", ["sentence_pairs", "doc_sentences", "full_sentences"])
def test_every_layout_carries_the_units_of_the_document(layout):
  docs = unit_docs(20)
  config = ernie_config.get_config("tiny")
  config.layout, config.seq_len, config.shuffle_window = layout, 40, 8
  batches = list(pipeline.make_eval_batches(config, docs, local_batch_size=8))
  checked = 0
  for b in batches:
    batch_lib.check_batch(b, 8, config.seq_len)
    tokens = b["tokens"]
    text = tokens >= 1000
    doc_of, offset = tokens // 1000 - 1, tokens % 1000
    # A token whose left neighbour is not its document predecessor opens a
    # segment or chunk: there the unit boundary is forced (True, or equal to
    # the word start when nothing was cut).
    prev = np.roll(tokens, 1, axis=1)
    continues = text & (prev == tokens - 1)
    for name in ("word_starts",) + KNOWLEDGE:
      got = b[name]
      for i, t in zip(*np.nonzero(continues)):
        assert got[i, t] == docs[doc_of[i, t]][name][offset[i, t]], name
        checked += 1
      opens = text & ~continues
      assert (got[opens] | ~b["word_starts"][opens]).all(), name
      assert got[~text & (b["doc_ids"] > 0)].all(), name  # CLS, SEP
  assert checked > 1000


def test_without_knowledge_shards_every_unit_is_a_word():
  config = ernie_config.get_config("tiny")
  config.seq_len = 40
  for layout in ("sentence_pairs", "doc_sentences"):
    config.layout = layout
    for b in pipeline.make_eval_batches(config, unit_docs(8, with_knowledge=False),
                                        local_batch_size=4):
      for name in KNOWLEDGE:
        np.testing.assert_array_equal(b[name], b["word_starts"])


def random_pairs(rng, n, seq_len):
  rows = []
  for _ in range(n):
    la = int(rng.integers(1, seq_len - 5))
    lb = int(rng.integers(1, seq_len - 2 - la))
    segs = []
    for length, low in ((la, 5), (lb, 50)):
      segs.append(packing.Segment(
          rng.integers(low, low + 40, length).astype(np.int32),
          rng.random(length) < .7, rng.random(length) < .5,
          rng.random(length) < .3))
    rows.append((*segs, packing.pair_row(*segs, seq_len)))
  return rows


def test_nsp_and_sop_rebuilds_move_the_units_with_their_tokens():
  rng = np.random.default_rng(3)
  seq_len, n = 28, 10
  rows = random_pairs(rng, n, seq_len)
  batch = {k: jnp.asarray(np.stack([r[2][k] for r in rows])) for k in rows[0][2]}
  partner = np.roll(np.arange(n), 3)
  use = np.arange(n) % 2 == 0
  negatives = jax.jit(nsp.pair_with_b_from)(batch, jnp.asarray(partner),
                                            jnp.asarray(use))
  swapped = jax.jit(sop.swap_segments)(batch, jnp.asarray(use))
  for i, (a, b, row) in enumerate(rows):
    # The partner's passage (its A then its B), cut to this row's B length.
    pa, pb = rows[partner[i]][:2]
    keep = min(len(b.tokens), len(pa.tokens) + len(pb.tokens))
    cut = packing.Segment(*(np.concatenate([x, y])[:keep] for x, y in zip(pa, pb)))
    want_nsp = packing.pair_row(a, cut, seq_len) if use[i] else row
    want_sop = packing.pair_row(b, a, seq_len) if use[i] else row
    for name in ("word_starts",) + KNOWLEDGE:
      np.testing.assert_array_equal(np.asarray(negatives[name][i]), want_nsp[name])
      np.testing.assert_array_equal(np.asarray(swapped[name][i]), want_sop[name])


# --- the tiny config -----------------------------------------------------------

def test_tiny_golden_parameter_shapes():
  config = ernie_config.get_config("tiny")
  params = jax.eval_shape(
      lambda r: models.get_model(config).init(
          {"params": r}, state_lib.dummy_inputs(config), deterministic=True),
      jax.random.key(0))["params"]
  # BERT's architecture at the tiny size: 2 layers, H 128, 2 heads of 64,
  # MLP 512, vocab 8000, 512 positions, 2 token types, pooler + NSP head.
  V, H, F, P = 8000, 128, 512, 512
  want = {
      "embeddings/word_embeddings/embedding": (V, H),
      "embeddings/position_embeddings/embedding": (P, H),
      "embeddings/type_embeddings/embedding": (2, H),
      "embeddings/layer_norm/scale": (H,), "embeddings/layer_norm/bias": (H,),
      "pooler/kernel": (H, H), "pooler/bias": (H,),
      "nsp/kernel": (H, 2), "nsp/bias": (2,),
      "mlm_head/dense/kernel": (H, H), "mlm_head/dense/bias": (H,),
      "mlm_head/layer_norm/scale": (H,), "mlm_head/layer_norm/bias": (H,),
      "mlm_head/output_bias": (V,),
  }
  want.update(variant_steps.encoder_layer_shapes(2, H, 2, F))
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  assert {k: tuple(v.shape) for k, v in flat.items()} == want


def test_tiny_config_runs_a_real_train_step(knowledge_data):
  config, prepared = knowledge_data
  config = config.copy_and_resolve_references()
  config.batch_size, config.seq_len, config.max_predictions_per_seq = 8, 48, 8
  config.shuffle_window = 32
  state, metrics = variant_steps.one_train_step(config, prepared.source("train"))
  for name in ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy"):
    total, count = (float(x) for x in metrics[name])
    assert np.isfinite(total) and count > 0, name
  counts = sum(float(metrics[f"mlm_accuracy_{lv}"][1]) for lv in ernie.LEVELS)
  assert counts == float(metrics["mlm_accuracy"][1])
  assert int(state.step) == 1


def test_a_mixture_fits_one_set_of_lists_on_all_its_corpora(tmp_path):
  """Corpus one plants "event loop", corpus two "water mill" (each its
  own): the one set of lists has both, and each corpus's shards mark its
  own collocation as one unit."""
  rng = np.random.default_rng(2)
  first, second = tmp_path / "one", tmp_path / "two"
  first.mkdir()
  second.mkdir()
  local_text(first, rng)
  local_text(second, rng)
  for path in second.iterdir():
    path.write_text(path.read_text().replace("event loop", "water mill"))
  config = ernie_config.get_config("tiny")
  config.vocab_size = 300
  config.mixture = (f"bertjax_local_text text_files={first}/*.txt; "
                    f"bertjax_local_text text_files={second}/*.txt weight=2")
  data_dir = str(tmp_path / "data")
  mixed = prepare.prepare(config, data_dir)
  lists = os.listdir(os.path.join(data_dir, "knowledge"))
  assert lists == [os.path.basename(mixed.tokenizer_path)[:-len(".model")]]
  phrases = open(os.path.join(data_dir, "knowledge", lists[0], "phrases.txt")).read()
  assert "event loop\n" in phrases and "water mill\n" in phrases
  tok = mixed.tokenizer()
  for part, (planted, absent) in zip(mixed.parts, ((["event", "loop"], ["water", "mill"]),
                                                   (["water", "mill"], ["event", "loop"]))):
    assert part.tokenized_dir.rstrip("/").split("/")[-2].endswith("__knowledge")
    source = part.source("train")
    marked = 0
    for i in range(len(source)):
      doc = source[i]
      starts = np.flatnonzero(doc["word_starts"]).tolist() + [len(doc["tokens"])]
      words = [tok.decode(doc["tokens"][a:b]).strip()
               for a, b in zip(starts[:-1], starts[1:])]
      assert not any(words[k:k + 2] == absent for k in range(len(words)))
      for k in range(len(words) - 1):
        if words[k:k + 2] == planted:
          # The second word's start is cleared: one unit with the first.
          assert not doc["phrase_starts"][starts[k + 1]]
          marked += 1
    assert marked > 10

"""Pretraining on a weighted mixture of corpora (bertjax/data/mixture.py)."""

import collections
import dataclasses
import os
import types

import numpy as np
import pytest

from bertjax import compat
from bertjax import train
from bertjax.data import mixture
from bertjax.data import prepare
from bertjax.data import shards

import corpus_files
from test_train import read_metrics


def _config(demo_config, text, **overrides):
  config = demo_config.copy_and_resolve_references()
  config.mixture = text
  config.vocab_size = 400
  for k, v in overrides.items():
    config[k] = v
  return config


@pytest.mark.parametrize("text,needle", [
    ("pg19;; bertjax_python_docs", "has an empty entry"),
    ("pg19 weight=-1", "weight='-1'.*positive number"),
    ("pg19 weight=many", "weight='many'"),
    ("pg19 feature=body", "option 'feature=body'.*key=value with key one of"),
    ("weight=2 pg19", "does not start with a dataset name"),
    ("bertjax_local_text/paragraphs", "no text_files.*add text_files="),
    ("pg19; pg19 weight=2", "reads the same text as 'pg19'"),
    ("pg19 weight=1 weight=3", "gives weight twice.*keep one weight="),
    ("bertjax_local_text text_files=a.txt text_feature=body",
     "sets text_feature on local text.*drop text_feature="),
    ("pg19 share=0", "share='0'.*positive part of a pass's tokens"),
    ("pg19 share=0.5 weight=2", "gives both a weight and a share.*keep one"),
    ("pg19 share=0.5; bertjax_python_docs", "'bertjax_python_docs' has no share while "
     "'pg19 share=0.5' has one.*give every corpus a share"),
])
def test_bad_entries_get_one_sentence(demo_config, text, needle):
  config = _config(demo_config, text, text_files="")
  with pytest.raises(ValueError, match=needle) as info:
    mixture.parse(config)
  message = str(info.value)
  assert message.count("; ") >= 1 and "\n" not in message


def test_entries_take_the_config_defaults(demo_config):
  config = _config(demo_config, " wikipedia/20230601.en weight=3 train_split=train[:99%]"
                   " eval_split=train[99%:] ;pg19 text_feature=book_text ",
                   text_feature="text", train_split="train", eval_split="validation")
  wiki, books = mixture.parse(config)
  assert (wiki.dataset, wiki.weight, wiki.text_feature, wiki.train_split,
          wiki.eval_split) == ("wikipedia/20230601.en", 3.0, "text", "train[:99%]",
                               "train[99%:]")
  assert (books.dataset, books.weight, books.text_feature, books.train_split,
          books.eval_split) == ("pg19", 1.0, "book_text", "train", "validation")
  assert wiki.key() != books.key()
  # The tokenizer's name depends on the texts only: not weights, not order.
  reweighted = _config(demo_config, "pg19 text_feature=book_text weight=5; "
                       "wikipedia/20230601.en train_split=train[:99%] "
                       "eval_split=train[99%:]", text_feature="text",
                       train_split="train", eval_split="validation")
  assert mixture.name(mixture.parse(reweighted)) == mixture.name([wiki, books])
  other_eval = _config(demo_config, "pg19 text_feature=book_text eval_split=test; "
                       "wikipedia/20230601.en train_split=train[:99%]",
                       text_feature="text", train_split="train", eval_split="validation")
  assert mixture.name(mixture.parse(other_eval)) == mixture.name([wiki, books])
  assert {c.key() for c in mixture.parse(other_eval)} != {wiki.key(), books.key()}
  other = _config(demo_config, "pg19 text_feature=book_text")
  assert mixture.name(mixture.parse(other)) != mixture.name([wiki, books])


def test_two_local_texts_are_told_apart_in_the_logs(demo_config):
  # Both used to be logged as plain 'bertjax_local_text'.
  config = _config(demo_config, "bertjax_local_text text_files=notes/*.txt; "
                   "bertjax_local_text/paragraphs text_files=mail/*.txt weight=2; pg19",
                   text_files="")
  text = mixture.describe(mixture.parse(config))
  assert text == ("bertjax_local_text['notes/*.txt'] x1 + "
                  "bertjax_local_text/paragraphs['mail/*.txt'] x2 + pg19 x1"), text


def _stub_part():
  return types.SimpleNamespace(
      tokenizer_path="t.model", vocab_size=400, fingerprint="f", tokenized_dir="d",
      splits={"train": 4, "validation": 2}, num_tokens={}, unk_rate={},
      source=lambda split: split)


def test_local_texts_get_readable_metric_names_and_keep_their_shards(demo_config):
  # Local text used to be named 'bertjax_local_text_<hash>' in the metrics.
  config = _config(demo_config, "bertjax_local_text/paragraphs text_files=corpora/legal/*.txt;"
                   " bertjax_local_text text_files=~/notes.txt,mail/**/*.eml eval_split=;"
                   " bertjax_local_text text_files=gs://b/a/legal/part-*.txt; pg19;"
                   " bertjax_local_text text_files=*.txt", text_files="",
                   train_split="train", eval_split="validation")
  corpora = mixture.parse(config)
  data = mixture.MixedData(corpora, [_stub_part() for _ in corpora], train_split="train",
                           eval_split="validation", data_dir="")
  # The file or directory name; a digest only where two collide; the
  # dataset where the files have no name. Fixed by the config alone (resume).
  assert data.labels() == ["legal_561b2216", "notes_mail", "legal_2afb67ba", "pg19",
                           "bertjax_local_text"]
  # Evaluation names each corpus that has an eval split the same way.
  assert [label for label, _ in data.eval_sources("validation")] == (
      data.labels()[:1] + data.labels()[2:])
  # The prepared data's names are not touched: existing data_dirs are reused.
  assert [mixture.shards_name(config, c).partition("__")[2] for c in corpora] == [
      "bertjax_local_text_paragraphs_561b2216", "bertjax_local_text_4abaece1",
      "bertjax_local_text_2afb67ba", "pg19_30e44639", "bertjax_local_text_5ec6c1f5"]
  assert [c.text_key() for c in corpora] == [
      "bertjax_local_text_paragraphs_d6b6213b", "bertjax_local_text_6e25d7d7",
      "bertjax_local_text_558c3f76", "pg19_6f365d96", "bertjax_local_text_fed1ccd3"]


@pytest.mark.parametrize("shares,tokens", [((7, 3), (1000, 50_000)), ((0.2, 0.5, 0.3),
                                                                        (10, 10, 10**6))])
def test_shares_give_each_corpus_its_part_of_a_pass_as_large_as_all(shares, tokens):
  corpora = [mixture.Corpus(f"c{i}", 1.0, "text", "", "train", "", share=s)
             for i, s in enumerate(shares)]
  weights = mixture.weights(corpora, tokens)
  pass_tokens = [w * t for w, t in zip(weights, tokens)]
  assert sum(pass_tokens) == pytest.approx(sum(tokens), rel=1e-12)
  for part, share in zip(pass_tokens, shares):
    assert part / sum(pass_tokens) == pytest.approx(share / sum(shares), rel=1e-12)
  # Entries with weights keep them; an empty corpus cannot make its share.
  plain = [dataclasses.replace(c, share=0.0, weight=2.5) for c in corpora]
  assert mixture.weights(plain, tokens) == [2.5] * len(shares)
  with pytest.raises(ValueError, match="c0 has no tokens in train.*drop it or fix"):
    mixture.weights(corpora, (0,) + tuple(tokens[1:]))


@pytest.mark.parametrize("n,count", [(10, 30), (1000, 300), (997, 1500), (1, 4), (7, 7)])
def test_a_pass_holds_each_document_as_its_weight_says(n, count):
  source = mixture.MixedSource([np.arange(n)], [count])
  picked = np.array([source[i] for i in range(len(source))])
  assert len(source) == count
  times = np.bincount(picked, minlength=n)
  # Every document count // n or count // n + 1 times; the extra ones spread
  # evenly: in each tenth of the corpus a tenth of them, to within one
  # (the picks are n / r apart) plus one (a pick rounded across a bin edge).
  assert set(times) <= {count // n, count // n + 1}
  extra = np.flatnonzero(times > count // n)
  assert len(extra) == count % n
  if n >= 100 and count % n:
    per_tenth = np.histogram(extra, bins=10, range=(0, n))[0]
    assert np.all(np.abs(per_tenth - (count % n) / 10) <= 2), per_tenth


def test_corpora_follow_each_other_and_eval_is_in_order():
  a, b = list(range(100, 110)), list(range(200, 204))
  source = mixture.MixedSource([a, b], [20, 2])
  assert collections.Counter(source.locate(i)[0] for i in range(22)) == {0: 20, 1: 2}
  assert [source[i] for i in range(20)].count(105) == 2
  assert [source[i] for i in range(20, 22)] == [201, 203]  # half of b, spread
  ordered = mixture.MixedSource([a, b], [10, 4])
  assert [ordered[i] for i in range(14)] == a + b
  with pytest.raises(IndexError):
    ordered[14]


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
  """The pydoc topic files in two halves: alphabetical first half, second half."""
  root = tmp_path_factory.mktemp("mixture_texts")
  corpus_files.write_topic_files(root)
  files = sorted(p for p in os.listdir(root))
  half = len(files) // 2
  for name in files[:half]:
    os.makedirs(root / "first", exist_ok=True)
    os.rename(root / name, root / "first" / name)
  for name in files[half:]:
    os.makedirs(root / "second", exist_ok=True)
    os.rename(root / name, root / "second" / name)
  return root


def _text(root, first_weight):
  return (f"bertjax_local_text/paragraphs weight={first_weight} "
          f"text_files={root}/first/*.txt; "
          f"bertjax_local_text/paragraphs text_files={root}/second/*.txt")


def _files(root):
  return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, demo_config, two_corpora):
  data_dir = str(tmp_path_factory.mktemp("mixture_data"))
  config = _config(demo_config, _text(two_corpora, 2), data_dir=data_dir)
  return config, prepare.prepare(config, data_dir)


def test_one_tokenizer_for_all_and_a_weighted_pass(mixed, two_corpora, demo_config):
  config, data = mixed
  models = os.listdir(os.path.join(data.data_dir, "tokenizers"))
  assert models == [f"{mixture.name(data.corpora)}.model"]
  first, second = data.parts
  assert first.fingerprint == second.fingerprint == data.fingerprint
  n1, n2 = first.splits["train"], second.splits["train"]
  assert data.splits["train"] == 2 * n1 + n2 == len(data.source("train"))
  # Each document of the pass is the document of its corpus it names.
  parts = [part.source("train") for part in data.parts]
  train_source = data.source("train")
  seen = collections.Counter()
  for i in range(len(train_source)):
    k, doc = train_source.locate(i)
    assert np.array_equal(train_source[i]["tokens"], parts[k][doc]["tokens"])
    seen[k, doc] += 1
  assert sum(v for (k, _), v in seen.items() if k == 0) == 2 * n1
  assert {v for (k, _), v in seen.items() if k == 0} == {2}
  assert {v for (k, _), v in seen.items() if k == 1} == {1}
  assert len(seen) == n1 + n2
  # Evaluation reads both corpora's validation splits once, in entry order.
  val = data.source("validation")
  expected = ([first.source("validation")[i] for i in range(first.splits["validation"])]
              + [second.source("validation")[i] for i in range(second.splits["validation"])])
  assert len(val) == data.splits["validation"] == len(expected)
  assert all(np.array_equal(val[i]["tokens"], e["tokens"]) for i, e in enumerate(expected))

  # The pass's [UNK] rate is a mean of the corpora's: between theirs.
  for split in ("train", "validation"):
    rates = [part.unk_rate[split] for part in data.parts]
    assert min(rates) - 1e-12 <= data.unk_rate[split] <= max(rates) + 1e-12
  # `prepare --verify` reads every shard prepare made, the corpora's text too.
  reports = shards.verify(data.data_dir)
  assert all(r.problem is None for r in reports)
  assert {r.shard.dataset_dir for r in reports} >= {first.tokenized_dir, second.tokenized_dir}
  assert sum("bertjax_mixture_text" in r.shard.path for r in reports) >= 4  # 2 corpora x 2 splits

  # Again, and re-weighted: everything reused, nothing written.
  before = _files(data.data_dir)
  again = prepare.prepare(_config(demo_config, _text(two_corpora, 0.5),
                                  data_dir=data.data_dir), data.data_dir)
  assert _files(data.data_dir) == before
  assert again.fingerprint == data.fingerprint
  assert again.train_counts() == [mixture.copies(n1, 0.5), n2]


def test_shares_hold_on_the_tokens_of_a_prepared_pass(mixed, two_corpora, demo_config):
  config, data = mixed
  text = (f"bertjax_local_text/paragraphs share=1 text_files={two_corpora}/first/*.txt; "
          f"bertjax_local_text/paragraphs share=3 text_files={two_corpora}/second/*.txt")
  before = _files(data.data_dir)
  shared = prepare.prepare(_config(demo_config, text, data_dir=data.data_dir), data.data_dir)
  assert _files(data.data_dir) == before  # the same texts: tokenizer and shards reused
  source = shared.source("train")
  tokens = [0, 0]
  for i in range(len(source)):
    tokens[source.locate(i)[0]] += len(source[i]["tokens"])
  longest = max(len(part.source("train")[j]["tokens"])
                for part in shared.parts for j in range(part.splits["train"]))
  # A quarter of the pass's tokens from the first corpus, to within the
  # rounding of its document count (half a document of the longest) and the
  # spread of the evenly picked fraction's mean length (two documents).
  assert abs(tokens[0] / sum(tokens) - 0.25) <= 2.5 * longest / sum(tokens)
  # The pass is as large as the two corpora together, to the same tolerance.
  both = sum(part.num_tokens["train"] for part in shared.parts)
  assert abs(sum(tokens) - both) <= 5 * longest
  assert shared.num_tokens["train"] == pytest.approx(sum(tokens), abs=5 * longest)


def test_a_mixture_trains_and_resume_refuses_new_weights(mixed, two_corpora, demo_config,
                                                         tmp_path):
  config, data = mixed
  config = config.copy_and_resolve_references()
  config.update(batch_size=8, seq_len=64, max_predictions_per_seq=10, num_train_steps=2,
                checkpoint_every_steps=2, log_every_steps=1, eval_max_batches=1,
                shuffle_window=16)
  workdir = str(tmp_path / "run")
  record = train.train_and_evaluate(config, workdir)
  # Each corpus's eval split is scored apart (eval_max_batches each); the
  # record's own figures are over both.
  labels = [label for label, _ in data.eval_sources(config.eval_split)]
  assert len(labels) == 2 and labels[0] != labels[1]
  for field in ("num_tokens", "num_predictions"):
    assert record[field] == sum(record[f"{label}/{field}"] for label in labels) > 0
  accuracy = sum(record[f"{label}/mlm_accuracy"] * record[f"{label}/num_predictions"]
                 for label in labels) / record["num_predictions"]
  assert accuracy == pytest.approx(record["mlm_accuracy"], abs=1e-6)
  losses = {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}
  assert sorted(losses) == [1, 2] and np.isfinite(list(losses.values())).all()
  # Training rows carry each corpus's masked-LM figures (corpus_metrics).
  train_labels = data.labels()
  assert train_labels == labels  # both corpora have an eval split here
  for row in read_metrics(workdir):
    if "loss" not in row:
      continue
    present = [label for label in train_labels if f"{label}/mlm_share" in row]
    assert present and sum(row[f"{label}/mlm_share"] for label in present) == (
        pytest.approx(1.0, abs=1e-6))
    assert sum(row[f"{label}/mlm_share"] * row[f"{label}/mlm_loss"]
               for label in present) == pytest.approx(row["mlm_loss"], rel=1e-5)
  reweighted = config.copy_and_resolve_references()
  reweighted.update(mixture=_text(two_corpora, 1), num_train_steps=4)
  with pytest.raises(compat.IncompatibleCheckpoint, match="mixture.*allow_changes"):
    train.train_and_evaluate(reweighted, workdir)


def test_train_steps_sum_each_corpus_apart(mixed):
  # corpus_metrics: rows are labelled with their document's corpus, and the
  # step's per-corpus sums split the masked-LM figures between corpora, the
  # same with and without gradient accumulation.
  import jax
  from bertjax import corpus_metrics
  from bertjax import metrics as metrics_lib
  from bertjax import models, objectives, optim, sharding
  from bertjax import state as state_lib
  from bertjax.data import pipeline
  config, data = mixed
  config = config.copy_and_resolve_references()
  config.update(batch_size=8, seq_len=64, max_predictions_per_seq=10, shuffle_window=16)
  source = data.source(config.train_split)
  labels = data.labels()
  it = corpus_metrics.labelled(
      pipeline.make_train_iterator(config, source, local_batch_size=8), source, len(labels))
  first = data.train_counts()[0]
  for _ in range(50):  # a batch with rows of both corpora
    batch = next(it)
    if 0 < (batch["example_id"][:, 0] >= first).sum() < 8:
      break
  # The pass holds the first corpus's documents first (MixedSource): a row's
  # label follows from its document index alone.
  want = (batch["example_id"][:, 0] >= first).astype(int)
  np.testing.assert_array_equal(batch[corpus_metrics.FIELD].argmax(1), want)
  assert (batch[corpus_metrics.FIELD].sum(1) == 1).all()
  assert 0 < want.sum() < len(want)  # both corpora in this batch
  mesh = sharding.make_mesh("1,1,1", jax.devices()[:1])
  model, objective = models.get_model(config), objectives.get_objective(config)
  tx = optim.make_optimizer(config)
  figures = []
  for micro in (1, 2):
    state, shardings = state_lib.create_train_state(model, tx, config, mesh)
    step = train.make_train_step(model, objective, tx, shardings, mesh,
                                 microbatches=micro)
    with sharding.use_mesh(mesh):
      _, sums = step(state, train.to_global(batch, mesh), jax.random.key(0))
    figures.append(metrics_lib.reduce(corpus_metrics.expand(sums, labels)))
  for got in figures:
    shares = [got[f"{label}/mlm_share"] for label in labels]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6) and min(shares) > 0
    for metric in ("mlm_loss", "mlm_accuracy"):
      assert sum(got[f"{label}/mlm_share"] * got[f"{label}/{metric}"]
                 for label in labels) == pytest.approx(got[metric], rel=1e-5)
  # Accumulating over two micro-batches splits the same sums.
  for key, value in figures[0].items():
    if "/" in key:
      assert figures[1][key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.parametrize("second, needle", [
    ("bertjax_local_txt text_files={files}",
     r"^Unknown dataset 'bertjax_local_txt'; begin config\.mixture entry "
     r"'bertjax_local_txt text_files=.*' with bertjax_python_docs, bertjax_local_text"),
    ("bertjax_python_docs eval_split=nosuch",
     r"no split 'nosuch'.*; set eval_split= in config\.mixture entry "
     r"'bertjax_python_docs eval_split=nosuch' to one of them"),
])
def test_every_entry_is_checked_before_any_work(demo_config, tmp_path, second, needle):
  """A bad later entry is refused naming the entry, before the first
  corpus's text is built (nothing is made in the data_dir)."""
  texts = tmp_path / "texts"
  texts.mkdir()
  corpus_files.write_topic_files(texts)
  config = _config(demo_config, f"bertjax_local_text text_files={texts}/*.txt; "
                   + second.format(files=f"{texts}/*.txt"), text_files="")
  data_dir = tmp_path / "data"
  with pytest.raises(ValueError, match=needle):
    prepare.prepare(config, str(data_dir))
  assert not data_dir.exists()


def test_two_globs_of_the_same_files_are_refused(demo_config, tmp_path):
  texts = tmp_path / "texts"
  texts.mkdir()
  corpus_files.write_topic_files(texts)
  config = _config(demo_config, f"bertjax_local_text text_files={texts}/*.txt; "
                   f"bertjax_local_text text_files={texts}/*.t*", text_files="")
  with pytest.raises(ValueError, match=(
      r"^config\.mixture entry 'bertjax_local_text text_files=.*\*\.t\*' reads the "
      r"same files as 'bertjax_local_text text_files=.*\*\.txt' \(\d+ files\); list "
      r"each corpus once")):
    prepare.prepare(config, str(tmp_path / "data"))
  assert not (tmp_path / "data").exists()

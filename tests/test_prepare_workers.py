"""prepare's tokenizing workers: the shards do not depend on how many there are."""

import numpy as np
import pytest

from bertjax.data import prepare
from bertjax.data import progress
from bertjax.data import python_docs
from bertjax.data import tokenize_workers


def _records(data):
  out = {}
  for split in data.splits:
    source = data.source(split)
    out[split] = [{k: np.asarray(v).tolist() for k, v in source[i].items()}
                  for i in range(len(source))]
  return out


def test_shards_do_not_depend_on_worker_count(demo_config, tmp_path, monkeypatch):
  # Small chunks, so that 3 workers each get several and finish out of order.
  monkeypatch.setattr(tokenize_workers, "CHUNK_DOCUMENTS", 16)
  texts = tmp_path / "texts"
  texts.mkdir()
  for name, paragraphs in python_docs.topic_documents():
    (texts / f"{name.split(':')[1]}.txt").write_text("\n\n".join(paragraphs) + "\n")
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text/paragraphs"
  config.text_files = f"{texts}/*.txt"
  config.vocab_size = 400
  results = []
  for workers in (1, 3):
    config.prepare_workers = workers
    data = prepare.prepare(config, str(tmp_path / f"w{workers}"))
    results.append((data.fingerprint, data.splits, _records(data)))
  assert sum(results[0][1].values()) > 3 * 16
  assert results[0] == results[1]


def test_negative_workers_say_what_to_do():
  with pytest.raises(ValueError, match="prepare_workers"):
    tokenize_workers.resolve_workers(-1)


def test_progress_line_counts_documents_and_rate(caplog):
  docs = [(str(i), ["x" * 1000]) for i in range(5)]
  with caplog.at_level("INFO"):
    assert list(progress.counted(docs, "train", total=10, interval_s=0)) == docs
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train:")]
  assert lines[-1].startswith("train: 5/10 documents, 0.0 MB of text,")
  assert "MB/s, ETA" in lines[-1]

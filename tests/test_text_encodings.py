"""Text files as editors and other systems write them (what prepare's text
dataset holds of a byte-order mark, CRLF line ends), and a disk that fills
while they are prepared."""

import corpus_files
from bertjax.data import text_sources

_ENGINE = text_sources.Engine(workers=1, block_bytes=8 << 20)  # no file cut


def _config(demo_config, text_files):
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = text_files
  return config


def _documents(config, data_dir):
  """document id -> its sentences, of both splits."""
  out = {}
  for split in text_sources.text_sources(config, data_dir, _ENGINE).values():
    source = split.source.open()
    for i in range(len(source)):
      example = source[i]
      out[example["id"].decode()] = [s.decode() for s in example["sentences"]]
  return out


def test_a_utf8_byte_order_mark_is_not_text(demo_config, tmp_path):
  """A file saved with a BOM (Notepad's "UTF-8 with BOM") and CRLF line ends
  gives the sentences of the same text saved without them; the BOM used to
  stick to the file's first word."""
  plain, marked = tmp_path / "plain", tmp_path / "marked"
  plain.mkdir()
  corpus_files.write_topic_files(plain)
  marked.mkdir()
  for f in sorted(plain.glob("*.txt")):
    text = f.read_text().replace("\n", "\r\n")
    (marked / f.name).write_bytes(b"\xef\xbb\xbf" + text.encode())
  want = _documents(_config(demo_config, f"{plain}/*.txt"), str(tmp_path / "a"))
  got = _documents(_config(demo_config, f"{marked}/*.txt"), str(tmp_path / "b"))
  assert got == want
  assert not any(s.startswith("\ufeff") for doc in got.values() for s in doc)


def test_a_file_of_a_byte_order_mark_alone_is_an_empty_file(demo_config, tmp_path,
                                                              caplog):
  """Skipped and named as empty, as a file of whitespace is (it gave a
  document of one U+FEFF, then, with the mark dropped, nothing unsaid)."""
  import logging
  src = tmp_path / "src"
  src.mkdir()
  corpus_files.write_topic_files(src)
  (src / "zz_bom_only.txt").write_bytes(b"\xef\xbb\xbf\r\n")
  with caplog.at_level(logging.WARNING):
    got = _documents(_config(demo_config, f"{src}/*.txt"), str(tmp_path / "data"))
  assert "zz_bom_only.txt" not in got
  assert "Skipped 1 empty" in caplog.text and "zz_bom_only.txt" in caplog.text


def test_a_full_disk_mid_shard_leaves_no_partial_file(demo_config, tmp_path, monkeypatch):
  """The writer's ENOSPC (simulated after a few records) ends the prepare; the
  partial shard it was writing is removed (it used to stay in .staging under
  its pid's name, never reused, holding the space the rerun needs), and the
  rerun, with room again, finishes."""
  import errno
  from bertjax.data import staged
  src = tmp_path / "src"
  src.mkdir()
  corpus_files.write_topic_files(src)
  config = _config(demo_config, f"{src}/*.txt")
  data_dir = tmp_path / "data"
  real = staged.array_record_module.ArrayRecordWriter

  class FillsTheDisk:
    def __init__(self, path, options):
      self._writer, self._left = real(path, options), 3

    def write(self, record):
      if not self._left:
        raise OSError(errno.ENOSPC, "No space left on device")
      self._left -= 1
      self._writer.write(record)

    def close(self):
      self._writer.close()

  monkeypatch.setattr(staged.array_record_module, "ArrayRecordWriter", FillsTheDisk)
  engine = text_sources.Engine(workers=1, block_bytes=30_000)
  try:
    text_sources.text_sources(config, str(data_dir), engine)
  except OSError as e:
    assert e.errno == errno.ENOSPC
  else:
    raise AssertionError("the full disk went unnoticed")
  left = [p.name for p in data_dir.rglob("*") if ".tmp-" in p.name]
  assert left == []
  monkeypatch.setattr(staged.array_record_module, "ArrayRecordWriter", real)
  assert text_sources.text_sources(config, str(data_dir), engine)["train"].num_docs > 0


def test_old_mac_line_ends_separate_paragraphs(demo_config, tmp_path):
  """Files whose lines end in a lone "\\r" (classic Mac OS) give the same
  paragraphs, and the same cuts of a file into blocks, as the same text with
  "\\n": their blank lines used to go unseen, each file one paragraph."""
  plain, mac = tmp_path / "plain", tmp_path / "mac"
  plain.mkdir()
  corpus_files.write_topic_files(plain)
  mac.mkdir()
  for f in sorted(plain.glob("*.txt")):
    (mac / f.name).write_bytes(f.read_bytes().replace(b"\n", b"\r"))
  engine = text_sources.Engine(workers=1, block_bytes=30_000)  # files are cut
  got = {}
  for name in ("plain", "mac"):
    config = _config(demo_config, f"{tmp_path / name}/*.txt")
    config.dataset = "bertjax_local_text/paragraphs"
    got[name] = {}
    for split in text_sources.text_sources(config, str(tmp_path / f"data_{name}"),
                                           engine).values():
      source = split.source.open()
      for i in range(len(source)):
        example = source[i]
        got[name][example["id"].decode()] = [s.decode() for s in example["sentences"]]
  assert len(got["plain"]) > 2 * len(list(plain.glob("*.txt")))
  assert got["mac"] == got["plain"]

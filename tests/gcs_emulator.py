"""A local GCS endpoint for tests: gcp-storage-emulator with four gaps closed.

The PyPI ``gcp-storage-emulator`` speaks GCS's JSON API well enough for
gcsfs (etils.epath's gs:// backend), google-cloud-storage and tensorstore
(orbax's array store), except where it differs from GCS in ways those
clients rely on (see ../shared notes in the repo docs, README "gs://"):

1. media downloads lack ``x-goog-generation`` / ``x-goog-metageneration``;
2. ``ifGenerationMatch`` / ``ifGenerationNotMatch`` are ignored (here kept,
   on multipart uploads too, whose object name is in the body);
3. listings ignore ``startOffset`` / ``endOffset``;
4. ``moveTo`` (gcsfs's rename) is not implemented.

``Emulator`` serves the emulator's own handlers behind a request handler that
closes these four, and ``environment()`` gives the documented settings that
point each client at it.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
from functools import partial
from http import HTTPStatus
from http import server as http_server
from urllib.parse import parse_qs, unquote, urlparse

from gcp_storage_emulator import server as emu_server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects
from gcp_storage_emulator.storage import Storage

_API = "/storage/v1/b/"
_DOWNLOAD = "/download/storage/v1/b/"
_UPLOAD = "/upload/storage/v1/b/"


def _split_object(path: str, prefix: str):
  """``prefix + bucket/o/object`` -> (bucket, object) or None."""
  if not path.startswith(prefix):
    return None
  bucket, sep, rest = path[len(prefix):].partition("/o")
  if not sep:
    return None
  return bucket, unquote(rest[1:]) if rest.startswith("/") else None


class _Handler(emu_server.RequestHandler):
  """The emulator's handler with GCS's generation, offset and move semantics."""

  protocol_version = "HTTP/1.0"
  # (method, path with query) of every request, in order (``Emulator.requests``).
  requests: list[tuple[str, str]]

  def parse_request(self):
    ok = super().parse_request()
    if ok:
      self.requests.append((self.command, self.path))
    return ok

  def _generation(self, bucket, name):
    try:
      return int(self.storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
      return 0

  def _reply(self, status, body=b"", headers=()):
    self.send_response(status.value, status.phrase)
    for k, v in headers:
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def _preconditions(self, method):
    """Answers 412 / 304 where GCS would; returns True when it answered."""
    url = urlparse(self.path)
    query = parse_qs(url.query)
    match = query.get("ifGenerationMatch", [None])[0]
    not_match = query.get("ifGenerationNotMatch", [None])[0]
    if match is None and not_match is None:
      return False
    target = _split_object(url.path, _API) or _split_object(url.path, _DOWNLOAD)
    if target is None or target[1] is None:
      target = _split_object(url.path, _UPLOAD)
      if target is None:
        return False
      name = query.get("name", [None])[0] or self._multipart_name()
      if name is None:
        return False
      target = (target[0], name)
    current = self._generation(*target)
    if match is not None and int(match) != current:
      self._reply(HTTPStatus.PRECONDITION_FAILED, b'{"error": {"code": 412}}')
      return True
    if not_match is not None and int(not_match) == current:
      if method == "GET":
        self._reply(HTTPStatus.NOT_MODIFIED)
      else:
        self._reply(HTTPStatus.PRECONDITION_FAILED, b'{"error": {"code": 412}}')
      return True
    return False

  def _multipart_name(self):
    """The object name in a multipart upload's metadata part (where
    google-cloud-storage puts it), the body left for the emulator to read."""
    length = int(self.headers.get("Content-Length") or 0)
    if "multipart" not in self.headers.get("Content-Type", "") or not length:
      return None
    body = self.rfile.read(length)
    self.rfile = io.BytesIO(body)
    start = body.find(b"{")
    if start < 0:
      return None
    try:
      metadata, _ = json.JSONDecoder().raw_decode(body[start:].decode("utf-8", "replace"))
    except ValueError:
      return None
    return metadata.get("name")

  def _list_with_offsets(self):
    url = urlparse(self.path)
    query = parse_qs(url.query)
    if "startOffset" not in query and "endOffset" not in query:
      return False
    if not (url.path.startswith(_API) and url.path.endswith("/o")):
      return False
    bucket = url.path[len(_API):-len("/o")]
    start = query.get("startOffset", [""])[0]
    end = query.get("endOffset", [None])[0]
    try:
      files, prefixes = self.storage.get_file_list(
          bucket, query.get("prefix", [None])[0], query.get("delimiter", [None])[0],
          query.get("matchGlob", [None])[0])
    except NotFound:
      self._reply(HTTPStatus.NOT_FOUND)
      return True
    files = [f for f in files if f["name"] >= start and (end is None or f["name"] < end)]
    body = json.dumps({"kind": "storage#objects", "prefixes": prefixes,
                       "items": files}).encode()
    self._reply(HTTPStatus.OK, body, [("Content-type", "application/json")])
    return True

  def _move(self):
    url = urlparse(self.path)
    if "/moveTo/o/" not in url.path or not url.path.startswith(_API):
      return False
    head, dst = url.path.split("/moveTo/o/", 1)
    bucket, src = _split_object(head, _API)
    try:
      obj = objects._copy(f"http://{self.headers.get('Host')}", self.storage,
                          bucket, src, bucket, unquote(dst))
      self.storage.delete_file(bucket, src)
    except NotFound:
      self._reply(HTTPStatus.NOT_FOUND)
      return True
    self._reply(HTTPStatus.OK, json.dumps(obj).encode(),
                [("Content-type", "application/json")])
    return True

  def _generation_headers(self):
    """Generation headers for a media download, sent with the emulator's reply."""
    url = urlparse(self.path)
    query = parse_qs(url.query)
    target = _split_object(url.path, _DOWNLOAD)
    if target is None and query.get("alt", [None])[0] == "media":
      target = _split_object(url.path, _API)
    if target is None or target[1] is None:
      return []
    try:
      obj = self.storage.get_file_obj(*target)
    except NotFound:
      return []
    return [("x-goog-generation", str(obj["generation"])),
            ("x-goog-metageneration", str(obj.get("metageneration", "1"))),
            ("x-goog-stored-content-length", str(obj.get("size", "")))]

  def end_headers(self):
    for key, value in getattr(self, "_extra_headers", ()):
      self.send_header(key, value)
    self._extra_headers = ()
    super().end_headers()

  def do_GET(self):
    if self._preconditions("GET") or self._list_with_offsets():
      return
    self._extra_headers = self._generation_headers()
    super().do_GET()

  def do_POST(self):
    if self._preconditions("POST") or self._move():
      return
    super().do_POST()

  def do_PUT(self):
    if self._preconditions("PUT"):
      return
    super().do_PUT()

  def do_DELETE(self):
    if self._preconditions("DELETE"):
      return
    super().do_DELETE()

  def log_message(self, *args):
    pass


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Emulator:
  """An in-memory GCS on 127.0.0.1 with one bucket; ``stop()`` tears it down."""

  def __init__(self, bucket: str = "bertjax-test"):
    self.bucket = bucket
    self.port = _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._storage = Storage(use_memory_fs=True)
    buckets.create_bucket(bucket, self._storage)
    self.requests: list[tuple[str, str]] = []
    handler = type("_Logged", (_Handler,), {"requests": self.requests})
    self._httpd = http_server.ThreadingHTTPServer(
        ("127.0.0.1", self.port), partial(handler, self._storage))
    self._lock = threading.Lock()
    handle = self._httpd.finish_request

    def serialised(request, address):  # the emulator's storage is not thread-safe
      with self._lock:
        handle(request, address)

    self._httpd.finish_request = serialised
    report = self._httpd.handle_error

    def quiet_disconnects(request, address):  # a client gone mid-reply is not news
      if not isinstance(sys.exc_info()[1], ConnectionError):
        report(request, address)

    self._httpd.handle_error = quiet_disconnects
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
    self._thread.start()

  def environment(self) -> dict[str, str]:
    """The documented settings that point gcsfs, google-cloud-storage and
    tensorstore at this endpoint, with no credentials."""
    return {
        "STORAGE_EMULATOR_HOST": self.url,
        "TENSORSTORE_GCS_HTTP_URL": self.url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "FSSPEC_GS_TOKEN": "anon",
        "NO_GCE_CHECK": "true",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "EPATH_USE_TF": "false",
        "GOOGLE_CLOUD_PROJECT": "bertjax-test",
    }

  def object_names(self) -> list[str]:
    files, _ = self._storage.get_file_list(self.bucket, None, None, None)
    return sorted(f["name"] for f in files)

  def downloads(self) -> list[str]:
    """The object names whose content was read (media GETs), in order."""
    names = []
    for method, url in self.requests:
      parsed = urlparse(url)
      target = _split_object(parsed.path, _DOWNLOAD) or (
          _split_object(parsed.path, _API)
          if parse_qs(parsed.query).get("alt") == ["media"] else None)
      if method == "GET" and target and target[1]:
        names.append(target[1])
    return names

  def stop(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()

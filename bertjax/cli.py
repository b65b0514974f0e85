"""Flag parsing shared by the binaries, turning config mistakes into one line.

ml_collections reports a misspelt ``--config.FIELD`` as a traceback; a user
should see one sentence naming the field and the closest valid one instead.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading

from absl import app
from absl import flags
from absl import logging as absl_logging

from bertjax import config_files

_SUGGESTION = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"')


def _messages(error: BaseException):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield str(error)
    error = error.__cause__ or error.__context__


_ORDER = re.compile(r"Found (--config\.[\w.]+)\S* in argv before a value for --config")
_VALUE = re.compile(r"flag (--config\.[\w.]+)=(.*?): (.*)$")


def _bad_value(flag: str, value: str, why: str) -> str:
  """A value ml_collections could not read as its field's type."""
  if "Non-boolean argument" in why:
    kind = "true or false"
  elif "int()" in why:
    kind = "a whole number"
  elif "float" in why:
    kind = "a number"
  else:
    return f"{flag}={value} is not a value of that field ({why}); fix the value."
  return f"{flag}={value} is not {kind}; give it {kind}, e.g. {flag}=" + {
      "true or false": "true", "a whole number": "64", "a number": "0.1"}[kind] + "."


def explain(error: BaseException) -> str:
  """One sentence for a flag-parsing failure."""
  texts = [t.strip() for t in _messages(error) if t.strip()]
  for text in texts:
    order = _ORDER.search(text)
    if order:
      return (f"{order.group(1)} comes before --config=...; put --config=FILE[:SIZE] "
              "first and the --config.FIELD=... overrides after it.")
    value = _VALUE.search(text)
    if value:
      return _bad_value(*value.groups())
  for text in texts:
    match = _SUGGESTION.search(text.replace("\\", ""))
    if match:
      good, bad = match.groups()
      return (f"Unknown config field {bad!r}; did you mean --config.{good}? "
              "Run with --helpfull to list the flags.")
  # The most specific message is the first one-line message that says more
  # than a bare key.
  for text in texts:
    if "\n" not in text and not re.fullmatch(r"['\"]?[\w.]+['\"]?", text):
      return text
  if texts:
    return texts[0].splitlines()[-1].strip()
  return f"Could not parse the flags ({type(error).__name__})."


def unknown_field(config, path: str,
                  suggestion=lambda field: f"--config.{field}",
                  setting=lambda field: f"--config.{field}=...",
                  hint: str = " Run with --helpfull to list the flags.") -> str | None:
  """One sentence for ``--config.<path>`` naming no field of ``config``, or None.

  Names the closest field when there is one, else lists the fields of the
  section where the path leaves the config. ``suggestion`` and ``setting``
  spell a field as the binary's command line takes it (``bertjax.study``:
  ``--set=FIELD=...``); ``hint`` follows a suggestion.
  """
  node, section, parts = config, "config", path.split(".")
  for i, part in enumerate(parts):
    if not hasattr(node, "keys"):
      return (f"Unknown config field {path!r}: {section} is a value, not a "
              f"section; set {setting('.'.join(parts[:i]))} instead.")
    fields = sorted(str(k) for k in node.keys())
    if part not in fields:
      close = difflib.get_close_matches(part, fields, n=1)
      if close:
        good = ".".join(parts[:i] + close)
        return (f"Unknown config field {path!r}; did you mean "
                f"{suggestion(good)}?{hint}")
      return (f"Unknown config field {path!r}; the fields of {section} are: "
              f"{', '.join(fields)}.")
    node, section = node[part], f"{section}.{part}"
  return None


def _config_of(argv: list[str]):
  """The config ``--config=FILE[:ARG]`` names, loaded as ml_collections does;
  None if there is none or it fails to load (another message says why)."""
  config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
  if config is not None:
    return config
  for arg in argv[1:]:
    if arg.startswith("--config="):
      path, sep, config_arg = arg[len("--config="):].partition(":")
      try:
        path = config_files.resolve_path(path)  # shipped forms: bert:tiny
        spec = importlib.util.spec_from_file_location("_bertjax_cli_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(config_arg) if sep else module.get_config()
      except Exception:  # noqa: BLE001
        return None
  return None


def _unknown_override(argv: list[str]) -> str | None:
  """The message for the first ``--config.X=`` of ``argv`` naming no field."""
  config = _config_of(argv)
  if config is None:
    return None
  for arg in argv[1:]:
    match = re.match(r"--config\.([\w.]+)(=|$)", arg)
    if match:
      message = unknown_field(config, match.group(1))
      if message:
        return message
  return None


INTERRUPTED = ("error: interrupted (Ctrl-C); run the same command again to go on "
               "from what was saved.")


# Whether a Ctrl-C is on its way up as KeyboardInterrupt.
_interrupted = False


def _one_line_interrupt(kind, value, traceback) -> None:
  """``sys.excepthook``: Ctrl-C that reaches the top gives one line, not the
  traceback of wherever the main thread was; the exit status stays SIGINT's."""
  if issubclass(kind, KeyboardInterrupt):
    print(INTERRUPTED, file=sys.stderr, flush=True)
    return
  sys.__excepthook__(kind, value, traceback)


def _on_interrupt(signum, frame) -> None:
  """SIGINT: KeyboardInterrupt; a second Ctrl-C while the first is still on
  its way (its clean-up hangs) ends the process at once, as kill -9 would,
  which every binary survives."""
  global _interrupted
  del signum, frame
  if _interrupted:
    print(INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT)
  _interrupted = True
  raise KeyboardInterrupt


def _redeliver_swallowed_interrupt(unraisable) -> None:
  """``sys.unraisablehook``: Python ignores a KeyboardInterrupt raised inside
  a finalizer or a gc callback (JAX runs one at every collection, so Ctrl-C
  often lands there during data preparation) and prints its traceback; the
  signal is sent again instead, to stop the program as the user asked:
  from a timer thread, so that it arrives once the callback has returned."""
  global _interrupted
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    _interrupted = False
    threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
    return
  sys.__unraisablehook__(unraisable)


def _handle_interrupts() -> None:
  """Ctrl-C ends a binary with one line (main thread; a process started with
  SIGINT ignored keeps ignoring it)."""
  sys.excepthook = _one_line_interrupt
  sys.unraisablehook = _redeliver_swallowed_interrupt
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_interrupt)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags_parser: parses ``argv``, or exits(2) with one clear sentence.

  Every binary parses its flags here first, so this is also where Ctrl-C is
  given its one line (``_handle_interrupts``).
  """
  _handle_interrupts()
  try:
    rest = flags.FLAGS(argv)
    for name in ("config",):  # config files load lazily; fail here, not later
      if name in flags.FLAGS and flags.FLAGS[name].present:
        getattr(flags.FLAGS, name).keys()
    return rest
  except Exception as e:  # noqa: BLE001 — every parse failure gets one sentence.
    print(f"error: {_unknown_override(argv) or explain(e)}", file=sys.stderr)
    sys.exit(2)


class _BertjaxInfoOnly(logging.Filter):
  """Keeps bertjax's INFO lines and every library's warnings and errors; gcsfs's
  retry errors lose their traceback (the error is raised after them, and a
  binary says it in one line: ``unreachable_store``)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name.startswith("gcsfs") and record.exc_info:
      record.exc_info, record.exc_text = None, None
    return (record.levelno >= logging.WARNING
            or f"{os.sep}bertjax{os.sep}" in record.pathname)


def quiet_libraries() -> None:
  """Hides the INFO chatter of orbax/TFDS/grain and TFDS progress bars.

  ``--verbosity=1`` (or ``-v 1``) shows everything again.
  """
  if flags.FLAGS["verbosity"].present:
    return
  absl_logging.get_absl_handler().addFilter(_BertjaxInfoOnly())
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()


def _store_errors() -> tuple[type[BaseException], ...]:
  """The exception types that mean the object store could not be reached or
  would not take this machine's credentials (their modules come with gcsfs)."""
  found = []
  try:
    import aiohttp  # pylint: disable=g-import-not-at-top
    found.append(aiohttp.ClientConnectionError)
  except ImportError:
    pass
  try:
    from google.auth import exceptions  # pylint: disable=g-import-not-at-top
    found += [exceptions.DefaultCredentialsError, exceptions.RefreshError,
              exceptions.TransportError]
  except ImportError:
    pass
  return tuple(found)


def unreachable_store(error: BaseException) -> str | None:
  """One sentence for an error, or one it was raised from, that says the
  object store (gs://) could not be reached or refused the credentials; None
  for any other error. gcsfs retries for about a minute before raising it,
  and its traceback says nothing of what to do."""
  kinds = _store_errors()
  seen = set()
  while kinds and error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, kinds):
      detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
      return (f"cannot reach the object store for a gs:// path ({detail}); check this "
              "machine's network and credentials (gcloud auth application-default "
              "login, or a service account on the VM), or use local paths.")
    error = error.__cause__ or error.__context__
  return None


def run(main) -> None:
  """``app.run`` with the friendly flag parser, turning a ValueError raised by
  bertjax (bad input, refused before any device work) into one line, and a
  training run stopped by SIGTERM or Ctrl-C (``guards.Preempted``, e.g. inside
  ``bertjax.study``) into its message and exit status, and an object store
  that cannot be reached (``unreachable_store``) into one line, status 1."""
  from bertjax import guards

  def wrapped(argv):
    quiet_libraries()
    try:
      return main(argv)
    except guards.Preempted as e:
      print(str(e), flush=True)
      return e.exit_status
    except ValueError as e:
      if flags.FLAGS["verbosity"].present or not str(e):
        raise
      # A sentence that names its fix ("problem; fix") needs no traceback.
      hint = "" if "--" in str(e) or "; " in str(e) else " (run with -v 1 for the traceback)"
      print(f"error: {e}{hint}", file=sys.stderr)
      return 2
    except Exception as e:  # noqa: BLE001 — only the object store's failures are caught.
      said = None if flags.FLAGS["verbosity"].present else unreachable_store(e)
      if said is None:
        raise
      print(f"error: {said}", file=sys.stderr)
      return 1

  app.run(wrapped, flags_parser=parse_flags)

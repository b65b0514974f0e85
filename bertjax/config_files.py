"""Config files are data loaded by path, never a package to import.

bertjax ships its configs (``configs/*.py`` of the checkout) inside the package
as ``bertjax/configs/*.py``, so the binaries find them installed and from any
directory. A config spec is ``PATH[:ARG]``, ``ARG`` going to ``get_config``:

  configs/bert.py:tiny     the file, if it exists relative to the current
  bert.py:tiny             directory (a copied and edited config always wins);
  bert:tiny                otherwise bertjax's shipped ``bert.py``.

Any other path (``my/dir/roberta.py:base``, absolute paths) is taken as is.
A config that builds on another loads its base with ``sibling``:

  bert = config_files.sibling(__file__, "bert")
  c = bert.get_config(size)
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import types

from absl import flags

# Flags defined through define_config_flag belong to the binary that calls it
# (so that its --help lists --config), not to this module.
flags.disclaim_key_flags()

_PACKAGE = pathlib.Path(__file__).resolve().parent


def configs_dir() -> pathlib.Path:
  """The directory of bertjax's shipped configs.

  ``bertjax/configs`` in an installed wheel; ``configs`` beside the package in
  a checkout (run from source or installed with ``pip install -e .``).
  """
  for candidate in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
    if (candidate / "bert.py").is_file():
      return candidate
  raise ValueError(
      f"bertjax's config files are missing from {_PACKAGE}; reinstall bertjax "
      "with `pip install .` from a checkout that has configs/.")


def shipped_names() -> list[str]:
  """Names of the shipped configs, e.g. ['albert', 'bert', ...]."""
  return sorted(p.stem for p in configs_dir().glob("*.py") if p.stem != "__init__")


def _shipped_path(path: str) -> pathlib.Path | None:
  """The shipped config that ``path`` names, or None if it names none."""
  norm = pathlib.PurePath(os.path.normpath(path))
  if str(norm.parent) not in (".", "configs"):
    return None
  name = norm.name[:-3] if norm.name.endswith(".py") else norm.name
  candidate = configs_dir() / f"{name}.py"
  return candidate if candidate.is_file() else None


def resolve_path(path: str) -> str:
  """``path`` if it is a file, else the shipped config it names.

  Raises:
    ValueError: if neither exists.
  """
  # A file only: a directory of that name (say the workdir ./bert of a run
  # of bert:tiny) must not hide the shipped config.
  if os.path.isfile(path):
    return path
  shipped = _shipped_path(path)
  if shipped is None:
    raise ValueError(
        f"No config file {path!r} here, nor a shipped one of that name; pass "
        f"a path to a config file or one of {', '.join(shipped_names())} "
        "(e.g. --config=configs/bert.py:tiny).")
  return str(shipped)


def resolve(spec: str) -> str:
  """``PATH[:ARG]`` with PATH resolved by ``resolve_path``; ARG kept."""
  path, sep, arg = str(spec).partition(":")
  return resolve_path(path) + sep + arg


def module(path: str) -> types.ModuleType:
  """Executes the config file ``path`` (resolved as above), returns its module."""
  resolved = pathlib.Path(resolve_path(path)).resolve()
  # A name per file: two configs of the same stem in different directories
  # (a user's bert.py, the shipped one) must not replace each other.
  name = f"_bertjax_config_{resolved.stem}_{abs(hash(str(resolved))):x}"
  spec = importlib.util.spec_from_file_location(name, resolved)
  loaded = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(loaded)
  return loaded


def load(spec: str):
  """The ConfigDict of ``PATH[:ARG]``, as ``--config=PATH[:ARG]`` gives it
  (without command-line overrides, unlocked)."""
  path, sep, arg = str(spec).partition(":")
  config_module = module(path)
  return config_module.get_config(arg) if sep else config_module.get_config()


def shipped(name: str) -> types.ModuleType:
  """bertjax's own config ``name`` (e.g. "bert"), whatever the current directory."""
  path = configs_dir() / f"{name}.py"
  if not path.is_file():
    raise ValueError(f"bertjax ships no config {name!r}; use one of "
                     f"{', '.join(shipped_names())}.")
  return module(str(path))


def sibling(config_file: str, name: str) -> types.ModuleType:
  """The config ``name`` (e.g. "bert") beside ``config_file``, else the
  shipped one: a copied config keeps working without copying its base."""
  beside = pathlib.Path(config_file).resolve().parent / f"{name}.py"
  return module(str(beside)) if beside.is_file() else shipped(name)


class _ResolvingParser(flags.ArgumentParser):
  """Resolves the spec, then hands it to ml_collections' config file parser."""

  def __init__(self, inner: flags.ArgumentParser):
    self._inner = inner

  def parse(self, argument):
    return self._inner.parse(resolve(argument))

  def flag_type(self) -> str:
    return self._inner.flag_type()


def define_config_flag(help_string: str, name: str = "config",
                       lock_config: bool = True) -> flags.FlagHolder:
  """``config_flags.DEFINE_config_file`` whose path resolves as above.

  Every binary defines its config flag here, so that all of them find the
  shipped configs the same way.
  """
  from ml_collections import config_flags
  holder = config_flags.DEFINE_config_file(name, None, help_string,
                                           lock_config=lock_config)
  # ml_collections builds its parser inside DEFINE_config_file; wrapping it
  # keeps overrides and locking exactly as they are.
  flag = flags.FLAGS[name]
  flag.parser = _ResolvingParser(flag.parser)
  return holder

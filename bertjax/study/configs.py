"""The study's configs: its objectives' (``--configs``) and its tasks'
(``--tasks``), with ``--set`` / ``--finetune_set`` applied and checked.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import ml_collections

from bertjax import cli
from bertjax import config_files


def parse_value(config, field: str, text: str, flag: str = "--set"):
  """``text`` as the type of ``config``'s ``field`` (dotted paths allowed);
  ``flag`` is the command-line flag that set it, for the messages.

  Raises:
    ValueError: the config has no such field, or the text is not of its type.
  """
  set_flag = lambda f: f"{flag}={f}=..."  # noqa: E731
  unknown = cli.unknown_field(config, field, suggestion=set_flag,
                              setting=set_flag, hint="")
  if unknown:
    raise ValueError(unknown)
  node = config
  for part in field.split(".")[:-1]:
    node = node[part]
  current = node[field.split(".")[-1]]
  try:
    if isinstance(current, (tuple, list)):
      # Comma-separated, each item of the type of the default's items.
      kind = type(current[0]) if current else str
      kind = float if kind is int and "." in text else kind
      return type(current)(kind(item.strip()) for item in text.split(","))
    if isinstance(current, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
    return text
  except ValueError:
    what = type(current).__name__
    if isinstance(current, (tuple, list)) and current:
      what = f"comma-separated {type(current[0]).__name__}s, e.g. " + ",".join(
          str(v) for v in current)
    raise ValueError(f"{field}={text!r} is not of type {what}; fix the "
                     "value given to --set/--finetune_set.") from None


def apply_overrides(config, overrides: Sequence[str], flag: str = "--set"):
  """Sets each ``FIELD=VALUE`` of ``overrides`` (given with ``flag``) on
  ``config`` (in place)."""
  for item in overrides:
    field, sep, text = item.partition("=")
    if not sep or not field:
      raise ValueError(f"Override {item!r} is not FIELD=VALUE; write e.g. "
                       f"{flag}=seq_len=64.")
    value = parse_value(config, field, text, flag)
    node = config
    for part in field.split(".")[:-1]:
      node = node[part]
    node[field.split(".")[-1]] = value
  return config


def load_configs(names: Sequence[str], size: str,
                 overrides: Sequence[str] = ()) -> dict[str, ml_collections.ConfigDict]:
  """``{label: config}`` of ``configs/<name>.py:<size>`` (shipped ones found
  wherever bertjax is installed; a path to a config file works too), each with
  ``overrides`` applied."""
  if not names:
    raise ValueError("--configs is empty; name at least one, e.g. --configs=bert,roberta.")
  loaded = {}
  for name in names:
    path = name if name.endswith(".py") else f"configs/{name}.py"
    label = os.path.basename(path)[:-3]
    if label in loaded:
      raise ValueError(f"--configs names {label!r} twice; name each objective once.")
    loaded[label] = config_files.load(f"{path}:{size}")
    if "task" in loaded[label] and "objective" not in loaded[label]:
      raise ValueError(f"--configs names {name!r}, a fine-tuning config; name pretraining "
                       "configs (e.g. --configs=bert,roberta) and the fine-tuning tasks "
                       "with --tasks.")
  _check_shared_fields(loaded, overrides)
  return {label: apply_overrides(config, overrides) for label, config in loaded.items()}


def _check_shared_fields(configs: Mapping[str, ml_collections.ConfigDict],
                         overrides: Sequence[str]) -> None:
  """Refuses a ``--set`` field that some objectives have and others lack,
  naming both (a field no objective has gets ``parse_value``'s suggestion)."""
  for item in overrides:
    field = item.partition("=")[0]
    has = [label for label, c in configs.items() if _has_field(c, field)]
    lacks = [label for label in configs if label not in has]
    if has and lacks:
      raise ValueError(
          f"--set={item} names a field of {', '.join(has)} that "
          f"{', '.join(lacks)} {'has' if len(lacks) == 1 else 'have'} not, and "
          "--set changes every objective of --configs; run those objectives in "
          "a study of their own, or give them a config file that sets it.")


def _has_field(config, field: str) -> bool:
  node = config
  for part in field.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def finetune_config(task: str, overrides: Sequence[str] = (),
                    epochs: float | None = None) -> ml_collections.ConfigDict:
  """``configs/finetune.py:<task>`` with ``overrides`` and ``epochs`` applied."""
  config = config_files.shipped("finetune").get_config(task)
  if epochs is not None:
    config.num_epochs = float(epochs)
  return apply_overrides(config, overrides, "--finetune_set")

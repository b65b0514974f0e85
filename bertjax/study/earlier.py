"""Objectives an earlier run left in a study's directory, kept in its summary.

A study run again in its directory with fewer ``--configs`` (first
``bert,roberta``, then ``bert``) still writes every objective finished there
into study.json, study.md and study.png, when it belongs to the same plan:
its config, rebuilt as this run builds its own (``configs/<name>.py`` with
this ``--size`` and ``--set``) and planned with this ``--flops``,
``--points`` and ``--spacing``, gives the plan its result.json recorded
(``core.plan_difference``: the check a rerun naming it would make), its
fine-tuning settings are this run's, and every budget point is recorded with
every ``--tasks`` task. The others are left out and named, with why, in one
line (``LEFT_OUT`` in the record, study.md, and a warning): run them again
with this run's flags to include them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from absl import logging

from bertjax import paths
from bertjax.study import core
from bertjax.study import report

EARLIER, LEFT_OUT = report.EARLIER, report.LEFT_OUT


def _why_not(name: str, recorded: Mapping[str, Any], rebuilt: core.Plan,
             finetuning: Mapping[str, Any], tasks: Sequence[str]) -> str | None:
  """Why an earlier objective's record is not of this run's plan, or None."""
  differs = core.plan_difference(recorded.get("plan") or {}, rebuilt.describe())
  if differs == "config_sha256":
    return "its pretraining config differs: another --size or --set"
  if differs:
    return f"its {differs} differs"
  if recorded.get("finetuning") != dict(finetuning):
    return "its fine-tuning settings differ"
  points = recorded.get("points") or []
  if sorted(pt.get("step") for pt in points) != sorted(rebuilt.steps):
    return "unfinished"
  missing = sorted({t for pt in points for t in tasks if t not in pt.get("finetune", {})})
  if missing:
    return f"not fine-tuned on {', '.join(missing)}"
  return None


def collect(root: str, names: Sequence[str], finetuning: Mapping[str, Any],
            tasks: Sequence[str], rebuild) -> tuple[list[core.Plan], dict[str, Any],
                                                    list[str]]:
  """(plans, results, left out as 'name (why)') of the objectives recorded
  under ``root`` that ``names`` (this run's) lacks; ``rebuild(name)`` gives
  an objective's plan as this run would make it (None: cannot be rebuilt)."""
  plans, results, left_out = [], {}, []
  for path in sorted(paths.path(root).glob("*/result.json")):
    name = path.parent.name
    if name in names:
      continue
    try:
      recorded = paths.read_json(path)
      rebuilt = rebuild(name) if rebuild else None
    except (ValueError, OSError, KeyError) as e:
      left_out.append(f"{name} ({str(e).split(';')[0].rstrip('.')})")
      continue
    why = ("this run was not given --size to rebuild its config" if rebuilt is None
           else _why_not(name, recorded, rebuilt, finetuning, tasks))
    if why:
      left_out.append(f"{name} ({why})")
      continue
    plans.append(rebuilt)
    results[name] = recorded
  return plans, results, left_out


def rebuilder(size: str | None, overrides: Sequence[str], budget: float, root: str,
              points: int, spacing: str):
  """``collect``'s ``rebuild``: an objective's plan from ``configs/<name>.py``
  as ``core.run`` makes this run's; None without ``size``."""
  if size is None:
    return None
  return lambda name: core.plan(core.load_configs([name], size, overrides), budget, root,
                                points=points, spacing=spacing)[0]


def record(root: str, plans: Sequence[core.Plan], results: Mapping[str, Any],
           budget: float, tasks: Sequence[str], finetuning: Mapping[str, Any],
           rebuild) -> dict[str, Any]:
  """``report.study_record`` of this run's objectives and the earlier ones
  ``collect`` keeps (after them, by name), naming those it leaves out."""
  more, earlier, left_out = collect(root, [p.name for p in plans], finetuning, tasks,
                                    rebuild)
  out = report.study_record(list(plans) + more, {**results, **earlier}, budget, tasks)
  if more:
    out[EARLIER] = [p.name for p in more]
  if left_out:
    out[LEFT_OUT] = (f"Left out (recorded here by earlier runs): {', '.join(left_out)}; "
                     "run them again with this run's flags to include them.")
    logging.warning("%s", out[LEFT_OUT])
  return out

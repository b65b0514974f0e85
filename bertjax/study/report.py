"""The study's outputs: ``study.json``, ``study.md`` and ``study.png``.

The plot has one panel for held-out MLM accuracy and one per fine-tuning task;
x is the pretraining FLOPs spent (log scale), one line per objective through
its budget points. It is drawn with matplotlib's Agg backend at a fixed size:
``PANEL_INCHES`` per panel at ``DPI`` (no tight bounding box), so its pixel
size is known: ``png_size(panels)``.
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from bertjax import paths

PANEL_INCHES = (4.0, 3.5)
DPI = 100
_MLM = "mlm_accuracy"
# Record keys, present only when a rerun found objectives of earlier runs in
# its directory (bertjax/study/earlier.py): those kept, and the line naming
# those left out.
EARLIER = "earlier_objectives"
LEFT_OUT = "left_out"


def check_plotting() -> None:
  """Refuses to start without matplotlib (it is not a core dependency)."""
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    raise ValueError("bertjax.study draws its plot with matplotlib, which is not "
                     "installed; install it with pip install matplotlib (in a checkout, the study extra).") from None


def png_size(panels: int) -> tuple[int, int]:
  """(width, height) in pixels of a plot of ``panels`` panels."""
  return int(PANEL_INCHES[0] * DPI * panels), int(PANEL_INCHES[1] * DPI)


def study_record(plans, results: Mapping[str, Mapping[str, Any]], budget: float,
                 tasks: Sequence[str]) -> dict[str, Any]:
  """The study as one JSON-able dict: budget, tasks and, per objective, its plan
  and its budget points (held-out metrics, fine-tuning scores)."""
  by_key: dict[str, list[str]] = {}
  for p in plans:
    by_key.setdefault(str(p.config.data_dir), []).append(p.name)
  objectives = {}
  for p in plans:
    shared = [n for n in by_key[str(p.config.data_dir)] if n != p.name]
    objectives[p.name] = {
        "config": p.name, "model": p.config.get("model"),
        "objective": p.config.get("objective"), "step_flops": p.step_flops,
        "batch_size": int(p.config.batch_size), "seq_len": int(p.config.seq_len),
        "steps": p.steps, "data_dir": str(p.config.data_dir), "shares_data_with": shared,
        "tokenizer": p.config.get("tokenizer"),
        "points": list(results[p.name]["points"])}
  return {"budget": budget, "budgets": plans[0].budgets if plans else [],
          "tasks": list(tasks), "steps_rule": "steps = floor(budget / FLOPs per step), "
          "at least 1 (over_budget where one step exceeds the point's budget)",
          "objectives": objectives}


def _mlm_label(name: str, entry: Mapping[str, Any]) -> str:
  # ELECTRA's MLM head is its small generator's, not the encoder that is kept.
  return f"{name} (generator)" if entry.get("model") == "electra" else name


def _fmt(x: float | None, digits: int = 3) -> str:
  return "—" if x is None else f"{x:.{digits}f}"


def markdown(record: Mapping[str, Any]) -> str:
  """Two tables: each objective at the full budget (one row each), then every
  budget point."""
  tasks = record["tasks"]
  head = ["objective", "FLOPs/step", "steps", "FLOPs spent", "data (shared with)",
          "held-out MLM acc (baseline)", "other held-out"]
  head += [f"{t} {_task_metric(record, t)}" for t in tasks]
  lines = [f"Budget {record['budget']:.3g} useful FLOPs per objective; "
           f"{record['steps_rule']}.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, e in record["objectives"].items():
    if not e["points"]:
      continue
    last = e["points"][-1]
    h = last["heldout"]
    others = ", ".join(f"{k.removesuffix('_accuracy')} {v:.3f}" for k, v in sorted(h.items())
                       if k.endswith("_accuracy") and k not in (_MLM, "baseline_mlm_accuracy"))
    mlm = (f"{_fmt(h.get(_MLM))} ({_fmt(h.get('baseline_mlm_accuracy'))})"
           + (" generator" if e.get("model") == "electra" else ""))
    data = f"{e['tokenizer']}" + (f" ({', '.join(e['shares_data_with'])})"
                                  if e["shares_data_with"] else " (own)")
    row = [name, f"{e['step_flops']:.3g}",
           f"{last['step']}" + (" (over budget)" if last["over_budget"] else ""),
           f"{last['flops']:.3g}", data, mlm, others or "—"]
    row += [_fmt(last["finetune"].get(t, {}).get("score")) for t in tasks]
    lines.append("| " + " | ".join(row) + " |")
  unavailable = sorted({f"{name}: {ft['unavailable']}" for name, e in record["objectives"].items()
                        for pt in e["points"] for ft in pt["finetune"].values()
                        if "unavailable" in ft})
  if unavailable:
    lines += ["", "Not fine-tuned (—): " + " ".join(unavailable)]
  if record.get(EARLIER):
    lines += ["", "From earlier runs in this directory, with the same plan: "
              f"{', '.join(record[EARLIER])}."]
  if record.get(LEFT_OUT):
    lines += ["", record[LEFT_OUT]]
  lines += ["", "Along the way:", ""]
  head = ["objective", "budget", "step", "FLOPs spent", "held-out MLM acc"] + list(tasks)
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, e in record["objectives"].items():
    for pt in e["points"]:
      row = [name, f"{pt['budget']:.3g}", str(pt["step"]), f"{pt['flops']:.3g}",
             _fmt(pt["heldout"].get(_MLM))]
      row += [_fmt(pt["finetune"].get(t, {}).get("score")) for t in tasks]
      lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def _task_metric(record: Mapping[str, Any], task: str) -> str:
  for e in record["objectives"].values():
    for pt in e["points"]:
      if "main_metric" in pt["finetune"].get(task, {}):
        return pt["finetune"][task]["main_metric"]
  return ""


def plot_png(record: Mapping[str, Any]) -> bytes:
  """The plot as PNG bytes: held-out MLM accuracy and each task's score
  against pretraining FLOPs, one line per objective."""
  import matplotlib
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  del matplotlib
  tasks = record["tasks"]
  panels = [_MLM] + list(tasks)
  fig = Figure(figsize=(PANEL_INCHES[0] * len(panels), PANEL_INCHES[1]), dpi=DPI)
  FigureCanvasAgg(fig)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  # One colour per objective in every panel, whichever panels it has lines in.
  colours = {name: f"C{i % 10}" for i, name in enumerate(record["objectives"])}
  for ax, panel in zip(axes, panels):
    for name, e in record["objectives"].items():
      pts = e["points"]
      if panel == _MLM:
        xy = [(pt["flops"], pt["heldout"][_MLM]) for pt in pts if _MLM in pt["heldout"]]
        label, style = _mlm_label(name, e), ("--" if e.get("model") == "electra" else "-")
      else:
        xy = [(pt["flops"], pt["finetune"][panel]["score"]) for pt in pts
              if "score" in pt["finetune"].get(panel, {})]
        label, style = name, "-"
      if xy:
        ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", label=label,
                color=colours[name])
    ax.set_xscale("log")
    ax.set_xlabel("pretraining FLOPs")
    ax.set_title("held-out MLM accuracy" if panel == _MLM
                 else f"{panel}: {_task_metric(record, panel)}")
    ax.grid(True, alpha=0.3)
  axes[0].legend(fontsize="small")
  fig.subplots_adjust(left=0.06, right=0.98, bottom=0.15, top=0.9, wspace=0.3)
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI)
  return buffer.getvalue()


def write(workdir: str, record: Mapping[str, Any]) -> None:
  """Writes study.json, study.md and study.png into ``workdir``."""
  paths.write_json(paths.join(workdir, "study.json"), record, indent=1)
  paths.write_text(paths.join(workdir, "study.md"), markdown(record))
  paths.write_bytes(paths.join(workdir, "study.png"), plot_png(record))

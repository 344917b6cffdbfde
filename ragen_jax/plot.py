r"""Learning curves of training runs from their TensorBoard events, and a results table.

  python -m ragen_jax.plot runs/sokoban_ppo runs/bandit_grpo --out=curves.png
  python -m ragen_jax.plot runs/a runs/b --smooth=5 --metrics=+critic/vf_loss,val/*/success

One figure, one colour per run (named by its workdir's basename, or its last two path parts when
basenames collide): (1) validation success (markers; step 0 is the starting policy) with training
success (thin line), (2) in-group reward std, (3) actor entropy, (4) RAGEN-2's mutual-information
estimate (first turn solid, multi-turn dotted, the log N ceiling dashed), and, when some run
logged them, MI retrieval accuracy and the MI z-score. A panel notes the runs that logged none of
its tags. `--metrics` takes comma-separated panel names (success, reward_std, entropy, mi,
retrieval, mi_zscore) or scalar tags (`*` globs give one panel per matching tag): they replace the
default panels, or are added to them with a leading `+`. `--smooth=K` draws per-step series as
trailing means of K points (validation and MI series, logged every few steps, are left as they are).

Prints each run's row of a before/after results table (experiments/results/*.md). Needs
matplotlib; the figure is drawn on an Agg canvas, so no display is used and pyplot's global state
is left alone.
"""

import argparse
import dataclasses
import fnmatch
import os
import sys
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ragen_jax import logging_utils

Series = List[Tuple[int, float]]


class PlotError(Exception):
  """A user-facing problem with the inputs (no events, no plottable tags): exit code 2."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: its display name, workdir and every scalar series it logged."""

  name: str
  workdir: str
  scalars: Mapping[str, Series]

  def series(self, tag: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(steps, values) of `tag`, or None when the run never logged it."""
    points = self.scalars.get(tag)
    if not points:
      return None
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values, dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class Curve:
  """One tag drawn in a panel; `label` names its style in the panel's legend."""

  tag: str
  label: str = ""
  style: str = "line"
  smooth: bool = True  # False for series logged every few steps (validation, MI).


@dataclasses.dataclass(frozen=True)
class Panel:
  title: str
  curves: Tuple[Curve, ...]
  ylabel: str = ""
  ylim: Optional[Tuple[float, float]] = None
  optional: bool = False  # Among the defaults only when some run logged one of its tags.


_STYLES = {
    "markers": dict(marker="o", markersize=4, linewidth=1.4),
    "thin": dict(linewidth=0.8, alpha=0.6),
    "line": dict(linewidth=1.4),
    "dotted": dict(linewidth=1.6, linestyle=":"),
    "dashed": dict(linewidth=1.0, linestyle="--", alpha=0.7),
}
_FIRST, _MULTI = "collapse/first_turn/", "collapse/multi_turn/"
PANELS = {
    "success": Panel(
        "success (step 0: starting policy)",
        (
            Curve("val/success", "validation", "markers", smooth=False),
            Curve("train/success", "training", "thin"),
        ),
        ylim=(-0.03, 1.03),
    ),
    "reward_std": Panel("in-group reward std", (Curve("rollout/in_group_reward_std"),)),
    "entropy": Panel("actor entropy", (Curve("actor/entropy"),), ylabel="nats per token"),
    "mi": Panel(
        "mutual information I(X;Z) estimate",
        (
            Curve(_FIRST + "mi_estimate", "first turn", "line", smooth=False),
            Curve(_MULTI + "mi_estimate", "multi-turn", "dotted", smooth=False),
            Curve(_FIRST + "mi_upper_bound", "log N ceiling", "dashed", smooth=False),
        ),
        ylabel="nats per token",
    ),
    "retrieval": Panel(
        "MI retrieval accuracy, top 1 (first turn)",
        (
            Curve(_FIRST + "retrieval_acc_top1", "accuracy", "line", smooth=False),
            Curve(_FIRST + "retrieval_chance_top1", "chance", "dashed", smooth=False),
        ),
        ylim=(-0.03, 1.03),
        optional=True,
    ),
    "mi_zscore": Panel(
        "MI z-score, EMA (first turn)",
        (Curve(_FIRST + "mi_zscore_ema", smooth=False),),
        optional=True,
    ),
}
DEFAULT_PANELS = ("success", "reward_std", "entropy", "mi", "retrieval", "mi_zscore")
# Tags logged every eval_every / compute_freq steps: a moving average would mix distant steps.
_SPARSE_PREFIXES = ("val/", _FIRST, _MULTI)


def run_names(workdirs: Sequence[str]) -> List[str]:
  """Basenames of `workdirs`; the last two path parts for those whose basenames collide."""
  parts = [os.path.abspath(os.fspath(w)).split(os.sep) for w in workdirs]
  names = [p[-1] for p in parts]
  names = ["/".join(p[-2:]) if names.count(n) > 1 else n for p, n in zip(parts, names)]
  # The same directory given twice still collides: number the repeats.
  return [
      n if names[:i].count(n) == 0 else f"{n} ({names[:i].count(n) + 1})"
      for i, n in enumerate(names)
  ]


def load_runs(workdirs: Sequence[str]) -> List[Run]:
  """Reads every workdir's scalars; a PlotError names a workdir without scalar events."""
  runs = []
  for name, workdir in zip(run_names(workdirs), workdirs):
    try:
      scalars = logging_utils.read_scalars(workdir)
    except FileNotFoundError as e:
      raise PlotError(f"{workdir}: no such directory") from e
    if not scalars:
      raise PlotError(
          f"{workdir}: no TensorBoard scalar events (no events.out.tfevents.* files "
          "with scalars in it or its subdirectories)"
      )
    runs.append(Run(name=name, workdir=os.fspath(workdir), scalars=scalars))
  return runs


def _tag_panel(tag: str) -> Panel:
  sparse = tag.startswith(_SPARSE_PREFIXES)
  return Panel(tag, (Curve(tag, style="markers" if sparse else "line", smooth=not sparse),))


def select_panels(metrics: Optional[str], tags: Iterable[str]) -> List[Panel]:
  """The panels for a `--metrics` value, given every tag the runs logged (for globs and optionals).

  None or "" gives the defaults; "a,b" replaces them; "+a,b" adds to them. An entry is a panel
  name of PANELS, a scalar tag, or a glob over tags (one panel per match, in sorted order).
  """
  tags = set(tags)
  metrics = (metrics or "").strip()
  defaults = [
      PANELS[name]
      for name in DEFAULT_PANELS
      if not PANELS[name].optional or any(c.tag in tags for c in PANELS[name].curves)
  ]
  if not metrics:
    return defaults
  panels = defaults if metrics.startswith("+") else []
  for entry in (e.strip() for e in metrics.lstrip("+").split(",")):
    if not entry:
      continue
    if entry in PANELS:
      panels.append(PANELS[entry])
    elif any(c in entry for c in "*?["):
      # A glob nothing matched still gets a panel, whose note says no run logged it.
      matches = sorted(t for t in tags if fnmatch.fnmatchcase(t, entry)) or [entry]
      panels.extend(_tag_panel(tag) for tag in matches)
    else:
      panels.append(_tag_panel(entry))
  return panels


def check_runs(runs: Sequence[Run], panels: Sequence[Panel]) -> None:
  """A PlotError naming the first run that logged none of the panels' tags."""
  wanted = [c.tag for p in panels for c in p.curves]
  for run in runs:
    if not any(tag in run.scalars for tag in wanted):
      shown = ", ".join(sorted(run.scalars)[:8]) + (", ..." if len(run.scalars) > 8 else "")
      raise PlotError(
          f"{run.workdir}: none of the requested tags ({', '.join(wanted)}) was "
          f"logged; its tags: {shown}"
      )


def smooth(values: Sequence[float], k: int) -> np.ndarray:
  """Trailing moving average over the last `k` points (fewer at the start); NaN/inf are skipped.

  smooth([1, 2, 3, 4, 5], 3) == [1, 1.5, 2, 3, 4]. A window with no finite value gives NaN;
  k <= 1 returns the values unchanged.
  """
  y = np.asarray(values, dtype=np.float64)
  if k <= 1 or y.size == 0:
    return y.copy()
  finite = np.isfinite(y)
  sums = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
  counts = np.concatenate([[0], np.cumsum(finite)])
  end = np.arange(1, y.size + 1)
  start = np.maximum(end - k, 0)
  total, count = sums[end] - sums[start], counts[end] - counts[start]
  return np.divide(total, count, out=np.full(y.size, np.nan), where=count > 0)


def _matplotlib():
  """(Figure, Line2D, FigureCanvasAgg, ticker), or an ImportError saying how to get matplotlib."""
  # pylint: disable=g-import-not-at-top
  try:
    from matplotlib import ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
  except ImportError as e:
    raise ImportError(
        "ragen_jax.plot needs matplotlib (a ragen_jax requirement): pip install matplotlib"
    ) from e
  return Figure, Line2D, FigureCanvasAgg, ticker


def _grid(num_panels: int) -> Tuple[int, int]:
  """(rows, columns): 2x2 for four panels, rows of three for five or more."""
  cols = 1 if num_panels == 1 else 2 if num_panels in (2, 4) else 3
  return -(-num_panels // cols), cols


def figure(
    runs: Sequence[Run], panels: Sequence[Panel], smooth_k: int = 1, title: Optional[str] = None
):
  """One matplotlib Figure (Agg canvas): a panel per entry of `panels`, one colour per run.

  Every drawn line has the run's name as label and the curve's tag as gid (handy in tests);
  legends are built from stand-in handles, so `ax.lines` holds data lines only.
  """
  fig_cls, line_cls, canvas_cls, ticker = _matplotlib()
  rows, cols = _grid(len(panels))
  fig = fig_cls(figsize=(5.4 * cols, 3.7 * rows + 0.5), layout="constrained")
  canvas_cls(fig)
  colours = [f"C{i % 10}" for i in range(len(runs))]
  if len(runs) > 10:  # The default cycle repeats after ten; spread the runs over a colormap.
    import matplotlib  # pylint: disable=g-import-not-at-top

    colours = [matplotlib.colormaps["turbo"](i / (len(runs) - 1)) for i in range(len(runs))]
  first_steps = [points[0][0] for run in runs for points in run.scalars.values() if points]
  last_steps = [points[-1][0] for run in runs for points in run.scalars.values() if points]
  for index, panel in enumerate(panels):
    ax = fig.add_subplot(rows, cols, index + 1)
    drawn = set()
    missing = []
    for run, colour in zip(runs, colours):
      found = False
      for curve in panel.curves:
        series = run.series(curve.tag)
        if series is None:
          continue
        found = True
        drawn.add(curve)
        steps, values = series
        if curve.smooth:
          values = smooth(values, smooth_k)
        ax.plot(steps, values, color=colour, label=run.name, gid=curve.tag, **_STYLES[curve.style])
      if not found:
        missing.append(run.name)
    smoothed = smooth_k > 1 and any(c.smooth for c in drawn)
    ax.set_title(panel.title + (f" (mean of {smooth_k} steps)" if smoothed else ""), fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if panel.ylabel:
      ax.set_ylabel(panel.ylabel)
    if panel.ylim:
      ax.set_ylim(*panel.ylim)
    ax.grid(alpha=0.3)
    styled = [c for c in panel.curves if c in drawn and c.label]
    if len(styled) > 1:  # Explain the line styles in grey; colours are explained once, on top.
      handles = [line_cls([], [], color="0.35", **_STYLES[c.style]) for c in styled]
      ax.legend(handles, [c.label for c in styled], fontsize=8, loc="best")
    if missing:
      who = "any run" if len(missing) == len(runs) else ", ".join(missing)
      if not drawn:  # Same step range as its neighbours rather than matplotlib's 0..1.
        ax.set_xlim(min(first_steps), max(last_steps))
      # Centred on an empty panel; in a corner, on a white box, over drawn lines.
      x, y, ha, va = (0.5, 0.5, "center", "center") if not drawn else (0.02, 0.97, "left", "top")
      ax.text(
          x,
          y,
          f"not logged by {who}",
          transform=ax.transAxes,
          ha=ha,
          va=va,
          fontsize=8,
          color="0.35",
          wrap=True,
          bbox=dict(facecolor="white", edgecolor="none", alpha=0.8),
      )
  # The title heads the runs' legend: a suptitle would overlap a legend placed outside on top.
  handles = [line_cls([], [], color=c, linewidth=2.5) for c in colours]
  fig.legend(
      handles,
      [r.name for r in runs],
      loc="outside upper center",
      ncols=min(len(runs), 4),
      fontsize=9,
      frameon=False,
      title=title or None,
      title_fontsize=12,
  )
  return fig


TABLE_HEADER = (
    "| run | val success at step 0 | last validations | gain (points) | steps | "
    "s/step | note |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |"
)


def table_row(run: Run) -> str:
  """The run's row of a before/after results table (note column left empty).

  Start: the first validation; last validations: up to three after it; gain: the mean of the
  last three validations (the start included when there are fewer) minus the start, in points;
  steps: the last logged training step (the warm start's `sft/` series count their own steps);
  s/step: the mean of `timing_s/step`.
  """
  val = run.scalars.get("val/success", [])
  steps = max(
      (
          points[-1][0]
          for tag, points in run.scalars.items()
          if points and not tag.startswith("sft/")
      ),
      default=0,
  )
  timing = [v for _, v in run.scalars.get("timing_s/step", [])]
  per_step = f"{np.mean(timing):.0f}" if timing else "n/a"
  if not val:
    return f"| {run.name} | n/a | n/a | n/a | {steps} | {per_step} |  |"
  start = f"{100 * val[0][1]:.1f}%" + (f" (step {val[0][0]})" if val[0][0] != 0 else "")
  last = ", ".join(f"{100 * v:.1f}%" for _, v in val[1:][-3:]) or "none"
  gain = 100 * (np.mean([v for _, v in val[-3:]]) - val[0][1])
  return f"| {run.name} | {start} | {last} | {gain:+.1f} | {steps} | {per_step} |  |"


def table(runs: Sequence[Run]) -> str:
  return "\n".join([TABLE_HEADER] + [table_row(run) for run in runs])


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command line; returns the exit code (2 for unusable inputs, 1 without matplotlib)."""
  parser = argparse.ArgumentParser(
      prog="python -m ragen_jax.plot", description=__doc__.splitlines()[0]
  )
  parser.add_argument(
      "workdirs",
      nargs="+",
      metavar="WORKDIR",
      help="training run directories (their TensorBoard events)",
  )
  parser.add_argument("--out", default="curves.png", help="image to write (default curves.png)")
  parser.add_argument(
      "--metrics",
      default=None,
      help="comma-separated panel names or scalar tags (globs allowed); they "
      f"replace the defaults ({','.join(DEFAULT_PANELS)}), or add to them "
      "with a leading '+'",
  )
  parser.add_argument(
      "--smooth",
      type=int,
      default=1,
      metavar="K",
      help="trailing moving average of K points for per-step series",
  )
  parser.add_argument("--title", default=None, help="figure title")
  args = parser.parse_args(argv)
  if args.smooth < 1:
    parser.error(f"--smooth must be at least 1, got {args.smooth}")
  try:
    runs = load_runs(args.workdirs)
    panels = select_panels(args.metrics, {tag for run in runs for tag in run.scalars})
    if not panels:
      raise PlotError(f"--metrics={args.metrics!r} names no panel")
    check_runs(runs, panels)
    fig = figure(runs, panels, smooth_k=args.smooth, title=args.title)
  except PlotError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ImportError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if os.path.dirname(args.out):
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(table(runs))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

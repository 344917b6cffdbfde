"""Learning curves: events read back per run, smoothing, the figure's lines, the CLI's exits."""

import dataclasses
import math
import sys

import numpy as np
import pytest

from ragen_jax import logging_utils
from ragen_jax import plot

# Values exact in float32, so what the figure draws can be compared with what was written.
_ALPHA_TRAIN = [0.25, 0.5, 0.0, 0.75, 1.0, 0.5]
_ALPHA_ENTROPY = [2.0, 1.5, 1.0, 0.5, 0.25, 0.125]
_ALPHA_VAL = {0: 0.25, 3: 0.5, 6: 0.75}
_ALPHA_MI = {1: (0.5, 0.25), 4: (1.25, 0.75)}  # step: (first turn, multi-turn)
_LOG_N = float(np.float32(math.log(8)))


def _write(logdir, steps, train, entropy, val, mi=None):
  with logging_utils.SummaryWriter(logdir) as writer:
    for step, value in val.items():
      writer.scalars(step, {"val/success": value})
    for i, step in enumerate(steps):
      writer.scalars(
          step,
          {
              "train/success": train[i],
              "actor/entropy": entropy[i],
              "rollout/in_group_reward_std": 0.5 * train[i],
              "timing_s/step": 10.0 + step,
          },
      )
    for step, (first, multi) in (mi or {}).items():
      writer.scalars(
          step,
          {
              "collapse/first_turn/mi_estimate": first,
              "collapse/multi_turn/mi_estimate": multi,
              "collapse/first_turn/mi_upper_bound": math.log(8),
              "collapse/first_turn/retrieval_acc_top1": 0.5,
              "collapse/first_turn/mi_zscore_ema": 2.0 * first,
          },
      )


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  """Two fake runs: alpha (6 steps, with MI) and beta (4 steps, no MI tags)."""
  root = tmp_path_factory.mktemp("runs")
  _write(root / "alpha", range(1, 7), _ALPHA_TRAIN, _ALPHA_ENTROPY, _ALPHA_VAL, _ALPHA_MI)
  _write(
      root / "beta",
      range(1, 5),
      [0.0, 0.25, 0.25, 0.5],
      [1.0, 1.0, 0.75, 0.75],
      {0: 0.5, 2: 0.25, 4: 0.5},
  )
  (root / "empty").mkdir()
  return root


@pytest.fixture(scope="module")
def runs(workdirs):
  return plot.load_runs([str(workdirs / "alpha"), str(workdirs / "beta")])


def _axes_by_title(fig):
  return {ax.get_title(): ax for ax in fig.axes}


def _line(ax, run, tag):
  (line,) = [l for l in ax.lines if l.get_label() == run and l.get_gid() == tag]
  return line


def test_load_runs_returns_every_series(runs, workdirs):
  alpha, beta = runs
  assert (alpha.name, beta.name) == ("alpha", "beta")
  assert alpha.workdir == str(workdirs / "alpha")
  assert alpha.scalars["train/success"] == list(zip(range(1, 7), _ALPHA_TRAIN))
  assert alpha.scalars["val/success"] == sorted(_ALPHA_VAL.items())
  assert alpha.scalars["collapse/multi_turn/mi_estimate"] == [(1, 0.25), (4, 0.75)]
  assert not any(tag.startswith("collapse/") for tag in beta.scalars)
  steps, values = alpha.series("actor/entropy")
  np.testing.assert_array_equal(steps, np.arange(1, 7))
  np.testing.assert_array_equal(values, _ALPHA_ENTROPY)
  assert beta.series("collapse/first_turn/mi_estimate") is None


def test_run_names_use_two_path_parts_only_when_basenames_collide():
  assert plot.run_names(["/r/a/run", "/r/b/run", "/r/c/other"]) == ["a/run", "b/run", "other"]
  assert plot.run_names(["runs/x", "runs/x/"]) == ["runs/x", "runs/x (2)"]


def test_smoothing_is_a_trailing_mean_by_hand():
  np.testing.assert_allclose(plot.smooth([1, 2, 3, 4, 5], 3), [1, 1.5, 2, 3, 4])
  np.testing.assert_allclose(plot.smooth([2, 4, 6], 2), [2, 3, 5])
  # A NaN step is skipped, not spread over the window; a window of only NaN stays NaN.
  np.testing.assert_allclose(
      plot.smooth([1, math.nan, 3, math.nan, math.nan], 2), [1, 1, 3, 3, math.nan]
  )
  np.testing.assert_array_equal(plot.smooth([0.5, 0.25], 1), [0.5, 0.25])
  assert plot.smooth([], 4).size == 0


def test_select_panels_defaults_replace_add_and_glob():
  tags = {"val/success", "val/sokoban/success", "val/bandit/success", "critic/vf_loss"}
  titles = lambda panels: [p.title for p in panels]  # pylint: disable=unnecessary-lambda-assignment
  defaults = titles(plot.select_panels(None, tags))
  # Retrieval and z-score panels appear only when a run logged them.
  assert defaults == [plot.PANELS[n].title for n in ("success", "reward_std", "entropy", "mi")]
  with_mi = titles(plot.select_panels("", tags | {"collapse/first_turn/mi_zscore_ema"}))
  assert with_mi == defaults + [plot.PANELS["mi_zscore"].title]
  assert titles(plot.select_panels("entropy,critic/vf_loss", tags)) == [
      plot.PANELS["entropy"].title,
      "critic/vf_loss",
  ]
  assert titles(plot.select_panels("+val/*/success", tags)) == defaults + [
      "val/bandit/success",
      "val/sokoban/success",
  ]
  (panel,) = plot.select_panels("val/sokoban/success", tags)
  assert panel.curves[0].style == "markers" and not panel.curves[0].smooth
  assert plot.select_panels("critic/vf_loss", tags)[0].curves[0].smooth
  # Logged every step, unlike the MI family under collapse/<family>/.
  assert plot.select_panels("collapse/valid_thinking_rate", tags)[0].curves[0].smooth
  assert not plot.select_panels("collapse/multi_turn/mi_zscore", tags)[0].curves[0].smooth


def test_figure_draws_the_written_values_per_panel(runs):
  tags = {tag for run in runs for tag in run.scalars}
  fig = plot.figure(runs, plot.select_panels(None, tags), title="two runs")
  axes = _axes_by_title(fig)
  expected = ["success", "reward_std", "entropy", "mi", "retrieval", "mi_zscore"]
  assert list(axes) == [plot.PANELS[name].title for name in expected]
  assert fig.legends[0].get_title().get_text() == "two runs"
  success = axes[plot.PANELS["success"].title]
  val = _line(success, "alpha", "val/success")
  np.testing.assert_array_equal(val.get_xdata(), list(_ALPHA_VAL))
  np.testing.assert_array_equal(val.get_ydata(), list(_ALPHA_VAL.values()))
  assert val.get_marker() == "o"
  train = _line(success, "beta", "train/success")
  np.testing.assert_array_equal(train.get_ydata(), [0.0, 0.25, 0.25, 0.5])
  # One colour per run, shared by its validation and training lines.
  assert val.get_color() == _line(success, "alpha", "train/success").get_color()
  assert val.get_color() != train.get_color()
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["alpha", "beta"]
  std = _line(axes["in-group reward std"], "alpha", "rollout/in_group_reward_std")
  np.testing.assert_array_equal(std.get_ydata(), 0.5 * np.array(_ALPHA_TRAIN))
  mi = axes[plot.PANELS["mi"].title]
  assert sorted((l.get_label(), l.get_gid(), l.get_linestyle()) for l in mi.lines) == [
      ("alpha", "collapse/first_turn/mi_estimate", "-"),
      ("alpha", "collapse/first_turn/mi_upper_bound", "--"),
      ("alpha", "collapse/multi_turn/mi_estimate", ":"),
  ]
  first = _line(mi, "alpha", "collapse/first_turn/mi_estimate")
  np.testing.assert_array_equal(first.get_xdata(), [1, 4])
  np.testing.assert_array_equal(first.get_ydata(), [0.5, 1.25])
  np.testing.assert_allclose(
      _line(mi, "alpha", "collapse/first_turn/mi_upper_bound").get_ydata(), [_LOG_N, _LOG_N]
  )
  # The run without MI is named on the panel; the style legend explains the three line kinds.
  assert [t.get_text() for t in mi.texts] == ["not logged by beta"]
  assert [t.get_text() for t in mi.get_legend().get_texts()] == [
      "first turn",
      "multi-turn",
      "log N ceiling",
  ]
  assert not axes["actor entropy"].texts


def test_smoothing_applies_to_per_step_series_only(runs):
  panels = [plot.PANELS["success"], plot.PANELS["entropy"], plot.PANELS["mi"]]
  fig = plot.figure(runs, panels, smooth_k=2)
  success, entropy, mi = fig.axes
  np.testing.assert_allclose(
      _line(entropy, "alpha", "actor/entropy").get_ydata(), [2.0, 1.75, 1.25, 0.75, 0.375, 0.1875]
  )
  np.testing.assert_allclose(
      _line(success, "alpha", "train/success").get_ydata(), [0.25, 0.375, 0.25, 0.375, 0.875, 0.75]
  )
  np.testing.assert_array_equal(
      _line(success, "alpha", "val/success").get_ydata(), list(_ALPHA_VAL.values())
  )
  np.testing.assert_array_equal(
      _line(mi, "alpha", "collapse/first_turn/mi_estimate").get_ydata(), [0.5, 1.25]
  )
  assert entropy.get_title() == "actor entropy (mean of 2 steps)"
  assert mi.get_title() == plot.PANELS["mi"].title


def test_table_row_by_hand(runs):
  alpha, beta = runs
  # alpha: start 25%, then 50% and 75%; gain = mean(25, 50, 75) - 25 = +25 points; s/step = 13.5.
  assert plot.table_row(alpha) == "| alpha | 25.0% | 50.0%, 75.0% | +25.0 | 6 | 14 |  |"
  assert plot.table_row(beta) == "| beta | 50.0% | 25.0%, 50.0% | -8.3 | 4 | 12 |  |"
  assert plot.table(runs).splitlines()[0] == plot.TABLE_HEADER.splitlines()[0]
  # A warm start's 100 fine-tuning steps are not training steps.
  tuned = dataclasses.replace(beta, scalars={**beta.scalars, "sft/loss": [(100, 0.3)]})
  assert plot.table_row(tuned) == "| beta | 50.0% | 25.0%, 50.0% | -8.3 | 4 | 12 |  |"


def test_cli_writes_a_png_and_the_table(workdirs, tmp_path, capsys):
  out = tmp_path / "figs" / "curves.png"
  code = plot.main(
      [
          str(workdirs / "alpha"),
          str(workdirs / "beta"),
          f"--out={out}",
          "--smooth=3",
          "--title=test",
          "--metrics=+critic/vf_loss",
      ]
  )
  assert code == 0
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
  printed = capsys.readouterr().out
  assert "| alpha | 25.0% |" in printed and "| beta | 50.0% |" in printed
  assert f"wrote {out}" in printed


def test_cli_without_mi_tags_plots_the_rest(workdirs, tmp_path, capsys):
  out = tmp_path / "beta.png"
  assert plot.main([str(workdirs / "beta"), f"--out={out}"]) == 0
  assert out.stat().st_size > 0
  (run,) = plot.load_runs([str(workdirs / "beta")])
  fig = plot.figure([run], plot.select_panels(None, run.scalars))
  mi = _axes_by_title(fig)[plot.PANELS["mi"].title]
  assert not mi.lines and [t.get_text() for t in mi.texts] == ["not logged by any run"]
  assert mi.get_xlim() == (0.0, 4.0)  # The runs' step range, not matplotlib's empty 0..1.
  capsys.readouterr()


@pytest.mark.parametrize("name", ["empty", "missing"])
def test_cli_refuses_a_workdir_without_events(workdirs, tmp_path, capsys, name):
  bad = str(workdirs / name)
  code = plot.main([str(workdirs / "alpha"), bad, f"--out={tmp_path / 'x.png'}"])
  assert code == 2
  err = capsys.readouterr().err
  assert bad in err and "Traceback" not in err
  assert not (tmp_path / "x.png").exists()


def test_cli_refuses_a_workdir_with_none_of_the_tags(workdirs, tmp_path, capsys):
  code = plot.main([str(workdirs / "beta"), "--metrics=collapse/*", f"--out={tmp_path / 'x.png'}"])
  assert code == 2
  assert str(workdirs / "beta") in capsys.readouterr().err


def test_missing_matplotlib_is_a_clear_error(runs, monkeypatch, workdirs, tmp_path, capsys):
  for module in ("matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.lines"):
    monkeypatch.setitem(sys.modules, module, None)
  with pytest.raises(ImportError, match="pip install matplotlib"):
    plot.figure(runs, [plot.PANELS["entropy"]])
  assert plot.main([str(workdirs / "alpha"), f"--out={tmp_path / 'x.png'}"]) == 1
  assert "needs matplotlib" in capsys.readouterr().err

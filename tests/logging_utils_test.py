"""Logging: TF-free event files read back exactly and by TensorBoard itself; the progress line."""

import io
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard import context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins.text import text_plugin

from ragen_jax import logging_utils

_TRAJECTORY = "```\n<|im_start|>user\nSokoban ü #__P\n<|im_end|>\n```"


def _f32(x):
  return float(np.float32(x))


def _write_run(logdir):
  """Three steps of scalars (mixed Python/numpy/JAX types) and a text summary at two of them."""
  with logging_utils.SummaryWriter(logdir) as writer:
    for step in (1, 2, 3):
      writer.scalars(
          step,
          {
              "train/success": 0.1 * step,
              "actor/pg_loss": np.float64(-0.37 / step),
              "timing_s/rollout": jnp.float32(1.25 * step),
              "response_length/mean": np.int64(40 + step),
          },
      )
      if step != 2:
        writer.text(step, "rollouts/sample", f"step {step}\n{_TRAJECTORY}")
  return writer


def test_scalars_and_texts_round_trip_exactly(tmp_path):
  writer = _write_run(tmp_path / "tb")
  assert os.path.dirname(writer.path) == str(tmp_path / "tb")
  scalars = logging_utils.read_scalars(tmp_path / "tb")
  assert sorted(scalars) == [
      "actor/pg_loss",
      "response_length/mean",
      "timing_s/rollout",
      "train/success",
  ]
  assert scalars["train/success"] == [(s, _f32(0.1 * s)) for s in (1, 2, 3)]
  assert scalars["actor/pg_loss"] == [(s, _f32(-0.37 / s)) for s in (1, 2, 3)]
  assert scalars["timing_s/rollout"] == [(1, 1.25), (2, 2.5), (3, 3.75)]
  assert scalars["response_length/mean"] == [(1, 41.0), (2, 42.0), (3, 43.0)]
  texts = logging_utils.read_texts(tmp_path / "tb")
  assert texts == {
      "rollouts/sample": [(1, f"step 1\n{_TRAJECTORY}"), (3, f"step 3\n{_TRAJECTORY}")]
  }


def test_tensorboard_accumulator_recognises_scalars_and_text(tmp_path):
  _write_run(tmp_path)
  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  tags = acc.Tags()
  # Scalars are classic simple_value summaries; text is a string tensor owned by the text plugin.
  assert sorted(tags["scalars"]) == [
      "actor/pg_loss",
      "response_length/mean",
      "timing_s/rollout",
      "train/success",
  ]
  assert tags["tensors"] == ["rollouts/sample"]
  assert list(acc.PluginTagToContent("text")) == ["rollouts/sample"]
  assert [(e.step, e.value) for e in acc.Scalars("train/success")] == [
      (s, _f32(0.1 * s)) for s in (1, 2, 3)
  ]
  assert [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("rollouts/sample")] == [
      f"step {s}\n{_TRAJECTORY}" for s in (1, 3)
  ]


def test_tensorboard_dashboards_see_the_data(tmp_path):
  """The data provider the Scalars and Text dashboards query, and the text plugin's renderer."""
  _write_run(tmp_path)
  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(tmp_path))
  mux.Reload()
  provider = data_provider.MultiplexerDataProvider(mux, str(tmp_path))
  ctx = context.RequestContext()
  scalars = provider.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=100)
  assert [(d.step, d.value) for d in scalars["."]["timing_s/rollout"]] == [
      (1, 1.25),
      (2, 2.5),
      (3, 3.75),
  ]
  texts = provider.read_tensors(ctx, experiment_id="", plugin_name="text", downsample=100)
  data = texts["."]["rollouts/sample"]
  assert [d.step for d in data] == [1, 3]
  html = text_plugin.text_array_to_html(data[0].numpy, enable_markdown=True)
  # The code fence renders as a code block with the chat markup escaped, not swallowed as HTML.
  assert "<pre><code>&lt;|im_start|&gt;user\nSokoban ü #__P" in html


def test_relogged_step_keeps_last_value_across_files(tmp_path):
  with logging_utils.SummaryWriter(tmp_path) as writer:
    for step in (1, 2, 3):
      writer.scalars(step, {"train/success": step / 10})
    writer.text(3, "note", "first run")
  # A resumed run (restored at step 2) opens a second event file and re-logs step 3.
  with logging_utils.SummaryWriter(tmp_path) as writer:
    writer.scalars(3, {"train/success": 0.75})
    writer.scalars(4, {"train/success": 0.5})
    writer.text(3, "note", "resumed run")
  assert len(os.listdir(tmp_path)) == 2
  assert logging_utils.read_scalars(tmp_path) == {
      "train/success": [(1, _f32(0.1)), (2, _f32(0.2)), (3, 0.75), (4, 0.5)]
  }
  assert logging_utils.read_texts(tmp_path) == {"note": [(3, "resumed run")]}


def test_reads_subdirectories_and_survives_odd_values(tmp_path):
  with logging_utils.SummaryWriter(tmp_path / "run" / "train") as writer:
    writer.scalars(
        5,
        {
            "a/nan": float("nan"),
            "a/inf": -np.inf,
            "a/huge": 1e300,
            "a/vector": np.zeros(3),
            "a/string": "x",
            "a/bf16": jnp.bfloat16(1.5),
        },
    )
  scalars = logging_utils.read_scalars(tmp_path)
  assert sorted(scalars) == ["a/bf16", "a/huge", "a/inf", "a/nan"]
  assert math.isnan(scalars["a/nan"][0][1])
  assert scalars["a/inf"] == [(5, -math.inf)]
  assert scalars["a/huge"] == [(5, math.inf)]  # beyond float32: stored as inf, not an error
  assert scalars["a/bf16"] == [(5, 1.5)]


def test_disabled_writer_writes_nothing(tmp_path):
  logdir = tmp_path / "tb"
  with logging_utils.SummaryWriter(logdir, enabled=False) as writer:
    writer.scalars(1, {"train/success": 1.0})
    writer.text(1, "t", "x")
    writer.flush()
  assert writer.path is None
  assert not logdir.exists()
  with pytest.raises(FileNotFoundError):
    logging_utils.read_scalars(logdir)


def test_writing_after_close_raises(tmp_path):
  writer = logging_utils.SummaryWriter(tmp_path)
  writer.close()
  writer.close()
  with pytest.raises(RuntimeError, match="closed"):
    writer.scalars(1, {"x": 1.0})


@pytest.mark.parametrize(
    "seconds, expected",
    [
        (0, "00:00"),
        (0.4, "00:00"),
        (41, "00:41"),
        (59.6, "01:00"),
        (632, "10:32"),
        (3599, "59:59"),
        (3600, "1:00:00"),
        (3 * 3600 + 62, "3:01:02"),
        (-5, "00:00"),
        (math.nan, "--:--"),
        (math.inf, "--:--"),
    ],
)
def test_format_duration(seconds, expected):
  assert logging_utils.format_duration(seconds) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.3125, "0.312"),
        (12.345, "12.3"),
        (-1.2345e-5, "-1.23e-05"),
        (1234.56, "1235"),
        (2.5e7, "2.5e+07"),
        (float("nan"), "nan"),
        (jnp.float32(0.5), "0.5"),
        (np.int64(3), "3"),
    ],
)
def test_format_number(value, expected):
  assert logging_utils.format_number(value) == expected


class _FakeClock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_progress_eta_counts_only_steps_of_this_process():
  clock, stream = _FakeClock(), io.StringIO()
  # Restored at step 10 of 200: the 2 steps done here took 41 s, so 188 left take 3854 s.
  progress = logging_utils.Progress(200, start_step=10, stream=stream, clock=clock)
  clock.now += 41
  progress.update(
      12,
      {
          "train/success": 0.3125,
          "val/success": 0.28,
          "actor/pg_loss": -0.0123,
          "response_length/mean": 1234.56,
          "unlisted/key": 7.0,
      },
  )
  clock.now += 19
  progress.update(13, {})
  lines = stream.getvalue().split("\n")
  assert lines[0] == (
      "step  12/200 [#-------------------]   6% | 00:41 elapsed, ETA 1:04:14 | "
      "train/success 0.312 val/success 0.28 actor/pg_loss -0.0123 "
      "response_length/mean 1235"
  )
  # 60 s for 3 steps -> 20 s/step x 187 steps.
  assert lines[1] == "step  13/200 [#-------------------]   6% | 01:00 elapsed, ETA 1:02:20"
  assert lines[2:] == [""]  # exactly one newline-terminated line per update


def test_progress_edges_and_custom_keys():
  clock, stream = _FakeClock(), io.StringIO()
  progress = logging_utils.Progress(100, stream=stream, clock=clock, keys=("loss",))
  progress.update(0, {"loss": 1.0})  # nothing done yet: no ETA
  clock.now += 87
  progress.update(29, {"loss": 0.5, "train/success": 1.0})
  progress.update(100, {})
  assert stream.getvalue().splitlines() == [
      "step   0/100 [--------------------]   0% | 00:00 elapsed, ETA --:-- | loss 1",
      "step  29/100 [#####---------------]  29% | 01:27 elapsed, ETA 03:33 | loss 0.5",
      "step 100/100 [####################] 100% | 01:27 elapsed, ETA 00:00",
  ]
  with pytest.raises(ValueError):
    logging_utils.Progress(0)


def test_progress_disabled_prints_nothing(capsys):
  logging_utils.Progress(10, enabled=False).update(1, {"train/success": 1.0})
  logging_utils.Progress(10).update(1, {"train/success": 1.0})  # default stream: sys.stdout
  assert capsys.readouterr().out.startswith("step  1/10 [##------------------]  10% |")

"""Training-run logging without TensorFlow: TensorBoard event files and a console progress line.

  with logging_utils.SummaryWriter(workdir / "tb", enabled=jax.process_index() == 0) as tb:
    progress = logging_utils.Progress(total_steps, start_step=restored_step)
    for step in range(restored_step + 1, total_steps + 1):
      metrics = ...
      tb.scalars(step, metrics)                      # {"train/success": 0.31, ...}
      tb.text(step, "rollouts/sample", logging_utils.code_block(trajectory))
      progress.update(step, metrics)

  logging_utils.read_scalars(workdir / "tb")          # {"train/success": [(1, 0.31), ...]}

Events are written with TensorBoard's own TF-free writer (`EventFileWriter` falls back to its
bundled TensorFlow stub), so `tensorboard --logdir` shows them as usual: scalars as classic
`simple_value` summaries (float32) and text as string tensors tagged for the Text plugin.
"""

import logging
import math
import os
import re
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TextIO

import numpy as np
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer import event_file_writer
from tensorboard.util import tensor_util

_TEXT_PLUGIN = text_metadata.PLUGIN_NAME  # "text"
_SCALARS_PLUGIN = "scalars"

DEFAULT_PROGRESS_KEYS = (
    "train/success",
    "val/success",
    "actor/pg_loss",
    "actor/entropy",
    "response_length/mean",
)


def _as_float(value) -> Optional[float]:
  """A Python float for a Python/numpy/JAX scalar (any shape of size 1); None if not numeric."""
  try:
    array = np.asarray(value)
  except Exception:  # pylint: disable=broad-except
    return None
  # Strings would parse ("3" -> 3.0) but are no metric; bfloat16 is no np.number, yet converts.
  if array.size != 1 or array.dtype.kind in "SU":
    return None
  try:
    return float(array.reshape(()))
  except (TypeError, ValueError):
    return None


def numeric_scalars(values: Mapping[str, object], warned: Set[str]) -> Dict[str, float]:
  """`values` as Python floats (from Python, numpy or JAX scalars), NaN and inf as they are.

  A value that is not a single number (a vector, a string) is left out with a warning, once per
  tag (`warned` holds the tags already warned about), rather than stopping a training run.
  """
  numbers = {}
  for tag, value in values.items():
    number = _as_float(value)
    if number is None:
      if tag not in warned:
        warned.add(tag)
        logging.warning("skipping the scalar %r, not a single number: %r", tag, value)
      continue
    numbers[tag] = number
  return numbers


class SummaryWriter:
  """Writes scalar and text summaries to a new TensorBoard event file under `logdir`.

  Each writer opens its own event file (a resumed run adds a second file next to the first);
  `read_scalars` merges them, the last written value winning for a re-logged step. With
  `enabled=False` (non-zero processes of a multi-host run) no directory or file is created and
  every method is a no-op. Events are queued and written by a background thread: call `flush`
  or `close` (or use it as a context manager) before reading the file back.
  """

  def __init__(self, logdir: str, enabled: bool = True, flush_secs: float = 30.0):
    self.logdir = os.path.abspath(os.fspath(logdir))
    self.enabled = enabled
    self._warned_tags = set()
    self._writer = None
    self.path: Optional[str] = None  # The event file (None when disabled); kept after close.
    if enabled:
      self._writer = event_file_writer.EventFileWriter(self.logdir, flush_secs=flush_secs)
      self.path = self._writer._file_name  # pylint: disable=protected-access

  def _add(self, step: int, values: List[summary_pb2.Summary.Value]) -> None:
    if self._writer is None:
      if self.enabled:
        raise RuntimeError(f"SummaryWriter for {self.logdir} is closed.")
      return
    if values:
      self._writer.add_event(
          event_pb2.Event(
              wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
          )
      )

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """One scalar summary per key, all in one event at `step`.

    Values may be Python, numpy or JAX scalars; NaN and inf are written as they are
    (TensorBoard plots them as such). A value that is not a single number (a vector, a string)
    is skipped with a warning, once per tag, rather than stopping a training run.
    """
    if not self.enabled:
      return
    # simple_value is float32: values beyond its range are stored as +-inf, without error.
    summary_values = [
        summary_pb2.Summary.Value(tag=tag, simple_value=number)
        for tag, number in numeric_scalars(values, self._warned_tags).items()
    ]
    self._add(step, summary_values)

  def text(self, step: int, tag: str, text: str) -> None:
    """A (Markdown) text summary shown by TensorBoard's Text dashboard, which renders links and
    remote images: put text from elsewhere (model replies) in a `code_block`."""
    if not self.enabled:
      return
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        string_val=[str(text).encode("utf-8")],
    )
    # The text plugin only claims tensors whose metadata names it; without it TB hides them.
    metadata = text_metadata.create_summary_metadata(display_name=None, description=None)
    self._add(step, [summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])

  def flush(self) -> None:
    """Blocks until every queued event is on disk."""
    if self._writer is not None:
      self._writer.flush()

  def close(self, failed: bool = False) -> None:
    """Flushes and closes the event file; closing twice is fine, writing afterwards is not.
    (`failed`: an event file records no outcome; other trackers mark the run failed.)"""
    del failed
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> "SummaryWriter":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def code_block(text: str) -> str:
  """`text` as a Markdown code block that nothing in it can close: the fence is one backtick
  longer than the longest backtick run in `text`, so TensorBoard shows it verbatim."""
  # Python-Markdown deletes STX and ETX (its placeholder marks) before it looks for fences,
  # which joins the backtick runs on either side of them.
  runs = re.findall("`+", re.sub("[\x02\x03]", "", text))
  fence = "`" * max(3, 1 + max(map(len, runs), default=0))
  return f"{fence}\n{text}\n{fence}"


def _event_files(logdir: str) -> List[str]:
  """Event files in `logdir` and its subdirectories (TensorBoard's rule: 'tfevents' in name)."""
  logdir = os.fspath(logdir)
  if not os.path.isdir(logdir):
    raise FileNotFoundError(f"No log directory at {logdir}.")
  return [
      os.path.join(root, name)
      for root, _, names in os.walk(logdir)
      for name in names
      if "tfevents" in name
  ]


def _summary_values(logdir: str):
  """Yields (tag, step, plugin_name, value proto) for every summary value under `logdir`.

  Files are visited in the order they were started (the wall time of their first event, then
  path) and records in file order, so later yields are later writes: a resumed run that
  re-logs a step overrides the earlier value when callers keep the last one.
  """
  files = []
  for path in _event_files(logdir):
    # Raw events: the non-legacy loader rewrites simple_value into tensors on the fly.
    events = [
        event_pb2.Event.FromString(record)
        for record in event_file_loader.RawEventFileLoader(path).Load()
    ]
    start = events[0].wall_time if events else math.inf
    files.append((start, path, events))
  files.sort(key=lambda f: f[:2])
  for _, _, events in files:
    plugins = {}  # Writers may attach metadata only to a tag's first value.
    for event in events:
      if not event.HasField("summary"):
        continue
      for value in event.summary.value:
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
          plugins[value.tag] = value.metadata.plugin_data.plugin_name
        yield value.tag, event.step, plugins.get(value.tag, ""), value


def _sorted(series: Dict[str, Dict[int, object]]) -> Dict[str, List[Tuple[int, object]]]:
  return {tag: sorted(by_step.items()) for tag, by_step in sorted(series.items())}


def read_scalars(logdir: str) -> Dict[str, List[Tuple[int, float]]]:
  """Every scalar under `logdir` (and its subdirectories) as {tag: [(step, value)]}, by step.

  Reads both `simple_value` scalars (this module, PyTorch, Keras) and scalar tensors of the
  scalars plugin (TF2 summaries). A (tag, step) written twice keeps the last written value.
  Tags from different subdirectories are merged, not prefixed.
  """
  series: Dict[str, Dict[int, object]] = {}
  for tag, step, plugin, value in _summary_values(logdir):
    kind = value.WhichOneof("value")
    if kind == "simple_value":
      number = value.simple_value
    elif kind == "tensor" and plugin == _SCALARS_PLUGIN:
      number = float(tensor_util.make_ndarray(value.tensor).reshape(()))
    else:
      continue
    series.setdefault(tag, {})[step] = float(number)
  return _sorted(series)


def read_texts(logdir: str) -> Dict[str, List[Tuple[int, str]]]:
  """Every text summary under `logdir` as {tag: [(step, text)]}, by step; last write wins."""
  series: Dict[str, Dict[int, object]] = {}
  for tag, step, plugin, value in _summary_values(logdir):
    if plugin == _TEXT_PLUGIN and value.WhichOneof("value") == "tensor":
      strings = [s.decode("utf-8", errors="replace") for s in value.tensor.string_val]
      series.setdefault(tag, {})[step] = "\n".join(strings)
  return _sorted(series)


def format_duration(seconds: float) -> str:
  """`MM:SS` below an hour, `H:MM:SS` from an hour on; `--:--` when unknown (NaN, inf)."""
  if not math.isfinite(seconds):
    return "--:--"
  total = max(0, int(round(seconds)))
  hours, rest = divmod(total, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def format_number(value) -> str:
  """Compact, ~3 significant digits: 0.312, 12.3, 1234 (no exponent below a million)."""
  number = _as_float(value)
  if number is None:
    return str(value)
  if math.isfinite(number) and 1000 <= abs(number) < 1e6:
    return f"{number:.0f}"
  return f"{number:.3g}"


_BAR_WIDTH = 20


class Progress:
  """Prints one newline-terminated progress line per training step.

    step  12/200 [#-------------------]   6% | 00:41 elapsed, ETA 10:42 | train/success 0.31

  Elapsed time and the ETA count only this process: the clock starts when the Progress is
  built (build it right before the loop) and steps up to `start_step` (restored from a
  checkpoint) are not in the mean time per step. The first steps include JIT compilation, so
  early ETAs run high. Plain lines rather than carriage returns, because logs end up in files.
  """

  def __init__(
      self,
      total_steps: int,
      start_step: int = 0,
      stream: Optional[TextIO] = None,
      enabled: bool = True,
      keys: Sequence[str] = DEFAULT_PROGRESS_KEYS,
      clock: Callable[[], float] = time.monotonic,
  ):
    if total_steps < 1:
      raise ValueError(f"total_steps must be at least 1, got {total_steps}.")
    self.total_steps = int(total_steps)
    self.start_step = int(start_step)
    self.enabled = enabled
    self.keys = tuple(keys)
    self._stream = stream
    self._clock = clock
    self._start_time = clock()

  def line(self, step: int, metrics: Mapping[str, float]) -> str:
    """The progress line for `step` (no trailing newline)."""
    step = int(step)
    elapsed = self._clock() - self._start_time
    done = step - self.start_step
    eta = elapsed / done * max(0, self.total_steps - step) if done > 0 else math.nan
    # Integer arithmetic: int(29 / 100 * 100) would show 28%.
    clipped = min(max(step, 0), self.total_steps)
    percent = clipped * 100 // self.total_steps
    filled = clipped * _BAR_WIDTH // self.total_steps
    width = len(str(self.total_steps))
    parts = [
        f"step {step:>{width}}/{self.total_steps} "
        f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {percent:3d}%",
        f"{format_duration(elapsed)} elapsed, ETA {format_duration(eta)}",
    ]
    shown = [f"{key} {format_number(metrics[key])}" for key in self.keys if key in metrics]
    if shown:
      parts.append(" ".join(shown))
    return " | ".join(parts)

  def update(self, step: int, metrics: Mapping[str, float]) -> None:
    """Writes the line for `step` (the step just finished) to the stream."""
    if not self.enabled:
      return
    # Looked up at call time so pytest's capsys / a redirected sys.stdout are honoured.
    stream = self._stream if self._stream is not None else sys.stdout
    stream.write(self.line(step, metrics) + "\n")
    stream.flush()

"""What every tracker is: scalars at a step, then close; and what the trackers share.

`logging_utils.SummaryWriter` (TensorBoard) is one implementation, `wandb_run.WandbRun` and
`mlflow_run.MlflowRun` the others; `fanout.Trackers` hands each of them the same floats.
"""

import importlib
import os
from typing import Mapping, Protocol


class Tracker(Protocol):
  """A destination of the run's scalars."""

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """Records `values` (tag -> float, NaN and inf included) at training step `step`. Steps need
    not increase: step 0 (validation of the starting point) may follow a warm start's steps, and
    a resumed run logs again the steps after its checkpoint."""

  def close(self, failed: bool = False) -> None:
    """Ends the tracker's run: finished, or failed when the training raised."""


class TrackerError(ValueError):
  """A tracker setting that cannot work here: its package is missing, its store cannot be opened,
  its service refused the run. A ValueError, so the trainer reports it as a config error."""


def import_package(module: str, requirement: str, setting: str):
  """`module`, imported on first use (a run without the tracker never loads it); a TrackerError
  naming the pip package `requirement` when it is not installed."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise TrackerError(
        f"{setting} needs the {requirement!r} package, which is not installed: "
        f"pip install {requirement} (or pip install 'ragen_jax[trackers]')"
    ) from e


def run_name(name: str | None, workdir: str) -> str:
  """The run's name in the trackers: `logging.run_name`, else the workdir's directory name."""
  return name or os.path.basename(os.path.normpath(os.path.abspath(workdir)))

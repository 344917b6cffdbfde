"""The trackers of one training run, opened together and called as one.

`open_trackers` builds TensorBoard's writer (always) and the trackers the `logging` section
enables, on process 0 alone; the others get a `Trackers` that writes nothing. The ids of the W&B
and MLflow runs go to `workdir/trackers.json`, which a resumed training run reads to continue the
same runs (a fresh start in the workdir starts new ones).
"""

import json
import os
from typing import Any, Dict, List, Mapping, Sequence

from absl import logging

from ragen_jax import atomic_write
from ragen_jax import logging_utils
from ragen_jax.trackers import base
from ragen_jax.trackers import mlflow_run
from ragen_jax.trackers import wandb_run

RECORD_FILE = "trackers.json"  # in the workdir: {"wandb": {"id": ...}, "mlflow": {...}}


class Trackers:
  """Every tracker of the run: `scalars` hands each the same floats, `text` and `flush` go to
  TensorBoard (the only one showing text), and leaving the `with` block closes them all, marking
  the runs failed when it is left by an exception."""

  def __init__(self, tensorboard: logging_utils.SummaryWriter, others: Sequence[base.Tracker]):
    self.tensorboard = tensorboard
    self.others = list(others)
    self._warned: set = set()

  def scalars(self, step: int, values: Mapping[str, Any]) -> None:
    """Writes the single numbers of `values` at `step` to every tracker (others are skipped
    with one warning per tag). A failing W&B or MLflow call is logged and the run goes on:
    a tracker's service being down should not end hours of training."""
    if not self.tensorboard.enabled:
      return
    numbers = logging_utils.numeric_scalars(values, self._warned)
    self.tensorboard.scalars(step, numbers)
    for tracker in self.others:
      try:
        tracker.scalars(step, numbers)
      except Exception as e:
        logging.warning(
            "%s: the scalars of step %d were not logged: %s", type(tracker).__name__, step, e
        )

  def text(self, step: int, tag: str, text: str) -> None:
    self.tensorboard.text(step, tag, text)

  def flush(self) -> None:
    self.tensorboard.flush()

  def close(self, failed: bool = False) -> None:
    """Closes every tracker (each once; a failing close is logged, the rest still close)."""
    trackers, self.others = [*self.others, self.tensorboard], []
    for tracker in trackers:
      try:
        tracker.close(failed=failed)
      except Exception as e:
        if tracker is self.tensorboard:
          raise
        logging.warning("%s: could not close its run: %s", type(tracker).__name__, e)

  def __enter__(self) -> "Trackers":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    self.close(failed=exc_type is not None)


def read_record(workdir: str) -> Dict[str, Dict[str, str]]:
  """The tracker runs recorded in `workdir` ({} when none)."""
  path = os.path.join(workdir, RECORD_FILE)
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as fp:
    return json.load(fp)


def open_trackers(
    spec, workdir: str, config: Mapping[str, Any], resumed: bool, enabled: bool
) -> Trackers:
  """TensorBoard's writer in `workdir` and the trackers `spec` enables.

  Args:
    spec: the config's `logging` section (config.schema.LoggingSpec).
    workdir: the run's directory (exists).
    config: the run's config as nested dicts (its JSON): W&B's config, MLflow's parameters.
    resumed: the run goes on from a checkpoint: continue the tracker runs `RECORD_FILE` names.
    enabled: this process logs (process 0); elsewhere nothing is opened or written.

  Raises:
    base.TrackerError: a tracker that cannot start (package missing, store or service refusing);
      whatever was opened is closed again.
  """
  kinds = [
      kind
      for kind, on in ((wandb_run.WandbRun, spec.wandb), (mlflow_run.MlflowRun, spec.mlflow_uri))
      if on and enabled
  ]
  record = read_record(workdir) if resumed and kinds else {}
  others: List[Any] = []
  try:
    for kind in kinds:
      others.append(kind(spec, workdir, config, record.get(kind.name)))
    # Last: a tracker refusing to start leaves no event file behind.
    tensorboard = logging_utils.SummaryWriter(workdir, enabled=enabled)
  except BaseException:
    Trackers(logging_utils.SummaryWriter(workdir, enabled=False), others).close(failed=True)
    raise
  if others:
    record.update({tracker.name: tracker.record() for tracker in others})
    atomic_write.write_text(os.path.join(workdir, RECORD_FILE), json.dumps(record, indent=1))
  return Trackers(tensorboard, others)

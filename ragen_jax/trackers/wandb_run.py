"""Weights & Biases: one W&B run per training run, continued when the training run resumes.

The W&B run's id is kept in the workdir (`fanout.RECORD_FILE`), and a resumed training run opens
the same id again (`resume="allow"`). Offline (`WANDB_MODE=offline`, read by wandb itself) each
start writes its own directory `wandb/offline-run-<time>-<id>` under `WANDB_DIR`, the workdir
unless set; `wandb sync` given them all uploads them in order of start time into the one run.

Every row carries the training step as the metric "step", the x axis of every other metric
(`define_metric`), rather than relying on W&B's own `_step`: that one only increases, while a
resumed run logs again the steps after its last checkpoint and step 0's validation follows a warm
start's steps. The API key is wandb's business (`wandb login`, `WANDB_API_KEY`); nothing here
reads or writes it.
"""

import os
from typing import Any, Mapping, Optional

from ragen_jax.trackers import base

STEP_METRIC = "step"


class WandbRun:
  """A `base.Tracker` logging to a W&B run (`logging.wandb=True`)."""

  name = "wandb"

  def __init__(
      self,
      spec,
      workdir: str,
      config: Mapping[str, Any],
      previous: Optional[Mapping[str, str]] = None,
  ):
    """Starts the W&B run, or continues the run `previous` names ({"id": ...}).

    Args:
      spec: the config's `logging` section (config.schema.LoggingSpec).
      workdir: the training run's directory (W&B's files go there unless WANDB_DIR is set).
      config: the run's config, nested as in the config file: the W&B run's config.
      previous: what `record` returned when the run started, when it resumes; None: a new run.
    """
    wandb = base.import_package("wandb", "wandb", "logging.wandb=True")
    options = dict(
        project=spec.project,
        name=base.run_name(spec.run_name, workdir),
        # Read at each start: wandb reads WANDB_DIR once per process.
        dir=os.environ.get("WANDB_DIR") or workdir,
        # Several runs in one process (tests, notebooks) each get their own W&B run.
        reinit="create_new",
    )
    if previous:
      options.update(id=previous["id"], resume="allow")
    try:
      self.run = wandb.init(**options)
    except Exception as e:  # not logged in, no network, a project it may not write to
      raise base.TrackerError(
          f"logging.wandb=True: W&B could not start the run: {e} (log in with `wandb login` or "
          "WANDB_API_KEY, or set WANDB_MODE=offline)"
      ) from e
    # A resumed run may have changed the keys config.drift allows (trainer.total_steps, ...).
    self.run.config.update(dict(config), allow_val_change=True)
    self.run.define_metric(STEP_METRIC, hidden=True)
    self.run.define_metric("*", step_metric=STEP_METRIC)

  def record(self) -> dict:
    """What a resumed run needs to continue this W&B run."""
    return {"id": self.run.id}

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    self.run.log({**values, STEP_METRIC: int(step)})

  def close(self, failed: bool = False) -> None:
    self.run.finish(exit_code=1 if failed else 0)

"""Experiment trackers: where a run's scalars go. TensorBoard always (the workdir's events), and
Weights & Biases and MLflow when the config's `logging` section enables them.

    with trackers.open_trackers(exp.logging, workdir, config_values, resumed, enabled) as writer:
      writer.scalars(step, metrics)        # to every tracker, the same floats
      writer.text(step, tag, markdown)     # TensorBoard's Text dashboard alone

    base         the `Tracker` interface, `TrackerError`, the lazy imports
    fanout       the `Trackers` fan-out, `open_trackers`, the run ids kept in the workdir
    wandb_run    Weights & Biases (`wandb`, imported only when `logging.wandb=True`)
    mlflow_run   MLflow (`mlflow-skinny`, imported only when `logging.mlflow_uri` is set)
"""

from ragen_jax.trackers.base import Tracker
from ragen_jax.trackers.base import TrackerError
from ragen_jax.trackers.fanout import open_trackers
from ragen_jax.trackers.fanout import read_record
from ragen_jax.trackers.fanout import RECORD_FILE
from ragen_jax.trackers.fanout import Trackers

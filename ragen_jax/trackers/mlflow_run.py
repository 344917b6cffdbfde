"""MLflow: one MLflow run per training run, in the experiment `logging.project`, continued when
the training run resumes.

Through `MlflowClient` alone (no active run in MLflow's global state), so the process holds no
run that another library could log into. The config goes in as parameters, flattened to dotted
keys (`ppo.actor_lr`); MLflow never changes a logged parameter, so a resumed run adds the keys it
lacks and warns about those the resume changed. Metric and parameter names keep the characters
MLflow accepts (letters, digits, `_ - . /` and space): `@` becomes `_at_`
(`val/math/pass_at_1`), anything else `_`.

A file store (`file:///abs/path`, or a path) is in maintenance mode in MLflow 3 and refused
unless `MLFLOW_ALLOW_FILE_STORE` is true: asking for one by URI is taken as that opt-in, set for
this process unless the environment already says otherwise.
"""

import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional
import urllib.parse

from absl import logging

from ragen_jax.config import drift
from ragen_jax.trackers import base

# MLflow's limits per call of log_batch (mlflow.utils.validation).
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000


def key(name: str) -> str:
  """`name` as an MLflow metric or parameter name (see module doc)."""
  return re.sub(r"[^\w\-./ ]", "_", name.replace("@", "_at_"))


def is_file_store(uri: str) -> bool:
  """A local directory (`file:` URI or a plain path) rather than a server or a database."""
  return urllib.parse.urlparse(uri).scheme in ("", "file")


class MlflowRun:
  """A `base.Tracker` logging to an MLflow run (`logging.mlflow_uri`)."""

  name = "mlflow"

  def __init__(
      self,
      spec,
      workdir: str,
      config: Mapping[str, Any],
      previous: Optional[Mapping[str, str]] = None,
  ):
    """Starts an MLflow run, or continues the run `previous` names when it is in the same store.

    Args:
      spec: the config's `logging` section (config.schema.LoggingSpec).
      workdir: the training run's directory (its name is the default run name).
      config: the run's config, nested as in the config file: flattened into the parameters.
      previous: what `record` returned when the run started, when it resumes; None: a new run.
    """
    uri = spec.mlflow_uri
    mlflow = base.import_package("mlflow", "mlflow-skinny", f"logging.mlflow_uri={uri!r}")
    self._mlflow = mlflow
    if is_file_store(uri):
      os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
      self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
      self.uri = uri
      self.run_id = self._continued(previous) or self._started(spec, workdir)
      self._log_params({key(k): str(v) for k, v in drift.flatten(dict(config)).items()})
    except (mlflow.exceptions.MlflowException, ImportError, OSError) as e:
      raise base.TrackerError(
          f"logging.mlflow_uri={uri!r}: MLflow could not open the run: {e}"
      ) from e

  def _continued(self, previous: Optional[Mapping[str, str]]) -> Optional[str]:
    """The run `previous` names, set running again; None when there is none in this store."""
    if not previous:
      return None
    if previous.get("uri") != self.uri:
      logging.warning(
          "MLflow: the run started in %s; logging.mlflow_uri is now %s, where a new run starts",
          previous.get("uri"),
          self.uri,
      )
      return None
    try:
      self.client.update_run(previous["run_id"], status="RUNNING")
    except self._mlflow.exceptions.MlflowException as e:  # deleted, or another store's id
      logging.warning("MLflow: run %s not found (%s); a new run starts", previous["run_id"], e)
      return None
    return previous["run_id"]

  def _started(self, spec, workdir: str) -> str:
    experiment = self.client.get_experiment_by_name(spec.project)
    experiment_id = (
        self.client.create_experiment(spec.project)
        if experiment is None
        else experiment.experiment_id
    )
    run = self.client.create_run(experiment_id, run_name=base.run_name(spec.run_name, workdir))
    return run.info.run_id

  def _log_params(self, params: Dict[str, str]) -> None:
    """Logs the parameters the run lacks; warns about those whose value changed."""
    logged = self.client.get_run(self.run_id).data.params
    changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
    if changed:
      logging.warning(
          "MLflow keeps the parameters a run was started with; changed since: %s",
          ", ".join(f"{k}: {logged[k]} -> {params[k]}" for k in changed),
      )
    new = [self._mlflow.entities.Param(k, v) for k, v in params.items() if k not in logged]
    for start in range(0, len(new), _PARAMS_PER_BATCH):
      self.client.log_batch(self.run_id, params=new[start : start + _PARAMS_PER_BATCH])

  def record(self) -> dict:
    """What a resumed run needs to continue this MLflow run."""
    return {"uri": self.uri, "run_id": self.run_id}

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    now_ms = int(time.time() * 1000)
    metrics: List[Any] = [
        self._mlflow.entities.Metric(key(tag), value, now_ms, int(step))
        for tag, value in values.items()
    ]
    for start in range(0, len(metrics), _METRICS_PER_BATCH):
      self.client.log_batch(self.run_id, metrics=metrics[start : start + _METRICS_PER_BATCH])

  def close(self, failed: bool = False) -> None:
    self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

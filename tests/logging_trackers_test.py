"""Experiment trackers (ragen_jax.trackers), read back with the trackers' own readers: W&B's
offline run file through wandb's protobuf schema (tests/references.py), MLflow's file store
through `MlflowClient`, TensorBoard's events through logging_utils; resuming continues the same
W&B and MLflow runs; bad settings fail with the key named; one short `:smoke` run through the
trainer with both trackers on.
"""

import glob
import json
import math
import os
import sys

import numpy as np
import pytest

from ragen_jax import logging_utils
from ragen_jax import trackers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.trackers import mlflow_run
from ragen_jax.trackers import wandb_run
from ragen_jax.train import trainer
from references import wandb_config  # pylint: disable=g-bad-import-order
from references import wandb_history  # pylint: disable=g-bad-import-order
from references import wandb_records  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "wandb-key-that-must-not-be-written-0123456789"
# A small config, and its parameters flattened by hand.
CONFIG = {
    "ppo": {"actor_lr": 1e-6, "clip": [0.2, 0.28], "kl_type": "k1"},
    "envs": {"sokoban": {"options": {"dim_room": [6, 6]}, "val_options": {}}},
    "model": {"checkpoint": None, "warm_start": True},
}
PARAMS = {
    "ppo.actor_lr": "1e-06",
    "ppo.clip": "[0.2, 0.28]",
    "ppo.kl_type": "k1",
    "envs.sokoban.options.dim_room": "[6, 6]",
    "model.checkpoint": "None",
    "model.warm_start": "True",
}


@pytest.fixture(name="env")
def _env(tmp_path, monkeypatch):
  """W&B offline in tmp_path, a key in the environment that nothing may write, and MLflow's
  file-store opt-in as the process had it (the tracker sets it)."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_API_KEY", SECRET)
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
  os.makedirs(tmp_path / "wandb_dir")
  return tmp_path


def _steps():
  """(step, values): 150 steps of three tags (W&B's file then spans several 32 KiB blocks),
  values exact in float32 (TensorBoard's type), NaN and inf, a vector that every tracker skips,
  and step 0 last (the starting point's validation follows a warm start's steps)."""
  rows = [
      (
          s,
          {
              "train/success": s / 8,
              "actor/pg_loss": -s / 64,
              "val/math/pass@1": math.nan if s == 7 else (math.inf if s == 9 else s / 4),
              "rollout/lengths": np.arange(3),
          },
      )
      for s in range(1, 151)
  ]
  return rows + [(0, {"val/success": 0.25})]


def _expected(rows):
  """{tag: [(step, value)]} in the order written, the vector left out."""
  out = {}
  for step, values in rows:
    for tag, value in values.items():
      if np.ndim(value) == 0:
        out.setdefault(tag, []).append((step, float(value)))
  return out


def _same(got, want):
  np.testing.assert_array_equal(np.array(got, float), np.array(want, float))  # NaN == NaN here


def _write(workdir, spec, rows, resumed=False, config=None):
  with trackers.open_trackers(spec, str(workdir), config or CONFIG, resumed, True) as writer:
    for step, values in rows:
      writer.scalars(step, values)
  return writer


def _offline_runs(wandb_dir):
  return sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*")))


def _run_record(run_dir):
  return next(r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run")


def _exit_codes(run_dir):
  return [r.exit.exit_code for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "exit"]


def _no_secret_under(*dirs):
  for directory in dirs:
    for root, _, names in os.walk(directory):
      for name in names:
        with open(os.path.join(root, name), "rb") as fp:
          assert SECRET.encode() not in fp.read(), os.path.join(root, name)


def _mlflow_client(uri):
  from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel

  return MlflowClient(tracking_uri=uri)


# ------------------------------------------------------------------ W&B


def test_wandb_offline_file_holds_the_scalars_tensorboard_got_and_the_config(env):
  rows = _steps()
  spec = schema.LoggingSpec(wandb=True, project="trackers-test", run_name="first")
  _write(env / "run", spec, rows)
  (run_dir,) = _offline_runs(env / "wandb_dir")
  history = wandb_history(run_dir)
  got = {}
  for row in history:
    for tag, value in row.items():
      if not tag.startswith("_") and tag != wandb_run.STEP_METRIC:
        got.setdefault(tag, []).append((row[wandb_run.STEP_METRIC], value))
  want = _expected(rows)
  assert got.keys() == want.keys()
  for tag, series in want.items():
    _same(got[tag], series)
  # TensorBoard got the same numbers (sorted by step there).
  tensorboard = logging_utils.read_scalars(env / "run")
  assert tensorboard.keys() == want.keys()
  for tag, series in want.items():
    _same(tensorboard[tag], sorted(series))
  assert wandb_config(run_dir) == CONFIG
  assert (_run_record(run_dir).project, _run_record(run_dir).display_name) == (
      "trackers-test",
      "first",
  )
  assert _exit_codes(run_dir) == [0]
  _no_secret_under(env)


def test_a_resumed_run_continues_the_wandb_run_and_a_fresh_start_does_not(env):
  spec = schema.LoggingSpec(wandb=True)  # run name: the workdir's
  _write(env / "run", spec, [(1, {"a": 1.0}), (2, {"a": 2.0})])
  first_id = trackers.read_record(env / "run")["wandb"]["id"]
  # The resume logs step 2 again (its checkpoint was step 1) and a changed allowed key.
  changed = {**CONFIG, "trainer": {"total_steps": 9}}
  _write(env / "run", spec, [(2, {"a": 2.5}), (3, {"a": 3.0})], resumed=True, config=changed)
  first, second = _offline_runs(env / "wandb_dir")  # one directory per start
  assert _run_record(first).run_id == first_id
  assert (_run_record(second).run_id, _run_record(second).display_name) == (first_id, "run")
  assert trackers.read_record(env / "run")["wandb"]["id"] == first_id
  assert [(r["step"], r["a"]) for r in wandb_history(second)] == [(2, 2.5), (3, 3.0)]
  assert wandb_config(second)["trainer"] == {"total_steps": 9}
  # The same workdir started afresh (no checkpoint): a new W&B run.
  _write(env / "run", spec, [(1, {"a": 0.0})], resumed=False)
  assert trackers.read_record(env / "run")["wandb"]["id"] != first_id


def test_a_run_left_by_an_exception_is_marked_failed(env):
  spec = schema.LoggingSpec(wandb=True, mlflow_uri=(env / "mlruns").as_uri())
  with pytest.raises(RuntimeError, match="boom"):
    with trackers.open_trackers(spec, str(env / "run"), CONFIG, False, True) as writer:
      writer.scalars(1, {"a": 1.0})
      raise RuntimeError("boom")
  (run_dir,) = _offline_runs(env / "wandb_dir")
  assert _exit_codes(run_dir) == [1]
  run_id = trackers.read_record(env / "run")["mlflow"]["run_id"]
  assert _mlflow_client(spec.mlflow_uri).get_run(run_id).info.status == "FAILED"


# ------------------------------------------------------------------ MLflow


def test_mlflow_file_store_holds_the_metric_history_and_the_flattened_config(env):
  rows = _steps()
  uri = (env / "mlruns").as_uri()  # file:///...
  _write(env / "run", schema.LoggingSpec(mlflow_uri=uri, project="exp-a", run_name="r1"), rows)
  client = _mlflow_client(uri)
  experiment = client.get_experiment_by_name("exp-a")
  (run,) = client.search_runs([experiment.experiment_id])
  assert (run.info.run_name, run.info.status) == ("r1", "FINISHED")
  assert trackers.read_record(env / "run")["mlflow"] == {"uri": uri, "run_id": run.info.run_id}
  names = {"train/success", "actor/pg_loss", "val/math/pass_at_1", "val/success"}  # MLflow's
  assert set(run.data.metrics) == names
  for tag, series in _expected(rows).items():
    name = tag.replace("@", "_at_")
    history = client.get_metric_history(run.info.run_id, name)
    _same([(m.step, m.value) for m in history], series)
  assert run.data.params == PARAMS


def test_a_resumed_run_continues_the_mlflow_run_and_keeps_its_parameters(env, caplog):
  uri = (env / "mlruns").as_uri()
  spec = schema.LoggingSpec(mlflow_uri=uri)
  _write(env / "run", spec, [(1, {"a": 1.0}), (2, {"a": 2.0})])
  changed = {**CONFIG, "ppo": {**CONFIG["ppo"], "actor_lr": 2e-6}, "trainer": {"total_steps": 9}}
  _write(env / "run", spec, [(2, {"a": 2.5})], resumed=True, config=changed)
  client = _mlflow_client(uri)
  (run,) = client.search_runs([client.get_experiment_by_name("ragen_jax").experiment_id])
  assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "a")] == [
      (1, 1.0),
      (2, 2.0),
      (2, 2.5),
  ]
  # MLflow never changes a parameter: the new key is added, the changed one kept and warned about.
  assert run.data.params == {**PARAMS, "trainer.total_steps": "9"}
  assert "ppo.actor_lr: 1e-06 -> 2e-06" in caplog.text
  assert run.info.status == "FINISHED"


def test_mlflow_names_keep_to_the_characters_it_accepts():
  assert mlflow_run.key("val/math/pass@1") == "val/math/pass_at_1"
  assert mlflow_run.key("envs.a b-c/d_e") == "envs.a b-c/d_e"
  assert mlflow_run.key("x:y=z") == "x_y_z"


# ------------------------------------------------------------------ the fan-out


def test_only_process_zero_writes(env, monkeypatch):
  def refuse(*args):
    raise AssertionError(f"a tracker opened on a non-zero process: {args}")

  monkeypatch.setattr(wandb_run.WandbRun, "__init__", refuse)
  monkeypatch.setattr(mlflow_run.MlflowRun, "__init__", refuse)
  spec = schema.LoggingSpec(wandb=True, mlflow_uri=(env / "mlruns").as_uri())
  with trackers.open_trackers(spec, str(env / "run1"), CONFIG, True, False) as writer:
    writer.scalars(1, {"a": 1.0})
    writer.text(1, "t", "x")
  assert not os.path.exists(env / "run1") and not os.listdir(env / "wandb_dir")


def test_a_failing_tracker_call_is_logged_and_the_others_still_write(tmp_path, caplog):
  class Down:
    closed = None

    def scalars(self, step, values):
      raise ConnectionError("tracking server unreachable")

    def close(self, failed=False):
      Down.closed = failed

  tensorboard = logging_utils.SummaryWriter(tmp_path)
  with trackers.Trackers(tensorboard, [Down()]) as writer:
    writer.scalars(3, {"a": 0.5})
  assert logging_utils.read_scalars(tmp_path) == {"a": [(3, 0.5)]}
  assert "Down: the scalars of step 3 were not logged: tracking server unreachable" in caplog.text
  assert Down.closed is False


# ------------------------------------------------------------------ bad settings


@pytest.mark.parametrize("module, requirement", [("wandb", "wandb"), ("mlflow", "mlflow-skinny")])
def test_a_missing_package_is_named_with_its_pip_install(env, monkeypatch, module, requirement):
  monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
  spec = schema.LoggingSpec(wandb=module == "wandb", mlflow_uri=(env / "m").as_uri())
  with pytest.raises(trackers.TrackerError, match=f"pip install {requirement} "):
    trackers.open_trackers(spec, str(env / "run"), CONFIG, False, True)
  assert not os.path.exists(env / "run" / trackers.RECORD_FILE)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("project", "team/project", r"logging\.project must be 1 to 128 characters without"),
        ("project", "", r"logging\.project must be"),
        ("run_name", " ", r"logging\.run_name must be None or a name"),
        ("mlflow_uri", "", r"logging\.mlflow_uri must be None or a tracking URI"),
        ("mlflow_uri", "file:mlruns", r"logging\.mlflow_uri: a file store is file:///absolute"),
        ("mlflow_uri", "file://host/x", r"logging\.mlflow_uri: a file store is file:///absolute"),
        ("mlflow_uri", "https://me:pw@host", r"logging\.mlflow_uri must hold no user or password"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(key, value, message):
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke")
  config.logging[key] = value
  with pytest.raises(ValueError, match="^config: " + message):
    schema.from_config(config)


def test_a_store_mlflow_cannot_open_stops_the_launch_before_training(env):
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke")
  config.logging.mlflow_uri = "nosuchstore://x"  # as sqlite:// is with mlflow-skinny alone
  with pytest.raises(trainer.ConfigError, match=r"^logging\.mlflow_uri='nosuchstore://x': MLflow"):
    trainer.train(config, str(env / "run"))
  assert not glob.glob(str(env / "run" / "events.*")) and not os.listdir(
      env / "run" / "checkpoints"
  )


# ------------------------------------------------------------------ through the trainer


@pytest.fixture(scope="module", name="tracked_run")
def _tracked_run(tmp_path_factory):
  """A `:smoke` run of 1 step with W&B (offline, files in the workdir) and MLflow, then the same
  command again: it resumes from the last checkpoint (with nothing left to train) and must go on
  with the same tracker runs."""
  root = tmp_path_factory.mktemp("tracked")
  names = ("WANDB_MODE", "WANDB_DIR", "WANDB_API_KEY", "MLFLOW_ALLOW_FILE_STORE")
  saved = {k: os.environ.get(k) for k in names}
  os.environ.update(WANDB_MODE="offline", WANDB_API_KEY=SECRET)
  os.environ.pop("WANDB_DIR", None)
  try:
    config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke")
    config.trainer.total_steps = 1
    config.logging.wandb = True
    config.logging.mlflow_uri = (root / "mlruns").as_uri()
    workdir = str(root / "run")
    assert trainer.train(config, workdir)["step"] == 1
    assert trainer.train(config, workdir)["step"] == 1  # resumed at its end
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  return root, workdir, config


def test_the_trainer_logs_the_same_scalars_to_every_tracker_across_a_resume(tracked_run):
  root, workdir, config = tracked_run
  tensorboard = logging_utils.read_scalars(workdir)
  assert [s for s, _ in tensorboard["train/success"]] == [1]
  assert [s for s, _ in tensorboard["val/success"]] == [0, 1]
  record = trackers.read_record(workdir)
  # W&B: one run id, written offline once per start into the workdir.
  runs = _offline_runs(workdir)
  assert [_run_record(r).run_id for r in runs] == [record["wandb"]["id"]] * 2
  wandb_rows = [row for run in runs for row in wandb_history(run)]
  # MLflow: one run, finished, the config as its parameters.
  client = _mlflow_client(config.logging.mlflow_uri)
  (run,) = client.search_runs([client.get_experiment_by_name("ragen_jax").experiment_id])
  assert run.info.run_id == record["mlflow"]["run_id"] and run.info.status == "FINISHED"
  assert run.info.run_name == "run"
  flat = {}
  for section, values in json.loads(config.to_json_best_effort()).items():
    stack = [(section, values)]
    while stack:
      prefix, node = stack.pop()
      for k, v in node.items():
        if isinstance(v, dict):
          stack.append((f"{prefix}.{k}", v))
        else:
          flat[mlflow_run.key(f"{prefix}.{k}")] = str(v)
  assert run.data.params == flat
  for tag, series in tensorboard.items():
    # TensorBoard keeps float32; the other two the float64 the trainer handed out.
    mlflow_series = [
        (m.step, m.value) for m in client.get_metric_history(run.info.run_id, mlflow_run.key(tag))
    ]
    wandb_series = [(r["step"], r[tag]) for r in wandb_rows if tag in r]
    for got in (mlflow_series, wandb_series):
      assert [s for s, _ in got] == [s for s, _ in series], tag
      np.testing.assert_allclose([v for _, v in got], [v for _, v in series], rtol=1e-6)
  _no_secret_under(root)

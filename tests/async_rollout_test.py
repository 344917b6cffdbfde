"""Asynchronous rollouts (trainer.async_rollout, train/pipeline.py) end to end.

Runs on 2 simulated CPU devices (tests/async_runs.py, in a subprocess) are compared bit for bit
with a synchronous run of the same config on this process's one device: at max_staleness 0 the
asynchronous schedule is the synchronous one; one step ahead, a run stopped and resumed twice
equals the uninterrupted run; and the logged staleness is what the schedule says. Bad settings
fail before anything compiles, naming the key; under LoRA only the adapters are copied.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import async_runs
from ragen_jax import models
from ragen_jax import sharding
from ragen_jax.algos.step_records import param_dict
from ragen_jax.config import schema
from ragen_jax.train import pipeline
from ragen_jax.train import trainer
from xla_devices import cpu_devices  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _devices(n):
  return cpu_devices(n)


@pytest.fixture(scope="module", name="runs")
def runs_fixture(tmp_path_factory):
  """(the synchronous run's summary here, {name: summary} of the asynchronous runs)."""
  root = tmp_path_factory.mktemp("async")
  proc = subprocess.Popen(  # the asynchronous runs, while the synchronous one runs here
      [sys.executable, "tests/async_runs.py", str(root)],
      cwd=ROOT,
      env=_devices(2),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  try:
    assert jax.device_count() == 1
    trainer.train(async_runs.config(False), str(root / "sync"))
    sync = async_runs.summary(str(root / "sync"))
    out, err = proc.communicate(timeout=900)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, err[-3000:]
  line = [l for l in out.splitlines() if l.startswith("RESULT ")][0]
  return sync, json.loads(line[len("RESULT ") :])


def _without_async(metrics):
  return {k: v for k, v in metrics.items() if not k.startswith("async/")}


def test_staleness_zero_is_the_synchronous_run_bit_for_bit(runs):
  sync, got = runs
  stale0 = got["stale0"]
  assert stale0["metrics"]["async/staleness"] == {"1": 0.0, "2": 0.0}
  assert _without_async(stale0["metrics"]) == sync["metrics"]
  assert stale0["actor"] == sync["actor"]


def test_one_step_ahead_trains_on_weights_one_step_old(runs):
  sync, got = runs
  stale1 = got["stale1"]
  assert stale1["metrics"]["async/staleness"] == {"1": 0.0, "2": 1.0}
  # Step 1 plays with the starting weights either way; step 2 with the starting ones again.
  first = {k: v["1"] for k, v in _without_async(stale1["metrics"]).items() if "1" in v}
  assert first == {k: v["1"] for k, v in sync["metrics"].items() if "1" in v}
  later = [k for k, v in sync["metrics"].items() if v.get("2") != stale1["metrics"][k].get("2")]
  assert later, "a one-step-stale run trained exactly as the synchronous one"
  assert stale1["actor"] != sync["actor"]


def test_a_resumed_asynchronous_run_equals_the_uninterrupted_one(runs):
  _, got = runs
  assert got["resumed"]["metrics"] == got["stale1"]["metrics"]
  assert got["resumed"]["actor"] == got["stale1"]["actor"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(rollout_devices=1, async_rollout=False), "mesh.rollout_devices = 1 needs trainer"),
        (dict(rollout_devices=0), "trainer.async_rollout=True needs mesh.rollout_devices >= 1"),
        (dict(recompute=False), "trainer.async_rollout=True needs ppo.recompute_old_logprobs"),
        (dict(rollout_devices=-1), "mesh.rollout_devices must be an integer >= 0"),
        (dict(max_staleness=-1), "trainer.max_staleness must be an integer >= 0"),
    ],
)
def test_settings_it_cannot_serve_are_refused_naming_the_key(changes, message):
  config = async_runs.config(changes.get("async_rollout", True), changes.get("max_staleness", 1))
  with config.unlocked():
    config.mesh.rollout_devices = changes.get("rollout_devices", 1)
    config.ppo.recompute_old_logprobs = changes.get("recompute", True)
  with pytest.raises(ValueError, match=message):
    schema.from_config(config)


def test_a_split_the_devices_cannot_serve_stops_before_compiling(tmp_path):
  # One device here: nothing would be left to train on.
  with pytest.raises(trainer.ConfigError, match="leaves none of the 1 devices to train on"):
    trainer.train(async_runs.config(True), str(tmp_path / "one"))
  # Four devices: a rollout batch of 4 episodes on 3 rollout devices.
  script = (
      "from ragen_jax.train import trainer; import async_runs, sys\n"
      "c = async_runs.config(True)\n"
      "c.mesh.rollout_devices = 3\n"
      "try:\n  trainer.train(c, sys.argv[1])\nexcept trainer.ConfigError as e:\n  print(e)\n"
  )
  proc = subprocess.run(
      [sys.executable, "-c", script, str(tmp_path / "four")],
      cwd=os.path.join(ROOT, "tests"),
      env=_devices(4),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert (
      "the rollout batch of envs.sokoban on mesh.rollout_devices = 3" in proc.stdout
  ), proc.stderr[-2000:]
  assert "= 4 cannot be split over data = 3" in proc.stdout


def test_under_lora_only_the_adapters_travel_to_the_rollout_devices():
  model = models.create("tiny", jax.random.key(0))
  model = models.lora.add(model, models.LoraConfig(rank=2), jax.random.key(1))
  params = param_dict(model)
  weights = pipeline.RolloutWeights(model, sharding.Sharder(sharding.MeshSpec()))
  weights.load(params, version=0)
  frozen = weights.frozen
  adapters = jax.tree_util.tree_flatten_with_path(weights.trainable)[0]
  assert adapters and all(models.lora.is_adapter_key(path[-1].key) for path, _ in adapters)
  moved = jax.tree.map(lambda x: x + 1, params)  # what an update would change: the adapters
  weights.load(moved, version=3)
  assert weights.frozen is frozen and weights.version == 3  # the base stayed where it was
  got = param_dict(weights.policy())
  want = models.lora.combine(models.lora.partition(moved)[0], models.lora.partition(params)[1])
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(g, w)

"""Short asynchronous training runs on 2 simulated CPU devices; prints their results as JSON.

  XLA_FLAGS=--xla_force_host_platform_device_count=2 python tests/async_runs.py WORKDIR

Run by tests/async_rollout_test.py in a subprocess (the device count is fixed when JAX starts).
Device 0 plays the rollouts, device 1 trains (mesh.rollout_devices = 1), so every program is the
one a single-device synchronous run compiles and the runs compare bit for bit with it. Runs, all
of `config(...)` (the `:smoke` config, 2 steps):
  stale0: trainer.max_staleness = 0 (each rollout waits for the newest weights);
  stale1: max_staleness = 1, uninterrupted;
  resumed: max_staleness = 1, stopped after step 1 (the rollout of step 2 in flight), resumed.
Prints `RESULT {name: summary(workdir)}`.
"""

import hashlib
import json
import os
import sys

import jax
import numpy as np

from ragen_jax import logging_utils
from ragen_jax.algos.step_records import param_dict
from ragen_jax.config import cli
from ragen_jax.train import restore
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
# Wall-clock metrics differ between runs; everything else must match exactly.
TIMING = ("timing_s/", "perf/")


def config(async_rollout: bool, max_staleness: int = 1):
  """The `:smoke` config cut to 2 steps (validation at 0 and 2), synchronous or asynchronous."""
  cfg = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke")
  with cfg.unlocked():
    cfg.trainer.total_steps = STEPS
    cfg.trainer.eval_every = 10
    cfg.envs.sokoban.val_groups = 1
    cfg.trainer.async_rollout = async_rollout
    cfg.trainer.max_staleness = max_staleness
    cfg.mesh.rollout_devices = 1 if async_rollout else 0
  return cfg


def summary(workdir: str):
  """{"metrics": {tag: {step: value}} without timings, "actor": a digest per parameter leaf of
  the last checkpoint's actor}."""
  scalars = logging_utils.read_scalars(workdir)
  metrics = {
      tag: {str(step): value for step, value in series}
      for tag, series in scalars.items()
      if not tag.startswith(TIMING)
  }
  params = param_dict(restore.load_actor(workdir)[0])
  actor = {
      jax.tree_util.keystr(path): hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  }
  return {"metrics": metrics, "actor": actor}


def main(root: str):
  results = {}
  for name, stale in (("stale0", 0), ("stale1", 1)):
    workdir = os.path.join(root, name)
    trainer.train(config(True, stale), workdir)
    results[name] = summary(workdir)
  workdir = os.path.join(root, "resumed")
  for _ in range(STEPS):
    if trainer.train(config(True, 1), workdir, stop_after=1)["step"] == STEPS:
      break
  results["resumed"] = summary(workdir)
  print("RESULT " + json.dumps(results))


if __name__ == "__main__":
  main(sys.argv[1])

"""The evaluation entry point: CLI, Hugging Face checkpoints, and the reported numbers.

Uses the debug variants of the shipped configs (tiny random model, a few short episodes).
Dimension legend: B episodes.
"""

import collections
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ragen_jax import evaluate
from ragen_jax import models
from ragen_jax.train import experiment
from ragen_jax.train import launch_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name, arg="debug"):
  """The debug variant with random weights (not the shipped warm start)."""
  config = launch_utils.load_config_file(os.path.join(ROOT, "configs", f"{name}_ppo.py:{arg}"))
  with config.unlocked():
    config.model.warm_start = False
  return config


def read_lines(path):
  with open(path) as fp:
    return [json.loads(line) for line in fp]


def test_cli_with_a_random_model_writes_one_line_per_trajectory(tmp_path):
  out = tmp_path / "bandit.jsonl"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "ragen_jax.evaluate",
          "--config=configs/bandit_ppo.py:debug",
          "--config.envs.bandit.val_groups=3",
          "--config.model.warm_start=False",
          "--config.rollout.val_group_size=2",
          f"--output={out}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(proc.stdout[proc.stdout.index("{") :])
  lines = read_lines(out)
  assert len(lines) == summary["val/num_episodes"] == 3 * 2
  assert [l["seed"] for l in lines] == [123, 123, 124, 124, 125, 125]
  for line in lines:
    assert set(line) >= {"messages", "success", "reward", "turns"}
    assert [m["role"] for m in line["messages"]] == ["system", "user", "assistant"]


def test_numbers_follow_from_the_trajectories_and_validation_settings(tmp_path):
  config = load_config("frozenlake")
  with config.unlocked():
    config.envs.frozenlake.val_groups = 3  # two batches: 2 groups, then 1
    config.rollout.val_batch_groups = 2
    config.rollout.val_group_size = 2
  exp = experiment.from_config(config)
  validation = exp.envs[0].rollout_config(exp.rollout, validation=True)
  assert validation.temperature == 0.5 and validation.group_size == 2
  assert validation.env_groups == 2
  summary = evaluate.evaluate(config, output=str(tmp_path / "fl.jsonl"))
  lines = read_lines(tmp_path / "fl.jsonl")
  assert len(lines) == 6 and sorted({l["seed"] for l in lines}) == [123, 124, 125]
  success = np.array([l["success"] for l in lines], float)
  rewards = np.array([l["reward"] for l in lines])
  assert summary["val/success"] == pytest.approx(success.mean())
  assert summary["val/frozenlake/return"] == pytest.approx(rewards.mean(), abs=1e-6)
  by_group = collections.defaultdict(list)
  for l in lines:
    by_group[l["seed"]].append(l["success"])
  assert summary["val/frozenlake/pass@2"] == pytest.approx(
      np.mean([any(v) for v in by_group.values()])
  )
  # Random weights write junk: each played turn costs the format penalty and nothing else.
  turns = np.array([l["turns"] for l in lines])
  np.testing.assert_allclose(rewards, -0.1 * turns, atol=1e-6)
  # Episodes of a group start from the same level; different groups from different ones.
  firsts = {l["seed"]: l["messages"][1]["content"] for l in lines}
  assert len(set(firsts.values())) == 3
  assert all(l["messages"][1]["content"] == firsts[l["seed"]] for l in lines)


def test_hugging_face_checkpoint_evaluates_like_the_same_weights_in_memory(tmp_path):
  config = load_config("frozenlake")
  model = models.create(config.model.preset, jax.random.key(config.seed.init))
  models.save_hf(model, str(tmp_path / "ckpt"))
  from_dir = evaluate.evaluate(
      config, checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "a.jsonl")
  )
  in_memory = evaluate.evaluate(config, output=str(tmp_path / "b.jsonl"))
  assert from_dir == in_memory
  assert read_lines(tmp_path / "a.jsonl") == read_lines(tmp_path / "b.jsonl")


def test_a_directory_that_is_neither_a_run_nor_hugging_face_is_refused(tmp_path):
  config = load_config("frozenlake")
  (tmp_path / "weights").mkdir()
  with pytest.raises(FileNotFoundError, match="not a training run"):
    evaluate.load_policy(config, str(tmp_path / "weights"))

"""The evaluation entry point: CLI, Hugging Face checkpoints, and the reported numbers.

Uses the debug variants of the shipped configs (tiny random model, a few short episodes), and one
workdir made by `launch.py` itself, whose own validation is the reference for evaluating it.
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
from ragen_jax import logging_utils
from ragen_jax import models
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import restore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD_KEYS = ["messages", "success", "reward", "turns", "group_id", "context_truncated"]
RECORD_KEYS += ["turn_rewards", "reply_starts", "env", "seed", "episode"]


def load_config(name, arg="debug"):
  """The debug variant with random weights (not the shipped warm start)."""
  config = cli.load_config_file(os.path.join(ROOT, "configs", f"{name}_ppo.py:{arg}"))
  with config.unlocked():
    config.model.warm_start = False
  return config


def read_lines(path):
  with open(path, encoding="utf-8") as fp:
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
  exp = schema.from_config(config)
  validation = exp.envs[0].rollout_config(exp.rollout, validation=True)
  assert validation.temperature == 0.5 and validation.group_size == 2
  assert validation.env_groups == 2
  summary = evaluate.evaluate(config, output=str(tmp_path / "fl.jsonl"))
  lines = read_lines(tmp_path / "fl.jsonl")
  assert len(lines) == 6 and sorted({l["seed"] for l in lines}) == [123, 124, 125]
  # The records' keys, in order (the viewer and earlier runs' files have these).
  assert all(list(l) == RECORD_KEYS for l in lines)
  assert [(l["env"], l["group_id"], l["episode"], l["seed"]) for l in lines] == [
      ("frozenlake", g, e, 123 + g) for g in range(3) for e in range(2)
  ]
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
  with pytest.raises(
      FileNotFoundError, match=r"neither a training run .*\(no config\.json, no model"
  ):
    evaluate.load_policy(config, str(tmp_path / "weights"))
  # A workdir whose first checkpoint was never written: its config.json is no model.
  (tmp_path / "weights" / "config.json").write_text("{}")
  with pytest.raises(
      FileNotFoundError,
      match=r"checkpoints/ directory.*\(no model\.safetensors or model\.safetensors\.index",
  ):
    evaluate.load_policy(config, str(tmp_path / "weights"))
  with pytest.raises(FileNotFoundError, match="no such directory"):
    evaluate.load_policy(config, str(tmp_path / "nowhere"))


def test_cli_refuses_a_damaged_checkpoint_in_one_line(tmp_path):
  config = load_config("frozenlake")
  models.save_hf(models.create(config.model.preset, jax.random.key(0)), str(tmp_path))
  (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "truncated')
  proc = run_evaluate(f"--checkpoint={tmp_path}", "--config=configs/frozenlake_ppo.py:debug")
  assert proc.returncode == 2
  assert proc.stderr.splitlines()[-1].startswith(f"error: {tmp_path / 'tokenizer.json'}: not a")
  assert "Traceback" not in proc.stderr


def run_evaluate(*args, env=None):
  return subprocess.run(
      [sys.executable, "-m", "ragen_jax.evaluate", *args],
      cwd=ROOT,
      env={**os.environ, **(env or {})},
      capture_output=True,
      text=True,
      timeout=300,
  )


@pytest.fixture(scope="module")
def launched_workdir(tmp_path_factory):
  """A workdir as `launch.py` leaves it (config.json beside checkpoints/): the bandit smoke
  run stopped at its starting point, which it validated and saved as step 0."""
  workdir = tmp_path_factory.mktemp("launched") / "run"
  proc = subprocess.run(
      [
          sys.executable,
          "launch.py",
          "--config=configs/bandit_ppo.py:smoke",
          f"--workdir={workdir}",
          "--config.trainer.total_steps=0",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert {"config.json", "checkpoints", "eval"} <= set(os.listdir(workdir))
  return workdir


def test_cli_evaluates_a_launched_workdir_as_its_run_did(launched_workdir, tmp_path):
  """Under an ASCII-only locale, to a path with a non-ASCII name: the trajectories are the ones
  the trainer wrote at that step, byte for byte, and the printed numbers follow from them."""
  out = tmp_path / "eval √.jsonl"
  ascii_locale = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
  proc = run_evaluate(f"--checkpoint={launched_workdir}", f"--output={out}", env=ascii_locale)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert out.read_bytes() == (launched_workdir / "eval" / "step_0.jsonl").read_bytes()
  summary = json.loads(proc.stdout[proc.stdout.index("{") :])
  lines = read_lines(out)
  assert summary["val/num_episodes"] == len(lines) == 4
  assert summary["val/success"] == pytest.approx(np.mean([l["success"] for l in lines]))
  logged = logging_utils.read_scalars(launched_workdir)["val/success"]
  assert logged == [(0, pytest.approx(summary["val/success"]))]


def test_an_export_over_an_earlier_one_evaluates_like_the_run(launched_workdir, tmp_path):
  out = tmp_path / "hf"
  other = models.create("tiny", jax.random.key(7))
  models.save_hf(other, str(out), max_shard_bytes=2**20)  # an earlier export, in shards
  assert len(os.listdir(out)) > 3
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "ragen_jax.export",
          f"--checkpoint={launched_workdir}",
          f"--out={out}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0 and "exported step 0" in proc.stdout, proc.stderr[-3000:]
  assert sorted(os.listdir(out)) == [
      "config.json",
      "model.safetensors",
      "ragen_sentencepiece.model",
  ]
  run_config = restore.run_config(str(launched_workdir))[0]
  evaluate.evaluate(run_config, checkpoint=str(out), output=str(tmp_path / "hf.jsonl"))
  assert read_lines(tmp_path / "hf.jsonl") == read_lines(launched_workdir / "eval" / "step_0.jsonl")

"""Text environments through the trainer: the example trains with `:smoke` and resumes exactly,
a gymnasium environment trains beside a pure-JAX one, and environment faults stop a run with a
clear message before it trains on them.
"""

import os
import socket
import subprocess
import sys

import pytest

from ragen_jax import logging_utils
from ragen_jax.config import cli
from ragen_jax.train import trainer

from references import comparable, run_cut_at  # as the built-in environments' resume

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUSTOM = os.path.join(ROOT, "configs", "custom_env.py") + ":smoke"


@pytest.fixture(scope="module")
def launched_run(tmp_path_factory):
  """README's one line, `launch.py --config=configs/custom_env.py` (here `:smoke`): its workdir,
  also the uninterrupted run the resumed one is compared with."""
  workdir = str(tmp_path_factory.mktemp("custom") / "launched")
  out = subprocess.run(
      [sys.executable, "launch.py", f"--config={CUSTOM}", f"--workdir={workdir}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def test_the_example_environment_trains_through_launch(launched_run):
  scalars = logging_utils.read_scalars(launched_run)
  for tag in ("train/custom/success", "train/custom/env_error", "val/custom/success"):
    assert tag in scalars, sorted(scalars)
  assert scalars["train/custom/env_error"][-1] == (4, 0.0)  # 4 steps, no environment error
  assert os.path.isdir(os.path.join(launched_run, "checkpoints", "4"))


def test_the_example_resumes_like_an_uninterrupted_run(launched_run, tmp_path):
  # The run as it was when it saved step 2 (of 4): the same call resumes it.
  workdir = run_cut_at(launched_run, str(tmp_path / "resumed"), 2)
  assert trainer.train(cli.load_config_file(CUSTOM), workdir)["step"] == 4
  expected = comparable(logging_utils.read_scalars(launched_run), {3, 4})
  assert ("train/custom/success", 3) in expected and ("val/custom/success", 4) in expected
  assert comparable(logging_utils.read_scalars(workdir), {1, 2, 3, 4}) == expected


def test_gymnasium_frozenlake_trains_beside_a_jax_environment(tmp_path):
  from ragen_jax.config import sections as cs  # pylint: disable=import-outside-toplevel

  config = cs.experiment(
      "smoke",
      envs=dict(
          gym_frozenlake=cs.env(
              entry="ragen_jax.envs.bridges.gymnasium:from_gymnasium",
              options=dict(env_id="FrozenLake-v1", is_slippery=False),
          ),
          bandit=cs.env("bandit"),
      ),
      sft=dict(steps=0),
      trainer=dict(total_steps=1),  # the trainer's own tests take several steps
  )
  summary = trainer.train(config, str(tmp_path / "gym"))
  assert summary["step"] == 1
  for tag in ("gym_frozenlake", "bandit"):
    assert summary[f"train/{tag}/env_error"] == 0.0
    assert f"val/{tag}/success" in summary
  assert summary["train/batch_size"] == 2 * 2 * 2


def _dead_url() -> str:
  """A 127.0.0.1 URL where nothing listens (a server that was killed)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}"


def test_environment_faults_stop_the_run_before_training(tmp_path):
  config = cli.load_config_file(CUSTOM)
  with config.unlocked():
    config.envs.custom.entry = _dead_url()
    config.envs.custom.step_timeout_s = 5.0
  workdir = str(tmp_path / "dead")
  with pytest.raises(trainer.EnvironmentFailure, match=r"100% of the episodes of envs.custom"):
    trainer.train(config, workdir)
  assert not os.path.isdir(os.path.join(workdir, "checkpoints", "0"))  # nothing saved


@pytest.mark.parametrize(
    "entry, message",
    [
        ("no_such_module_xyz:Env", "importing 'no_such_module_xyz' failed"),
        ("examples.guess_number:Nope", "has no attribute 'Nope'"),
        ("examples.guess_number", "must be 'package.module:Name'"),
    ],
)
def test_a_bad_entry_is_a_clear_error_before_anything_compiles(entry, message):
  config = cli.load_config_file(CUSTOM)
  with config.unlocked():
    config.envs.custom.entry = entry
  from ragen_jax.config import schema  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match=message):
    schema.from_config(config)


def test_options_the_environment_does_not_take_are_a_clear_error():
  config = cli.load_config_file(CUSTOM)
  config.envs.custom.options = {"hihg": 9}
  from ragen_jax.config import schema  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match=r"does not take options \['hihg'\]"):
    schema.from_config(config)


# text_mix_ppo holds Countdown, math and Sudoku as three tags of one batch; their own configs
# (countdown_grpo, math_ppo, sudoku_ppo) differ from it in settings alone, which
# experiment_test validates for every config.
@pytest.mark.parametrize("name", ["text_mix_ppo", "game2048_ppo"])
def test_ragens_text_environments_warm_start_and_train(name, tmp_path):
  """RAGEN's Countdown, math and Sudoku in one config (`:smoke`), and 2048's (a pure-JAX
  environment with an expert): the environments' own experts give the supervised warm start,
  then an RL step runs and validates (the trainer's own tests take several steps)."""
  config = cli.load_config_file(os.path.join(ROOT, "configs", f"{name}.py") + ":smoke")
  with config.unlocked():
    config.trainer.total_steps = 1
  summary = trainer.train(config, str(tmp_path / name))
  assert summary["step"] == 1
  for tag in config.envs.keys():
    assert summary[f"train/{tag}/env_error"] == 0.0 and f"val/{tag}/success" in summary
  scalars = logging_utils.read_scalars(str(tmp_path / name))
  assert scalars["sft/loss"][-1][0] == 2  # the experts' demonstrations trained (smoke: 2 steps)
  for tag in {"countdown", "math"} & set(config.envs.keys()):  # one-turn answers: all right
    assert scalars[f"sft/{tag}/demo_success"][-1][1] == 1.0
  if "game2048" in config.envs:  # its own per-episode figure (Env.episode_metrics)
    assert summary["train/game2048/max_tile"] >= 2.0 and summary["val/game2048/max_tile"] >= 2.0

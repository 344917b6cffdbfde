"""The trainer end to end on the visual configs' `:smoke`: a tiny Qwen2.5-VL from scratch,
every turn's frame in its prompt and spliced again in the update.

One short run (module fixture) of configs/visual_sokoban_ppo.py; the FrozenLake config is only
built (the same code, another environment).
"""

import os

import pytest

from ragen_jax import logging_utils
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(name):
  return cli.load_config_file(os.path.join(ROOT, "configs", name) + ":smoke")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  c = config("visual_sokoban_ppo.py")
  c.trainer.total_steps = 2  # one validation (at step 2), one checkpoint
  workdir = str(tmp_path_factory.mktemp("visual"))
  return workdir, trainer.train(c, workdir)


def test_a_tiny_vl_model_trains_on_images(run):
  workdir, summary = run
  assert summary["step"] == 2
  # The update's first pass splices the rollout's frames: the sampler's probabilities again.
  assert summary["training/rollout_probs_diff_max"] < 1e-6
  scalars = logging_utils.read_scalars(workdir)
  for tag in ("train/visual_sokoban/success", "val/visual_sokoban/success", "actor/pg_loss"):
    assert tag in scalars, tag
  assert summary["prompt_length/mean"] > 9 * summary["train/num_turns"]  # the image tokens


def test_the_visual_configs_build():
  for name, env in (
      ("visual_sokoban_ppo.py", "visual_sokoban"),
      ("visual_frozenlake_ppo.py", "visual_frozenlake"),
  ):
    exp = schema.from_config(config(name))
    assert exp.model.preset == "tiny-vl" and not exp.model.warm_start
    assert [e.name for e in exp.envs] == [env]

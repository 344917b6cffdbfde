"""The trainer end to end on the visual configs' `:smoke`: a tiny Qwen2.5-VL from scratch,
every turn's frame in its prompt and spliced again in the update.

One short run (module fixture) of configs/visual_sokoban_ppo.py; the FrozenLake config is only
built (the same code, another environment).
"""

import json
import os

import pytest

from ragen_jax import logging_utils
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(name):
  return cli.load_config_file(os.path.join(ROOT, "configs", name) + ":smoke")


@pytest.fixture(scope="module", name="run")
def run_fixture(tmp_path_factory):
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
  # The collapse diagnostics ran on the image prompts (step 1; a random model's valid reasoning
  # may be rare, so only that they ran).
  assert "collapse/first_turn/num_samples" in scalars
  # The validation records carry each turn's frame, and the viewer page shows them.
  with open(os.path.join(workdir, "eval", "step_2.jsonl"), encoding="utf-8") as fp:
    records = [json.loads(line) for line in fp]
  assert records and all(len(r["turn_frames"]) == r["turns"] for r in records)
  with open(os.path.join(workdir, "viewer", "step_2.html"), encoding="utf-8") as fp:
    page = fp.read()
  assert all(uri in page for r in records for uri in r["turn_frames"])


def test_the_visual_configs_build():
  for name, env in (
      ("visual_sokoban_ppo.py", "visual_sokoban"),
      ("visual_frozenlake_ppo.py", "visual_frozenlake"),
  ):
    exp = schema.from_config(config(name))
    assert exp.model.preset == "tiny-vl" and not exp.model.warm_start
    assert [e.name for e in exp.envs] == [env]

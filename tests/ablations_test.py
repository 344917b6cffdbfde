"""experiments/ablations.py: every study's runs are valid experiments; commands; the report."""
import os
import sys

import pytest

from ragen_jax import logging_utils
from ragen_jax.train import experiment
from ragen_jax.train import launch_utils

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import ablations  # pylint: disable=g-import-not-at-top,wrong-import-position

ALL_RUNS = [(study, run) for study, runs in ablations.STUDIES.items() for run in runs]


def _typed(old, text):
  """A command-line value as the config field's type (what the config flag parser does)."""
  if isinstance(old, bool):
    assert text in ("True", "False"), text
    return text == "True"
  return type(old)(text) if old is not None else float(text)


@pytest.mark.parametrize("study,run", ALL_RUNS, ids=[f"{s}-{r.name}" for s, r in ALL_RUNS])
def test_every_run_is_a_valid_experiment_that_changes_what_it_names(study, run):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  config = launch_utils.load_config_file(os.path.join(root, run.config))
  for key, text in run.overrides:
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
      node = node[part]
    assert leaf in node, f"{study}/{run.name}: no config key {key}"
    node[leaf] = _typed(node[leaf], text)
  exp = experiment.from_config(config)   # raises ValueError on a bad combination
  assert exp.train_episodes > 0


def test_study_contents_match_ragens_ablations():
  names = lambda s: [r.name for r in ablations.STUDIES[s]]  # pylint: disable=unnecessary-lambda-assignment
  assert names("filtering") == ["top_p_1.0", "top_p_0.9", "top_p_0.5", "top_p_0.25", "top_k_25pct"]
  assert names("actions_per_turn") == [f"actions_{n}" for n in range(1, 7)]
  assert len(names("algorithms")) == 12      # 4 algorithms x 3 environments
  for run in ablations.STUDIES["group_size"]:  # a fixed batch of 32 episodes
    values = dict(run.overrides)
    assert int(values["rollout.group_size"]) * int(values["envs.sokoban.train_groups"]) == 32


def test_command_and_selection():
  run = ablations.STUDIES["kl"][1]
  cmd = ablations.command(run, "/tmp/w", steps=7, variant="smoke")
  assert cmd[1:4] == ["launch.py", "--config=configs/sokoban_ppo.py:smoke", "--workdir=/tmp/w"]
  assert "--config.ppo.use_kl_loss=True" in cmd and cmd[-1] == "--config.trainer.total_steps=7"
  assert [r.name for r in ablations.select("clip_higher", "clip_0.2_0.28")] == ["clip_0.2_0.28"]
  with pytest.raises(ValueError, match="has no run nope"):
    ablations.select("kl", "nope")
  with pytest.raises(ValueError, match="unknown study"):
    ablations.select("bogus")


def test_report_names_runs_and_tabulates_their_validations(tmp_path):
  runs = ablations.STUDIES["clip_higher"]
  workdirs = [str(tmp_path / r.name) for r in runs]
  for w, (start, end) in zip(workdirs, [(0.25, 0.5), (0.25, 0.125)]):
    with logging_utils.SummaryWriter(w) as writer:
      writer.scalars(0, {"val/success": start})
      for step in (1, 2):
        writer.scalars(step, {"train/success": end, "actor/entropy": 1.0,
                              "rollout/in_group_reward_std": 0.5, "timing_s/step": 3.0})
      writer.scalars(2, {"val/success": end})
  cmds = [ablations.command(r, w) for r, w in zip(runs, workdirs)]
  md = ablations.report("clip_higher", runs, cmds, workdirs, str(tmp_path / "out"))
  text = open(md).read()
  assert "python launch.py --config=configs/sokoban_ppo.py" in text
  # start 25%; gain = mean(start, end) - start, in points.
  assert "| clip_0.2_0.2 | 25.0% | 50.0% | +12.5 | 2 | 3 |" in text
  assert "| clip_0.2_0.28 | 25.0% | 12.5% | -6.2 | 2 | 3 |" in text
  assert os.path.getsize(tmp_path / "out" / "clip_higher.png") > 5000
  with pytest.raises(ValueError, match="no run has written events"):
    ablations.report("kl", ablations.STUDIES["kl"], cmds, [str(tmp_path / "x")] * 2,
                     str(tmp_path / "out"))

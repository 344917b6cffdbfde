"""experiments/ablations.py: every study's runs are valid experiments; commands; the report."""

import json
import os
import shutil
import sys

import pytest

from ragen_jax import logging_utils
from ragen_jax.config import schema

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import ablations  # pylint: disable=g-import-not-at-top,wrong-import-position


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


ALL_RUNS = [(study, run) for study, runs in ablations.STUDIES.items() for run in runs]


@pytest.mark.parametrize("study,run", ALL_RUNS, ids=[f"{s}-{r.name}" for s, r in ALL_RUNS])
def test_every_run_is_a_valid_experiment(study, run):
  exp = schema.from_config(ablations.run_config(run))  # raises ValueError on a bad combination
  assert exp.train_episodes > 0, study


def test_overrides_are_typed_and_unknown_keys_refused():
  config = ablations.run_config(
      ablations.Run(
          "x",
          "configs/sokoban_ppo.py",
          (("ppo.use_kl_loss", "True"), ("ppo.kl_coef", "0.001"), ("rollout.group_size", "4")),
      )
  )
  assert config.ppo.use_kl_loss is True and config.ppo.kl_coef == 0.001
  assert config.rollout.group_size == 4 and isinstance(config.rollout.group_size, int)
  with pytest.raises(ValueError, match="unknown config key 'ppo.nope'"):
    ablations.run_config(ablations.Run("x", "configs/sokoban_ppo.py", (("ppo.nope", "1"),)))
  with pytest.raises(ValueError, match="not a bool"):
    ablations.run_config(ablations.Run("x", "configs/sokoban_ppo.py", (("ppo.use_kl_loss", "1"),)))


def test_runs_that_change_nothing_share_the_default_run():
  shared = {
      (s, r.name)
      for s, r in ALL_RUNS
      if ablations.workdir_of(s, r, "R").startswith(os.path.join("R", "defaults"))
  }
  # The Sokoban PPO config already clips at 0.2 / 0.28 and has no KL (actions_2 fine-tunes
  # first, so it is not the default run); the algorithm study's plain PPO and GRPO runs are
  # their config files unchanged.
  assert shared == {("clip_higher", "clip_0.2_0.28"), ("kl", "no_kl")} | {
      ("algorithms", f"{env}_{algo}")
      for env in ("sokoban", "frozenlake", "bandit")
      for algo in ("ppo", "grpo")
  } | {("policy_losses", "sokoban_ppo"), ("policy_losses", "frozenlake_ppo")}
  kl, clip = ablations.STUDIES["kl"][0], ablations.STUDIES["clip_higher"][1]
  assert (
      ablations.workdir_of("kl", kl, "R")
      == ablations.workdir_of("clip_higher", clip, "R")
      == os.path.join("R", "defaults", "sokoban_ppo")
  )
  assert ablations.workdir_of("kl", kl, "R", steps=7, variant="smoke") == os.path.join(
      "R", "defaults", "sokoban_ppo_smoke_7steps"
  )
  kl_on = ablations.STUDIES["kl"][1]
  assert ablations.workdir_of("kl", kl_on, "R") == os.path.join("R", "kl", "kl_0.001")


def test_study_contents_match_ragens_ablations():
  names = lambda s: [r.name for r in ablations.STUDIES[s]]  # pylint: disable=unnecessary-lambda-assignment
  assert names("filtering") == ["top_p_1.0", "top_p_0.9", "top_p_0.5", "top_p_0.25", "top_k_25pct"]
  assert names("actions_per_turn") == [f"actions_{n}" for n in range(1, 7)]
  for n, run in enumerate(ablations.STUDIES["actions_per_turn"], start=1):
    config = ablations.run_config(run)  # demonstrations at the run's own cap, then RL
    assert (config.rollout.max_actions_per_turn, config.sft.steps) == (
        n,
        ablations.ACTIONS_SFT_STEPS,
    )
  assert len(names("algorithms")) == 12  # 4 algorithms x 3 environments
  # Policy losses: each env's PPO config, only the estimator and the loss differ per run.
  for env in ("sokoban", "frozenlake"):
    configs = {
        algo: ablations.run_config(
            next(r for r in ablations.STUDIES["policy_losses"] if r.name == f"{env}_{algo}")
        )
        for algo in ("ppo", "grpo", "gspo", "cispo")
    }
    picked = {
        a: (c.ppo.adv_estimator, c.ppo.policy_loss, c.ppo.clip_high) for a, c in configs.items()
    }
    assert picked == {
        "ppo": ("gae", "ppo", None),
        "grpo": ("grpo", "ppo", None),
        "gspo": ("grpo", "gspo", None),
        "cispo": ("grpo", "cispo", None),
    }
    plain = [c.to_dict() for c in configs.values()]
    for c in plain:
      del c["ppo"]["adv_estimator"], c["ppo"]["policy_loss"]
    assert all(c == plain[0] for c in plain), env
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
        writer.scalars(
            step,
            {
                "train/success": end,
                "actor/entropy": 1.0,
                "rollout/in_group_reward_std": 0.5,
                "timing_s/step": 3.0,
            },
        )
      writer.scalars(2, {"val/success": end})
  cmds = [ablations.command(r, w) for r, w in zip(runs, workdirs)]
  md = ablations.report("clip_higher", runs, cmds, workdirs, str(tmp_path / "out"))
  text = _read(md)
  assert "python launch.py --config=configs/sokoban_ppo.py" in text
  # start 25%; gain = mean(start, end) - start, in points.
  assert "| clip_0.2_0.2 | 25.0% | 50.0% | +12.5 | 2 | 3 |" in text
  assert "| clip_0.2_0.28 | 25.0% | 12.5% | -6.2 | 2 | 3 |" in text
  assert os.path.getsize(tmp_path / "out" / "clip_higher.png") > 5000
  # A run that has only just started (an events file, no scalars yet) is left out of the report.
  started = tmp_path / "started"
  logging_utils.SummaryWriter(str(started)).close()
  assert any(f.startswith("events.") for f in os.listdir(started))
  md = ablations.report(
      "clip_higher", runs, cmds, [workdirs[0], str(started)], str(tmp_path / "o2")
  )
  text = _read(md)
  assert "| clip_0.2_0.2 |" in text and "clip_0.2_0.28" not in text
  # Each run's scalars are saved beside the report: a run whose directory is gone is read from
  # them, with the same row; saved from another recipe (here 7 steps), they are ignored.
  shutil.rmtree(workdirs[1])
  md = ablations.report("clip_higher", runs, cmds, workdirs, str(tmp_path / "out"))
  text = _read(md)
  assert "| clip_0.2_0.28 | 25.0% | 12.5% | -6.2 | 2 | 3 |" in text
  assert "(their run directories were not here): clip_0.2_0.28." in text
  other = [ablations.command(r, w, steps=7) for r, w in zip(runs, workdirs)]
  text = _read(ablations.report("clip_higher", runs, other, workdirs, str(tmp_path / "out")))
  assert "| clip_0.2_0.2 |" in text and "clip_0.2_0.28" not in text
  with pytest.raises(ValueError, match="no run has written events"):
    ablations.report(
        "kl", ablations.STUDIES["kl"], cmds, [str(tmp_path / "x")] * 2, str(tmp_path / "out")
    )


def test_report_only_of_some_runs_keeps_the_study_whole(tmp_path, capsys):
  """--only limits training, not the report: the other runs come from their saved scalars."""
  runs, out = ablations.STUDIES["clip_higher"], str(tmp_path / "out")
  workdirs = [ablations.workdir_of("clip_higher", r, str(tmp_path / "R")) for r in runs]
  for w, end in zip(workdirs, (0.5, 0.125)):
    with logging_utils.SummaryWriter(w) as writer:
      writer.scalars(0, {"val/success": 0.25})
      writer.scalars(2, {"val/success": end, "timing_s/step": 3.0})
  ablations.report(
      "clip_higher", runs, [ablations.command(r, w) for r, w in zip(runs, workdirs)], workdirs, out
  )
  shutil.rmtree(workdirs[0])  # clip_0.2_0.2 now exists only as saved scalars
  assert (
      ablations.main(
          [
              "--study=clip_higher",
              "--only=clip_0.2_0.28",
              "--report_only",
              f"--runs={tmp_path / 'R'}",
              f"--out={out}",
          ]
      )
      == 0
  )
  text = _read(os.path.join(out, "clip_higher.md"))
  assert "| clip_0.2_0.2 | 25.0% | 50.0% | +12.5 | 2 | 3 |" in text
  assert "| clip_0.2_0.28 | 25.0% | 12.5% | -6.2 | 2 | 3 |" in text
  assert "were not here): clip_0.2_0.2." in text
  assert "--workdir=" in capsys.readouterr().out  # --only's commands were printed


def _validation(workdir, step, successes, valid):
  """A validation at `step`: its scalars and its trajectories, level seeds 100, 101, ..."""
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  with open(os.path.join(workdir, "eval", f"step_{step}.jsonl"), "w", encoding="utf-8") as f:
    for i, ok in enumerate(successes):
      f.write(json.dumps({"env": "sokoban", "seed": 100 + i, "success": ok}) + "\n")
  rate = sum(successes) / len(successes)
  return {"val/success": rate, "val/action_is_valid": valid}


def test_report_pairs_the_first_and_last_validation_by_level(tmp_path):
  runs = ablations.STUDIES["clip_higher"]  # two runs of one config: the first is the baseline
  workdirs, out = [str(tmp_path / r.name) for r in runs], str(tmp_path / "out")
  ends = ([True, True, True, True], [False, True, True, False])
  for workdir, end in zip(workdirs, ends):
    with logging_utils.SummaryWriter(workdir) as writer:
      writer.scalars(0, _validation(workdir, 0, [True, False, False, True], 0.9))
      writer.scalars(1, {"timing_s/step": 10.0})  # compiles: left out of the median
      for step, seconds in ((2, 3.0), (3, 5.0), (4, 4.0)):
        writer.scalars(step, {"timing_s/step": seconds})
      writer.scalars(4, _validation(workdir, 4, end, 0.75))
  cmds = [ablations.command(r, w) for r, w in zip(runs, workdirs)]
  # First run: per-level differences 0, 1, 1, 0: mean 0.5, sample std sqrt(1/3), SE sqrt(1/3) / 2.
  # Second run against the first's last validation: -1, 0, 0, -1: mean -0.5, the same SE; its own
  # gain: -1, 1, 1, -1: mean 0, sample std sqrt(4/3), SE sqrt(4/3) / 2.
  rows = (
      "| clip_0.2_0.2 | 50.0% (step 0) -> 100.0% (step 4) | +50.0 ± 28.9 |  | 90.0% -> 75.0% | 4.0 |",
      "| clip_0.2_0.28 | 50.0% (step 0) -> 50.0% (step 4) | +0.0 ± 57.7 | -50.0 ± 28.9 vs "
      "clip_0.2_0.2 | 90.0% -> 75.0% | 4.0 |",
  )
  text = _read(ablations.report("clip_higher", runs, cmds, workdirs, out))
  assert all(row in text for row in rows), text
  # The levels are saved with the scalars: the same rows without the runs' directories.
  for workdir in workdirs:
    shutil.rmtree(workdir)
  text = _read(ablations.report("clip_higher", runs, cmds, workdirs, out))
  assert all(row in text for row in rows), text

"""experiments/gpu_learn.py and the `gpu` variant it trains: the variant's sizes, the arms, the
paired gain against hand-worked numbers, the time limit (one SIGTERM, then SIGKILL), and the
whole pipeline at smoke size against its own files."""

import importlib
import json
import os
import sys
import textwrap

import numpy as np
import pytest

from ragen_jax.config import schema
from ragen_jax.config import variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import gpu_learn  # pylint: disable=g-import-not-at-top,wrong-import-position

sokoban_ppo = importlib.import_module("configs.sokoban_ppo")


def test_gpu_variant_samples_512_episodes_in_minibatches_of_64():
  config = sokoban_ppo.get_config("gpu")
  exp = schema.from_config(config)
  assert exp.train_episodes == 512 and exp.rollout.group_size == 16
  assert exp.train_episodes // exp.ppo.num_minibatches == 64
  assert 64 // exp.ppo.micro_batches == 16
  assert exp.trainer.pad_multiple == exp.rollout.max_context  # one train-step shape
  # The rest of the default run is kept: its algorithm, learning rates and validation levels.
  default = schema.from_config(sokoban_ppo.get_config())
  assert (exp.ppo.adv_estimator, exp.ppo.actor_lr, exp.ppo.filter_value) == (
      default.ppo.adv_estimator,
      default.ppo.actor_lr,
      default.ppo.filter_value,
  )
  assert exp.envs[0].val_groups == default.envs[0].val_groups
  with pytest.raises(ValueError, match="gpu sizes the tiny model"):
    variants.parse_variant("gpu,model=qwen2.5-0.5b")


def test_arms_parse_and_bad_ones_are_refused():
  arm = gpu_learn.parse_arm("grpo:ppo.adv_estimator=grpo,ppo.actor_lr=2e-4")
  assert arm == gpu_learn.Arm("grpo", (("ppo.adv_estimator", "grpo"), ("ppo.actor_lr", "2e-4")))
  assert gpu_learn.parse_arm("default:") == gpu_learn.Arm("default", ())
  for bad in ("noname", ":ppo.actor_lr=1", "a:ppo.actor_lr", "a/b:x=1"):
    with pytest.raises(ValueError):
      gpu_learn.parse_arm(bad)
  # Every default arm is a valid experiment.
  for text in gpu_learn.DEFAULT_ARMS:
    config = sokoban_ppo.get_config("gpu")
    for key, value in gpu_learn.parse_arm(text).overrides:
      section, field = key.split(".")
      config[section][field] = type(config[section][field])(value)
    schema.from_config(config)


def test_gain_is_paired_by_level():
  before = gpu_learn.Heldout({1: True, 2: False, 3: False, 4: True, 9: True})
  after = gpu_learn.Heldout({1: True, 2: True, 3: True, 4: False, 7: False})
  # Levels 1-4 are shared: differences 0, 1, 1, -1; mean 0.25; sample std sqrt(2.75 / 3).
  mean, se = gpu_learn.gain(before, after)
  assert mean == pytest.approx(25.0)
  assert se == pytest.approx(100 * np.sqrt(2.75 / 3) / 2)
  assert before.rate == pytest.approx(0.6)
  assert before.stderr == pytest.approx(np.sqrt(0.6 * 0.4 / 5))
  with pytest.raises(ValueError, match="share no level"):
    gpu_learn.gain(before, gpu_learn.Heldout({100: True}))


def test_last_checkpoint_ignores_steps_still_being_written(tmp_path):
  assert gpu_learn.last_checkpoint(str(tmp_path)) is None
  for name in ("0", "10", "20", "30.orbax-checkpoint-tmp-1"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert gpu_learn.last_checkpoint(str(tmp_path)) == 20


# A trainer's answer to SIGTERM: note it, finish the step (the driver keeps polling), exit 0.
_STOPPABLE = textwrap.dedent("""
    import signal, sys, time
    got = []
    def handle(signum, frame):
      got.append(signum)
      with open(sys.argv[1], "a") as f:
        f.write("TERM\\n")
    signal.signal(signal.SIGTERM, handle)
    while not got:
      time.sleep(0.05)
    time.sleep(1.5)
    """)


def test_time_limit_sends_one_sigterm_then_kills_what_ignores_it(tmp_path):
  marks = tmp_path / "marks"
  marks.write_text("")
  env = dict(os.environ)
  polite = gpu_learn.Job(
      "polite", [sys.executable, "-c", _STOPPABLE, str(marks)], str(tmp_path / "p.log"), env
  )
  stubborn = gpu_learn.Job(
      "stubborn",
      [
          sys.executable,
          "-c",
          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);" " time.sleep(60)",
      ],
      str(tmp_path / "s.log"),
      env,
  )  # yapf: disable
  codes = gpu_learn.wait_all([polite, stubborn], {"polite": 1.0, "stubborn": 1.0}, grace=2.0)
  assert codes["polite"] == 0
  assert marks.read_text().count("TERM") == 1  # a second SIGTERM aborts a trainer's save
  assert codes["stubborn"] == -9
  assert stubborn.seconds < 10


def test_pipeline_at_smoke_size(tmp_path):
  out, work = tmp_path / "out", tmp_path / "work"
  code = gpu_learn.main(
      [
          f"--out={out}",
          f"--workdir={work}",
          "--variant=smoke",
          "--levels=4",
          "--arm=a:ppo.actor_lr=2e-4",
          "--seconds=600",
      ]
  )  # yapf: disable
  assert code == 0
  data = json.loads((out / "learn.json").read_text())
  start = [json.loads(l) for l in (work / "heldout_start.jsonl").read_text().splitlines()]
  final = [json.loads(l) for l in (work / "heldout_a.jsonl").read_text().splitlines()]
  assert sorted(r["seed"] for r in start) == list(range(1_000_000, 1_000_004))
  assert data["start"]["success"] == pytest.approx(np.mean([r["success"] for r in start]))
  arm = data["arms"]["a"]
  assert arm["steps"] == 4  # the smoke run's last checkpoint
  assert arm["success"] == pytest.approx(np.mean([r["success"] for r in final]))
  after = {r["seed"]: r["success"] for r in final}
  by_hand = np.mean([after[r["seed"]] - r["success"] for r in start])
  assert arm["gain"] == pytest.approx(100 * by_hand)
  assert [k for k, _ in arm["val_success"]] == [0, 2, 4]
  assert arm["seconds"]["update"] > 0 and arm["seconds"]["gen_env"] > 0
  text = (out / "learn.md").read_text()
  assert "--config.ppo.actor_lr=2e-4" in text and "checkpoints/4" in text
  assert (out / "learn.png").stat().st_size > 10_000

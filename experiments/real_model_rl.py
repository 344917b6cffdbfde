"""The report of a real model's RL runs: held-out validity and success paired by level, the
training curve and the time split of each run.

  python -m experiments.real_model_rl RUN [RUN ...] [--out experiments/results/real_model_rl.md]

Each RUN is a workdir of `launch.py`; its `eval/step_N.jsonl` validations (the same levels at
every step) are compared with step 0's level by level: a level's reply is valid when RAGEN's
parser finds an answer whose every word is one of the level's actions (the names its system
message lists), and successful as the environment said. Gains are in points with the paired
standard error. The training curve is each step's `train/action_is_valid`, `train/success` and
the in-group reward spread, and the time split the mean `timing_s/*` of the steps after the first
(which compiles).
"""

import argparse
import glob
import json
import os
import re

import numpy as np

from experiments import gpu_learn
from ragen_jax import logging_utils
from ragen_jax.rollout import prompts

_ACTIONS = re.compile(r"Your available actions are:\n(.*)\n")
CURVE = ("train/action_is_valid", "train/success", "rollout/in_group_reward_std")
TIMES = ("timing_s/step", "timing_s/gen", "timing_s/update")


def valid_by_level(path: str, enable_think: bool) -> dict[int, bool]:
  """Level seed -> whether its (single) reply parsed to known actions only."""
  out = {}
  with open(path, encoding="utf-8") as fp:
    for line in fp:
      record = json.loads(line)
      messages = record["messages"]
      names = [n.strip() for n in _ACTIONS.search(messages[0]["content"]).group(1).split(",")]
      replies = [m["content"] for m in messages if m["role"] == "assistant"]
      ok = bool(replies)
      for reply in replies:
        parsed = prompts.parse_response(reply, enable_think, "||", 1)
        _, invalid = prompts.match_actions(parsed.actions, names)
        ok &= not prompts.turn_penalised(parsed, invalid)
      out[int(record["seed"])] = ok
  return out


def _paired(before: dict[int, bool], after: dict[int, bool]) -> tuple[float, float]:
  return gpu_learn.gain(gpu_learn.Heldout(before), gpu_learn.Heldout(after))


def report(run: str) -> str:
  with open(os.path.join(run, "config.json"), encoding="utf-8") as fp:
    config = json.load(fp)
  think = config["rollout"]["enable_think"]
  evals = sorted(
      glob.glob(os.path.join(run, "eval", "step_*.jsonl")),
      key=lambda p: int(re.search(r"step_(\d+)", p).group(1)),
  )
  lines = [f"### `{run}` (think block: {think})", ""]
  if evals:
    start_valid = valid_by_level(evals[0], think)
    start_success = gpu_learn.Heldout.read(evals[0]).success
    lines += [
        "| step | levels | valid | gain (paired SE) | success | gain (paired SE) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in evals:
      step = int(re.search(r"step_(\d+)", path).group(1))
      valid, success = valid_by_level(path, think), gpu_learn.Heldout.read(path).success
      dv, sv = _paired(start_valid, valid)
      ds, ss = _paired(start_success, success)
      lines.append(
          f"| {step} | {len(valid)} | {100 * np.mean(list(valid.values())):.1f}% | "
          f"{dv:+.1f} ({sv:.1f}) | {100 * np.mean(list(success.values())):.1f}% | "
          f"{ds:+.1f} ({ss:.1f}) |"
      )
  scalars = logging_utils.read_scalars(run)
  steps = [s for s, _ in scalars.get(CURVE[0], [])]
  lines += ["", "| step | " + " | ".join(CURVE) + " |", "| ---: |" + " ---: |" * len(CURVE)]
  series = [dict(scalars.get(tag, [])) for tag in CURVE]
  for step in steps:
    lines.append(
        f"| {step} | " + " | ".join(f"{s.get(step, float('nan')):.3f}" for s in series) + " |"
    )
  means = {
      tag: np.mean([v for s, v in scalars.get(tag, []) if s > 1]) for tag in TIMES if tag in scalars
  }
  lines += [
      "",
      "Seconds a step after the first: " + ", ".join(f"{k} {v:.0f}" for k, v in means.items()),
  ]
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("runs", nargs="+")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  text = "\n".join(report(run) for run in args.runs)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as fp:
      fp.write(text)
  print(text)


if __name__ == "__main__":
  main()

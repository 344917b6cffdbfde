r"""Does StarPO teach the tiny model Sokoban at accelerator scale? One command on one GPU:

  python -m experiments.gpu_learn --out=OUTDIR                        # ~7 minutes on one GPU
  python -m experiments.gpu_learn --out=OUTDIR --arm=grpo:ppo.adv_estimator=grpo --seconds=600

1. The starting policy (the shipped warm start) plays `--levels` held-out Sokoban levels, seeds
   from `--level_seed` (1,000,000: far from training's 10,000 + 32 a step and validation's
   123-186), at validation's temperature.
2. At the same time, one training run per `--arm` (`configs/sokoban_ppo.py:gpu`, PPO with
   StarPO-S filtering at 512 episodes a step, plus the arm's overrides), all from the same start
   and seeds. After `--seconds` each run still going gets one SIGTERM (a second would abort its
   save): it finishes its step, saves and exits (ragen_jax.train.stop_signals).
3. Each run's newest complete checkpoint, named by its step, plays the same held-out levels.
4. `OUT/learn.md` (the commands, held-out success before and after with the paired standard error
   of the gain, the validation curve on the 64 standard levels, training success, median seconds
   a step split into environments, decode and update), `OUT/learn.json` (the same numbers) and
   `OUT/learn.png` (the curves). The runs themselves stay in `--workdir`, where a run already
   there resumes.

Every process is a command of its own (`launch.py`, `python -m ragen_jax.evaluate`), printed and
recorded in the report so any of it can be rerun by hand. On one GPU they share its memory:
each gets 0.9/N of it unless XLA_PYTHON_CLIENT_MEM_FRACTION is set.
"""

import argparse
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ragen_jax import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/sokoban_ppo.py"
# Two learning rates from the same start: 1e-4 barely moved the policy at 64 episodes a step,
# 5e-4 broke the answer format within 5 steps (docs/experiments/learning_rate.md).
DEFAULT_ARMS = ("lr1e-4:ppo.actor_lr=1e-4", "lr3e-4:ppo.actor_lr=3e-4")
TARGET_POINTS = 15.0


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  overrides: Tuple[Tuple[str, str], ...]  # (dotted config key, value) as on the command line


def parse_arm(text: str) -> Arm:
  """`name:key=value,key=value` (no overrides: `name:`)."""
  name, colon, rest = text.partition(":")
  if not colon or not name or "/" in name:
    raise ValueError(f"--arm {text!r}: expected NAME:key=value[,key=value...]")
  pairs = []
  for item in filter(None, rest.split(",")):
    key, eq, value = item.partition("=")
    if not eq or not key:
      raise ValueError(f"--arm {text!r}: {item!r} is not key=value")
    pairs.append((key, value))
  return Arm(name, tuple(pairs))


def _config_flags(variant: str, overrides: Sequence[Tuple[str, str]]) -> List[str]:
  return [f"--config={CONFIG}:{variant}"] + [f"--config.{k}={v}" for k, v in overrides]


def heldout_overrides(levels: int, level_seed: int) -> List[Tuple[str, str]]:
  return [("envs.sokoban.val_groups", str(levels)), ("seed.val", str(level_seed))]


def train_command(arm: Arm, variant: str, workdir: str) -> List[str]:
  return [
      sys.executable,
      "launch.py",
      *_config_flags(variant, arm.overrides),
      f"--workdir={workdir}",
  ]


def eval_command(variant: str, heldout, output: str, checkpoint: Optional[str]) -> List[str]:
  return [
      sys.executable,
      "-m",
      "ragen_jax.evaluate",
      *_config_flags(variant, heldout),
      f"--output={output}",
      *([f"--checkpoint={checkpoint}"] if checkpoint else []),
  ]


class Job:
  """One command in its own process group, its output in a log file."""

  def __init__(self, name: str, command: List[str], log_path: str, env: Dict[str, str]):
    self.name, self.log_path = name, log_path
    self.started = time.monotonic()
    self.seconds = None
    self.stopped = False
    with open(log_path, "w", encoding="utf-8") as log:
      self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
          command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
      )
    print(f"[{name}] started: {shlex.join(command)}", flush=True)

  def poll(self) -> Optional[int]:
    code = self.proc.poll()
    if code is not None and self.seconds is None:
      self.seconds = time.monotonic() - self.started
      print(f"[{self.name}] exit {code} after {self.seconds:.0f} s", flush=True)
      if code:
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
          print("".join(log.readlines()[-30:]), flush=True)
    return code

  def stop(self) -> None:
    """SIGTERM to the command (the trainer finishes its step, saves and exits 0)."""
    if self.proc.poll() is None and not self.stopped:  # a second SIGTERM aborts the save
      self.stopped = True
      print(f"[{self.name}] time is up: SIGTERM", flush=True)
      self.proc.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)


def wait_all(
    jobs: Sequence[Job], stop_after: Optional[Dict[str, float]] = None, grace: float = 300.0
) -> Dict[str, int]:
  """Waits for every job; a job named in `stop_after` gets SIGTERM that many seconds after it
  started, and SIGKILL `grace` seconds later if it is still running. Returns the exit codes."""
  stop_after = stop_after or {}
  while True:
    running = [job for job in jobs if job.poll() is None]
    if not running:
      return {job.name: job.proc.returncode for job in jobs}
    now = time.monotonic()
    for job in running:
      if job.name in stop_after:
        age = now - job.started
        if age >= stop_after[job.name] + grace:
          print(f"[{job.name}] no exit {grace:.0f} s after SIGTERM: SIGKILL", flush=True)
          job.kill()
        elif age >= stop_after[job.name]:
          job.stop()
    time.sleep(0.5)


@dataclasses.dataclass(frozen=True)
class Heldout:
  """Success on the held-out levels, by level seed."""

  success: Dict[int, bool]

  @classmethod
  def read(cls, path: str) -> "Heldout":
    with open(path, encoding="utf-8") as f:
      records = [json.loads(line) for line in f if line.strip()]
    return cls({int(r["seed"]): bool(r["success"]) for r in records})

  @property
  def rate(self) -> float:
    return float(np.mean(list(self.success.values())))

  @property
  def stderr(self) -> float:
    p, n = self.rate, len(self.success)
    return math.sqrt(p * (1 - p) / n)


def gain(before: Heldout, after: Heldout) -> Tuple[float, float]:
  """(mean, standard error) of after - before over the levels both played, in points: paired
  by level, so the levels' own difficulty cancels."""
  seeds = sorted(set(before.success) & set(after.success))
  if not seeds:
    raise ValueError("the two evaluations share no level")
  d = np.array([float(after.success[s]) - float(before.success[s]) for s in seeds])
  se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
  return 100 * float(d.mean()), 100 * float(se)


def last_checkpoint(workdir: str) -> Optional[int]:
  """The newest step directory under `workdir/checkpoints` (orbax writes a step under a
  temporary name and renames it when complete), or None."""
  directory = os.path.join(workdir, "checkpoints")
  steps = [int(d) for d in os.listdir(directory) if d.isdigit()] if os.path.isdir(directory) else []
  return max(steps, default=None)


def _in(points, lo: int, hi: int) -> List[float]:
  return [v for k, v in points if lo <= k <= hi]


TIMINGS = ("step", "gen", "gen_env", "gen_decode", "update")


def arm_summary(run: plot.Run, step: int) -> Dict[str, object]:
  """The numbers of one run's events up to `step` (its evaluated checkpoint): median seconds
  of steps 2.. (the first compiles), the validation curve and training success, the mean of
  each window of 10 steps."""
  s = run.scalars
  train = s.get("train/success", [])
  median = lambda xs: float(np.median(xs)) if xs else None
  return dict(
      steps=step,
      seconds=({key: median(_in(s.get(f"timing_s/{key}", []), 2, step)) for key in TIMINGS}),
      val_success=[(int(k), float(v)) for k, v in s.get("val/success", []) if k <= step],
      train_success=[
          (lo, min(lo + 9, step), float(np.mean(window)))
          for lo in range(1, step + 1, 10)
          if (window := _in(train, lo, lo + 9))
      ],
  )


def _num(x: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
  return "n/a" if x is None else f"{scale * x:.{digits}f}"


def report(args, arms, commands, start: Heldout, finals, summaries, wall) -> Tuple[str, dict]:
  """learn.md's text and learn.json's record."""
  data = dict(
      levels=len(start.success),
      level_seed=args.level_seed,
      seconds=args.seconds,
      wall_seconds=round(wall, 1),
      commands=commands,
      start=dict(success=start.rate, stderr=start.stderr),
      arms={},
  )
  lines = [
      "# StarPO on Sokoban at accelerator scale (`experiments/gpu_learn.py`)",
      "",
      f"Held-out levels: {len(start.success)} (seeds from {args.level_seed}), at validation's "
      f"temperature. Training stopped after {args.seconds:.0f} s; wall time {wall:.0f} s in all.",
      "Seconds: medians over steps 2.. (the first compiles); rollout = environments + decode + "
      "host.",
      "",
      "| policy | step | held-out success % | gain (points, paired SE) | s/step | rollout s | "
      "environments s | decode s | update s |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
      f"| starting policy | 0 | {_num(start.rate, 100, 1)} ± {100 * start.stderr:.1f} | | | | | "
      "| |",
  ]
  for arm in arms:
    summary = summaries.get(arm.name)
    final = finals.get(arm.name)
    if summary is None:
      lines.append(f"| {arm.name} | | no checkpoint | | | | | | |")
      data["arms"][arm.name] = None
      continue
    record = dict(summary)
    cells = "not evaluated | "
    if final is not None:
      g, se = gain(start, final)
      cells = f"{_num(final.rate, 100, 1)} ± {100 * final.stderr:.1f} | {g:+.1f} ± {se:.1f}"
      record.update(success=final.rate, stderr=final.stderr, gain=g, gain_se=se)
    t = summary["seconds"]
    lines.append(
        f"| {arm.name} | {summary['steps']} | {cells} | "
        + " | ".join(_num(t[k]) for k in TIMINGS)
        + " |"
    )
    data["arms"][arm.name] = record
  done = [a for a in arms if data["arms"][a.name]]
  lines += ["", "Validation success (%) on the validation levels (`seed.val`), by step:", ""]
  for arm in done:
    curve = data["arms"][arm.name]["val_success"]
    lines.append(f"- {arm.name}: " + ", ".join(f"{k}: {100 * v:.1f}" for k, v in curve))
  lines += ["", "Training success (%) at temperature 1, mean of each 10 steps:", ""]
  for arm in done:
    windows = data["arms"][arm.name]["train_success"]
    lines.append(
        f"- {arm.name}: " + ", ".join(f"{lo}-{hi}: {100 * v:.1f}" for lo, hi, v in windows)
    )
  gains = [r["gain"] for r in data["arms"].values() if r and "gain" in r]
  best = max(gains, default=None)
  verdict = "none" if best is None else f"{best:+.1f}"
  verdict += " (met)." if best is not None and best >= TARGET_POINTS else " (not met)."
  lines += [
      "",
      f"Target: +{TARGET_POINTS:.0f} points on the held-out levels; best gain: {verdict}",
      "",
      "Commands:",
      "",
      "```bash",
      *(shlex.join(c) for c in commands),
      "```",
  ]
  return "\n".join(lines) + "\n", data


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m experiments.gpu_learn", description=__doc__.splitlines()[0]
  )
  parser.add_argument("--out", required=True, help="where learn.md, learn.json, learn.png go")
  parser.add_argument(
      "--workdir",
      default="/tmp/gpu_learn",
      help="the runs and their logs (a run already there resumes)",
  )
  parser.add_argument(
      "--arm",
      action="append",
      default=None,
      help=f"NAME:key=value,... (repeatable; default {' '.join(DEFAULT_ARMS)})",
  )
  parser.add_argument("--seconds", type=float, default=300.0, help="training time per run")
  parser.add_argument("--levels", type=int, default=512, help="held-out levels")
  parser.add_argument("--level_seed", type=int, default=1_000_000, help="first held-out seed")
  parser.add_argument("--variant", default="gpu", help=f"{CONFIG}'s variant (smoke for tests)")
  args = parser.parse_args(argv)
  try:
    arms = [parse_arm(a) for a in (args.arm or DEFAULT_ARMS)]
  except ValueError as e:
    parser.error(str(e))
  if len({a.name for a in arms}) != len(arms):
    parser.error("two --arm share a name")
  os.makedirs(args.out, exist_ok=True)
  os.makedirs(args.workdir, exist_ok=True)
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / (len(arms) + 1):.2f}")
  heldout = heldout_overrides(args.levels, args.level_seed)
  w = lambda *p: os.path.join(os.path.abspath(args.workdir), *p)
  t0 = time.monotonic()

  start_cmd = eval_command(args.variant, heldout, w("heldout_start.jsonl"), None)
  train_cmds = {a.name: train_command(a, args.variant, w("runs", a.name)) for a in arms}
  jobs = [Job("start", start_cmd, w("start.log"), env)]
  jobs += [Job(name, cmd, w(f"{name}.log"), env) for name, cmd in train_cmds.items()]
  codes = wait_all(jobs, stop_after={a.name: args.seconds for a in arms})

  # The newest complete checkpoint of each run is what is evaluated, named by its step.
  steps = {a.name: last_checkpoint(w("runs", a.name)) for a in arms}
  final_cmds = {
      name: eval_command(
          args.variant,
          heldout,
          w(f"heldout_{name}.jsonl"),
          w("runs", name, "checkpoints", str(step)),
      )
      for name, step in steps.items()
      if step
  }
  finals_jobs = [Job(f"{n}-final", c, w(f"{n}-final.log"), env) for n, c in final_cmds.items()]
  final_codes = wait_all(finals_jobs)
  if codes["start"] != 0:
    print("error: the starting policy's evaluation failed", file=sys.stderr)
    return 1
  start = Heldout.read(w("heldout_start.jsonl"))
  finals = {
      n: Heldout.read(w(f"heldout_{n}.jsonl")) for n in final_cmds if final_codes[f"{n}-final"] == 0
  }
  runs = {n: plot.load_runs([w("runs", n)])[0] for n in final_cmds}
  summaries = {n: arm_summary(runs[n], steps[n]) for n in final_cmds}
  commands = [start_cmd, *train_cmds.values(), *final_cmds.values()]
  text, data = report(args, arms, commands, start, finals, summaries, time.monotonic() - t0)
  with open(os.path.join(args.out, "learn.md"), "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.join(args.out, "learn.json"), "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  if runs:
    try:
      tags = {t for r in runs.values() for t in r.scalars}
      figure = plot.figure(list(runs.values()), plot.select_panels(None, tags), smooth_k=5)
      figure.savefig(os.path.join(args.out, "learn.png"), dpi=110)
    except (ImportError, plot.PlotError) as e:
      print(f"no figure: {e}", file=sys.stderr)
  print(text, flush=True)
  failed = [n for n, c in {**codes, **final_codes}.items() if c != 0]
  return 1 if failed or len(finals) < len(arms) else 0


if __name__ == "__main__":
  sys.exit(main())

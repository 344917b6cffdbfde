r"""RAGEN's studies at tiny-model scale: each study trains a set of runs and writes a table and a plot.

  python experiments/ablations.py --study=filtering                 # trains (or resumes) every run
  python experiments/ablations.py --study=algorithms --steps=30 --only=sokoban_grpo,sokoban_drgrpo
  python experiments/ablations.py --study=kl --dry_run              # the commands, nothing run
  python experiments/ablations.py --study=filtering --report_only   # table + plot of finished runs
  python experiments/ablations.py --study=algorithms --parallel=12   # one GPU or many cores

Every run is one `launch.py` command (printed and recorded in the report, so any row can be rerun by
hand) in `<runs>/<study>/<run>` (relative paths are taken from the repository root). A run whose
overrides leave its config file as it is (clip_0.2_0.28 and no_kl are both the default Sokoban
PPO run) trains once, in `<runs>/defaults/<config>`, and every study that has it reads it
there; so do not start two studies that share it while it is still training. With
`--parallel=N`, N runs train at once (on one GPU each gets 0.9/N of its memory unless
XLA_PYTHON_CLIENT_MEM_FRACTION is set). An interrupted study resumes where it stopped, since each run
resumes from its checkpoints and finished runs are skipped by the trainer. The report goes to
`experiments/results/<study>.md` (the commands, then `python -m ragen_jax.plot`'s before/after
table) and `experiments/results/<study>.png` (success, reward std, entropy and MI curves); each
run's scalars are kept in `experiments/results/<study>/<run>.json`, so a run trained elsewhere or
earlier is still reported when its directory is gone, and a study can be trained in parts
(`--only` limits the training, not the report).

Studies (RAGEN v1 / RAGEN-2 ablations; `shared/reference/ragen.md` §8):
  algorithms        PPO vs GRPO vs Dr.GRPO vs DAPO-style (clip-higher + dropping zero-variance
                    groups) on Sokoban, FrozenLake and the Bandit
  filtering         rollout filtering: top-p 1.0 (none), 0.9, 0.5, 0.25 and top-k 25% (Sokoban PPO)
  clip_higher       clip_high 0.2 vs 0.28 (Sokoban PPO)
  kl                no KL vs a k1 KL loss of 0.001 to the starting policy (Sokoban PPO)
  actions_per_turn  1 to 6 actions per turn (Sokoban PPO), each after 100 fine-tuning steps on
                    demonstrations that use that many actions a turn
  group_size        responses per prompt 4, 8, 16 at 32 episodes per step (Sokoban PPO)
  policy_losses     PPO, GRPO, GSPO and CISPO (`ppo.policy_loss`) from the Sokoban and FrozenLake
                    PPO configs, only the estimator and the loss changed

Below the table the report pairs each run's first and last validation by level (gain and its
standard error over levels), with the valid-action rate and the median step time.
"""

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ragen_jax.config import cli
from ragen_jax.config import drift

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: str  # configs/<file>.py
  overrides: Tuple[Tuple[str, str], ...] = ()  # (dotted key, value) as on the command line


ACTIONS_SFT_STEPS = 100  # actions_per_turn: demonstration steps at the run's cap before RL


def _sokoban(name, **overrides) -> Run:
  return Run(name, "configs/sokoban_ppo.py", tuple((k, str(v)) for k, v in overrides.items()))


def _algorithms() -> List[Run]:
  runs = []
  for env in ("sokoban", "frozenlake", "bandit"):
    grpo = f"configs/{env}_grpo.py"
    runs += [
        Run(f"{env}_ppo", f"configs/{env}_ppo.py"),
        Run(f"{env}_grpo", grpo),
        # Dr.GRPO: no std normalisation, sequence sums divided by a constant length.
        Run(
            f"{env}_drgrpo",
            grpo,
            (("ppo.adv_estimator", "drgrpo"), ("ppo.agg_mode", "seq-mean-token-sum-norm")),
        ),
        # DAPO-style: decoupled clip 0.2 / 0.28 and dynamic sampling (groups whose rewards all
        # agree carry no signal and are dropped), token-mean loss, no KL.
        Run(
            f"{env}_dapo",
            grpo,
            (
                ("ppo.clip_low", "0.2"),
                ("ppo.clip_high", "0.28"),
                ("ppo.filter_include_zero", "False"),
                ("ppo.agg_mode", "token-mean"),
            ),
        ),
    ]
  return runs


def _policy_losses() -> List[Run]:
  """PPO, GRPO, GSPO and CISPO from each env's PPO config: only the estimator and the loss change.

  GSPO and CISPO take GRPO's group-relative advantages (GSPO is defined with them); each loss
  keeps its own clip range and aggregation (`ppo.policy_loss`'s defaults), the rest (warm start,
  rollouts, filter, learning rate, minibatches, seeds) stays the config's.
  """
  runs = []
  for env in ("sokoban", "frozenlake"):
    config, grpo = f"configs/{env}_ppo.py", ("ppo.adv_estimator", "grpo")
    runs += [
        Run(f"{env}_ppo", config),
        Run(f"{env}_grpo", config, (grpo,)),
        Run(f"{env}_gspo", config, (grpo, ("ppo.policy_loss", "gspo"))),
        Run(f"{env}_cispo", config, (grpo, ("ppo.policy_loss", "cispo"))),
    ]
  return runs


STUDIES: Dict[str, List[Run]] = {
    "algorithms": _algorithms(),
    "policy_losses": _policy_losses(),
    "filtering": [
        _sokoban("top_p_1.0", **{"ppo.filter_strategy": "top_p", "ppo.filter_value": 1.0}),
        *(
            _sokoban(
                f"top_p_{p}",
                **{
                    "ppo.filter_strategy": "top_p",
                    "ppo.filter_value": p,
                    "ppo.filter_include_zero": False,
                },
            )
            for p in (0.9, 0.5, 0.25)
        ),
        _sokoban(
            "top_k_25pct",
            **{
                "ppo.filter_strategy": "top_k",
                "ppo.filter_value": 0.25,
                "ppo.filter_include_zero": False,
            },
        ),
    ],
    "clip_higher": [
        _sokoban("clip_0.2_0.2", **{"ppo.clip_high": 0.2}),
        _sokoban("clip_0.2_0.28", **{"ppo.clip_high": 0.28}),
    ],
    "kl": [
        _sokoban("no_kl", **{"ppo.use_kl_loss": False, "ppo.kl_coef": 0.0}),
        _sokoban(
            "kl_0.001", **{"ppo.use_kl_loss": True, "ppo.kl_coef": 0.001, "ppo.kl_type": "k1"}
        ),
    ],
    # The shipped warm start was fine-tuned on replies of at most 2 actions and never writes a
    # third, so a higher cap alone changes nothing. Every run (2 included) first fine-tunes
    # ACTIONS_SFT_STEPS more steps on demonstrations that use its own cap, then trains.
    "actions_per_turn": [
        _sokoban(
            f"actions_{n}", **{"rollout.max_actions_per_turn": n, "sft.steps": ACTIONS_SFT_STEPS}
        )
        for n in range(1, 7)
    ],
    # RAGEN's "responses per prompt" at a fixed batch: groups x responses = 32 episodes.
    "group_size": [
        _sokoban(
            f"responses_{n}", **{"rollout.group_size": n, "envs.sokoban.train_groups": 32 // n}
        )
        for n in (4, 8, 16)
    ],
}


def _typed(kind: type, text: str):
  """A command-line value as the config field's type (as ml_collections' config flag parses it);
  `kind` is the field's declared type, which a None placeholder (`ppo.agg_mode`) keeps too."""
  if kind is bool:
    if text not in ("True", "False"):
      raise ValueError(f"{text!r} is not a bool (True or False)")
    return text == "True"
  return kind(text)


def _load(run: Run, variant: str):
  return cli.load_config_file(os.path.join(ROOT, run.config) + (f":{variant}" if variant else ""))


def _apply(config, run: Run):
  """`config` with `run`'s overrides set in place (unknown keys refused as launch.py refuses them)."""
  cli.check_overrides(config, [f"--config.{k}={v}" for k, v in run.overrides])
  for key, text in run.overrides:
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = _typed(node.get_type(leaf), text)
  return config


def run_config(run: Run, variant: str = ""):
  """The ConfigDict that `run`'s command trains: its config file with its overrides applied."""
  return _apply(_load(run, variant), run)


def workdir_of(study: str, run: Run, runs_root: str, steps: int = 0, variant: str = "") -> str:
  """`<runs_root>/<study>/<run>`, or the shared `<runs_root>/defaults/<config>` when the run's
  overrides change nothing (one training serves every study that has the default run): the
  policy loss's settings compared as in force (0.28 set where the loss's default is 0.28 trains
  alike)."""
  config = _load(run, variant)
  default = drift.in_force(config.to_dict())
  if drift.in_force(_apply(config, run).to_dict()) != default:
    return os.path.join(runs_root, study, run.name)
  name = os.path.splitext(os.path.basename(run.config))[0]
  name += (f"_{variant}" if variant else "") + (f"_{steps}steps" if steps else "")
  return os.path.join(runs_root, "defaults", name)


def command(run: Run, workdir: str, steps: int = 0, variant: str = "") -> List[str]:
  """The launch.py command line of `run` (steps 0 keeps the config's own length)."""
  spec = run.config + (f":{variant}" if variant else "")
  args = [sys.executable, "launch.py", f"--config={spec}", f"--workdir={workdir}"]
  args += [f"--config.{k}={v}" for k, v in run.overrides]
  if steps:
    args.append(f"--config.trainer.total_steps={steps}")
  return args


def select(study: str, only: str = "") -> List[Run]:
  if study not in STUDIES:
    raise ValueError(f"unknown study {study!r}; valid: {', '.join(STUDIES)}")
  runs = STUDIES[study]
  if only:
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = sorted(set(names) - {r.name for r in runs})
    if unknown:
      raise ValueError(
          f"study {study!r} has no run {', '.join(unknown)}; its runs: "
          f"{', '.join(r.name for r in runs)}"
      )
    runs = [r for r in runs if r.name in names]
  return runs


def train(runs: Sequence[Run], commands: Sequence[List[str]], parallel: int = 1) -> None:
  """Runs the commands, `parallel` at a time; a failing run is reported and the others go on."""
  env = dict(os.environ)
  if parallel > 1:
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / parallel:.3f}")
  pending, active = list(zip(runs, commands)), []
  while pending or active:
    while pending and len(active) < parallel:
      run, cmd = pending.pop(0)
      print(" ".join(shlex.quote(a) for a in cmd), flush=True)
      active.append((run, subprocess.Popen(cmd, cwd=ROOT, env=env)))
    time.sleep(0.5)
    for run, proc in [a for a in active if a[1].poll() is not None]:
      active.remove((run, proc))
      if proc.returncode:
        print(
            f"run {run.name} exited with status {proc.returncode}; the report covers the " "others",
            file=sys.stderr,
            flush=True,
        )


def _recipe(cmd: Sequence[str]) -> List[str]:
  """What a run's command trains (config, overrides, steps): its arguments less the workdir."""
  return [a for a in cmd[2:] if not a.startswith("--workdir=")]


def save_scalars(path: str, cmd: Sequence[str], scalars, levels=None) -> None:
  """A finished run's scalars, with the recipe they came from, as JSON next to the report;
  `levels` ({step: {level seed: success}}, see `read_levels`) goes with them."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  saved = {"recipe": _recipe(cmd), "scalars": scalars, "levels": levels or {}}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(saved, f, separators=(",", ":"))


def load_levels(path: str) -> Dict[int, Dict[int, bool]]:
  """The per-level successes saved at `path` by `save_scalars` ({} when there are none)."""
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    levels = json.load(f).get("levels", {})
  return {int(s): {int(k): bool(v) for k, v in by.items()} for s, by in levels.items()}


def read_levels(workdir: str, scalars) -> Dict[int, Dict[int, bool]]:
  """Success by level seed at the run's first and last validations (`eval/step_<s>.jsonl`), for
  the validations whose trajectories are there (one episode a level: `rollout.val_group_size`
  1, so a level's seed names one episode)."""
  steps = [s for s, _ in scalars.get("val/success", [])]
  levels = {}
  for step in sorted({steps[0], steps[-1]}) if steps else ():
    path = os.path.join(workdir, "eval", f"step_{step}.jsonl")
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
      levels[step] = {int(r["seed"]): bool(r["success"]) for r in records}
  return levels


def paired_table(names: Sequence[str], configs: Sequence[str], scalars, levels) -> str:
  """Each run's first against its last validation, paired by level, with the valid-action rate
  (`val/action_is_valid`) at both and the median step time after the first (compiling) step.
  A run's last validation is also set against that of the first run of its config file (the
  study's baseline for that environment), paired by level."""
  # Run as `python experiments/ablations.py`, the repository root is not on the path.
  sys.path.insert(0, ROOT)
  from experiments import gpu_learn  # pylint: disable=g-import-not-at-top

  lines = [
      "| run | val success, first -> last | gain (points, paired SE) | last against the "
      "config's first run (points, paired SE) | valid actions, first -> last | s/step (median) |",
      "| --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  baselines = {}  # config file -> (run name, its last validation)
  for name, config, s, by_step in zip(names, configs, scalars, levels):
    if len(by_step) < 2:
      continue
    (first, start), (last, end) = sorted(by_step.items())[0], sorted(by_step.items())[-1]
    start, end = gpu_learn.Heldout(start), gpu_learn.Heldout(end)
    mean, se = gpu_learn.gain(start, end)
    against = ""
    if config in baselines:
      base_name, base = baselines[config]
      diff, diff_se = gpu_learn.gain(base, end)
      against = f"{diff:+.1f} ± {diff_se:.1f} vs {base_name}"
    else:
      baselines[config] = (name, end)
    valid = [v for _, v in s.get("val/action_is_valid", [])]
    valid_text = f"{100 * valid[0]:.1f}% -> {100 * valid[-1]:.1f}%" if valid else "n/a"
    timing = [v for k, v in s.get("timing_s/step", []) if k >= 2]
    per_step = f"{np.median(timing):.1f}" if timing else "n/a"
    lines.append(
        f"| {name} | {100 * start.rate:.1f}% (step {first}) -> {100 * end.rate:.1f}% (step "
        f"{last}) | {mean:+.1f} ± {se:.1f} | {against} | {valid_text} | {per_step} |"
    )
  return "\n".join(lines) if len(lines) > 2 else ""


def load_scalars(path: str, cmd: Sequence[str]):
  """The scalars saved at `path`, or None when there are none or they came from another recipe."""
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  if saved.get("recipe") != _recipe(cmd):
    print(f"ignoring {path}: saved from {saved.get('recipe')}, not {_recipe(cmd)}", file=sys.stderr)
    return None
  return {tag: [(int(s), float(v)) for s, v in points] for tag, points in saved["scalars"].items()}


def report(
    study: str,
    runs: Sequence[Run],
    commands: Sequence[List[str]],
    workdirs: Sequence[str],
    out_dir: str,
) -> str:
  """Writes <out_dir>/<study>.md and .png from the runs' events; returns the markdown path.

  Each run's scalars are also saved to <out_dir>/<study>/<run>.json, and a run whose workdir is
  gone (trained on another machine, or in an earlier session) is reported from that file, so a
  study can be trained in parts. A file saved from other overrides or steps is ignored.
  """
  from ragen_jax import logging_utils, plot  # pylint: disable=g-import-not-at-top

  os.makedirs(out_dir, exist_ok=True)
  loaded, used, from_saved, levels, configs = [], [], [], [], []
  for run, cmd, workdir in zip(runs, commands, workdirs):
    workdir = os.path.join(ROOT, workdir)  # relative ones from the repository root
    saved = os.path.join(out_dir, study, f"{run.name}.json")
    # A run that has only just started has an events file but no scalars yet: left out.
    scalars = logging_utils.read_scalars(workdir) if os.path.isdir(workdir) else {}
    if scalars:
      levels.append(read_levels(workdir, scalars))
      save_scalars(saved, cmd, scalars, levels[-1])
    else:
      scalars = load_scalars(saved, cmd)
      if not scalars:
        continue
      levels.append(load_levels(saved))
      from_saved.append(run.name)
    loaded.append(plot.Run(name=run.name, workdir=workdir, scalars=scalars))
    used.append(cmd)
    configs.append(run.config)
  if not loaded:
    raise ValueError(f"study {study!r}: no run has written events yet")
  png = os.path.join(out_dir, f"{study}.png")
  panels = plot.select_panels(None, {t for run in loaded for t in run.scalars})
  plot.figure(loaded, panels, smooth_k=3, title=f"ablation: {study}").savefig(png, dpi=100)
  lines = [f"# Ablation: {study}", "", "Commands (from the repository root):", "", "```bash"]
  lines += [" ".join(shlex.quote(a) for a in ["python", *c[1:]]) for c in used]
  lines += ["```", ""]
  if from_saved:
    lines += [
        f"Read from the scalars saved in `{study}/` (their run directories were not "
        f"here): {', '.join(from_saved)}.",
        "",
    ]
  lines += [plot.table(loaded), ""]
  paired = paired_table([r.name for r in loaded], configs, [r.scalars for r in loaded], levels)
  if paired:
    lines += ["Paired by level (the first and the last validation play the same levels):", ""]
    lines += [paired, ""]
  lines += [f"![{study}]({os.path.basename(png)})", ""]
  md = os.path.join(out_dir, f"{study}.md")
  with open(md, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return md


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--study", required=True, choices=sorted(STUDIES))
  p.add_argument("--only", default="", help="comma-separated run names of the study")
  p.add_argument("--steps", type=int, default=0, help="training steps (0: each config's own)")
  p.add_argument("--variant", default="", help="config variant, e.g. smoke")
  p.add_argument("--runs", default="runs/ablations", help="parent of the run directories")
  p.add_argument("--out", default=os.path.join(ROOT, "experiments", "results"))
  p.add_argument("--dry_run", action="store_true", help="print the commands only")
  p.add_argument("--report_only", action="store_true", help="no training: report what exists")
  p.add_argument("--parallel", type=int, default=1, help="runs training at once")
  args = p.parse_args(argv)
  # --only limits the training, not the report: the report covers the whole study, the other
  # runs coming from their directories or their saved scalars, so a study trained in parts
  # keeps every row.
  runs = select(args.study)
  chosen = {r.name for r in select(args.study, args.only)}
  workdirs = [workdir_of(args.study, r, args.runs, args.steps, args.variant) for r in runs]
  commands = [command(r, w, args.steps, args.variant) for r, w in zip(runs, workdirs)]
  picked = [(r, c) for r, c in zip(runs, commands) if r.name in chosen]
  if args.dry_run or args.report_only:
    print("\n".join(" ".join(shlex.quote(a) for a in cmd) for _, cmd in picked))
  else:
    train([r for r, _ in picked], [c for _, c in picked], max(1, args.parallel))
  if args.dry_run:
    return 0
  print("wrote", report(args.study, runs, commands, workdirs, args.out))
  return 0


if __name__ == "__main__":
  sys.exit(main())

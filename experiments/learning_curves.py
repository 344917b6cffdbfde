r"""Learning curves and the before/after table of training runs, from their TensorBoard events.

  python experiments/learning_curves.py runs/sokoban_ppo runs/bandit_grpo --out=curves.png

For each run: validation success over steps (step 0 = the fine-tuned starting point), training
success, and the table row BENCHMARKS.md records: start, mean of the last three evaluations,
the gain in points, steps and wall time. Needs matplotlib (the `[dev]` extra).
"""
import argparse
import os

import numpy as np

from ragen_jax import logging_utils


def summarise(workdir: str) -> dict:
  scalars = logging_utils.read_scalars(workdir)
  val = scalars.get("val/success", [])
  if not val:
    raise ValueError(f"{workdir} has no val/success events")
  last3 = [v for _, v in val[-3:]]
  wall = sum(v for _, v in scalars.get("timing_s/step", []))
  return dict(run=os.path.basename(os.path.normpath(workdir)), start=val[0][1],
              last3=float(np.mean(last3)), gain_points=100 * (np.mean(last3) - val[0][1]),
              steps=val[-1][0], rl_wall_s=wall, scalars=scalars)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", default="curves.png")
  args = parser.parse_args()
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  runs = [summarise(w) for w in args.workdirs]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for r in runs:
    steps, values = zip(*r["scalars"]["val/success"])
    axes[0].plot(steps, values, marker="o", label=r["run"])
    if "train/success" in r["scalars"]:
      steps, values = zip(*r["scalars"]["train/success"])
      axes[1].plot(steps, values, alpha=0.8, label=r["run"])
  axes[0].set(title="validation success (step 0: fine-tuned start)", xlabel="step",
              ylabel="success", ylim=(0, 1))
  axes[1].set(title="training success", xlabel="step", ylim=(0, 1))
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(args.out, dpi=110)
  print("| run | val success at start | mean of last 3 evals | gain (points) | steps | RL wall s |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  for r in runs:
    print(f"| {r['run']} | {r['start']:.3f} | {r['last3']:.3f} | {r['gain_points']:+.1f} | "
          f"{r['steps']} | {r['rl_wall_s']:.0f} |")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

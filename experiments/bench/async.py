"""Training steps with rollouts one step ahead (trainer.async_rollout) against synchronous ones.

    python experiments/bench/async.py [--steps 5] [--sleep-ms 50] [--rollout-devices 4]
        [--groups 2] [--group-size 4] [--turns 3]

On 8 simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set here
unless given), one process trains the same config three times from the shipped warm start:
  sync    every device in one data-parallel mesh; each step rolls out, then updates;
  split   the first --rollout-devices play the rollouts, the rest train, one after the other
          (max_staleness 0: each rollout waits for the newest weights);
  async   the same split, the rollout of step s+1 playing (its environments stepping) while step
          s trains (max_staleness 1, TIS).
split / async is the overlap's own gain; sync / split what the split itself costs or saves
(simulated devices share the cores: fewer of them in the update can be faster here, where on
real accelerators they would be slower).
The environment is `host_envs.HostFrozenLake`: non-slippery FrozenLake on the host that waits
--sleep-ms in every reset and step (an environment behind I/O, a simulator, a server), on the
thread pool. --groups x --group-size episodes per step, up to --turns turns each, in a
768-token context padded whole (one compiled update); no collapse diagnostics.

Each figure is the median `timing_s/step` over the steps after the first two (compilation) and
before the last (which validates). Prints the machine, a markdown table (step seconds, rollout
and update seconds, the split runs' weight copies) and the ratios.
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# pylint: disable=wrong-import-position
import jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the environment's entry, experiments.bench.host_envs

from ragen_jax import logging_utils
from ragen_jax.config import cli
from ragen_jax.config import sections as cs
from ragen_jax.train import trainer

# pylint: enable=wrong-import-position

ENTRY = "experiments.bench.host_envs:HostFrozenLake"


def config(args, async_rollout: bool, max_staleness: int = 1):
  cfg = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py"))
  with cfg.unlocked():
    cfg.envs = dict(
        lake=cs.env(
            entry=ENTRY,
            options=dict(sleep_s=args.sleep_ms / 1000),
            train_groups=args.groups,
            val_groups=8,
        )
    )
    cfg.rollout.group_size = args.group_size
    cfg.rollout.max_turns = args.turns
    cfg.rollout.max_context = 768  # the `:smoke` sizes: one compiled update
    cfg.trainer.pad_multiple = 768
    cfg.diagnostics.compute_freq = 0  # timed steps without the collapse metrics
    cfg.trainer.total_steps = args.steps
    cfg.trainer.eval_every = args.steps
    cfg.trainer.save_every = args.steps
    cfg.trainer.async_rollout = async_rollout
    cfg.trainer.max_staleness = max_staleness
    cfg.mesh.rollout_devices = args.rollout_devices if async_rollout else 0
    cfg.ppo.rollout_correction = "tis" if async_rollout and max_staleness else "none"
  return cfg


def timings(workdir: str, steps: int):
  """{metric: median over steps 3 .. steps-1} of the step's wall-clock figures."""
  scalars = logging_utils.read_scalars(workdir)
  kept = range(3, steps)
  out = {}
  for name in ("timing_s/step", "timing_s/gen", "timing_s/update", "timing_s/weight_sync"):
    values = [v for s, v in scalars.get(name, []) if s in kept]
    out[name] = statistics.median(values) if values else float("nan")
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--sleep-ms", type=float, default=50.0)
  parser.add_argument("--rollout-devices", type=int, default=4)
  parser.add_argument("--groups", type=int, default=2)
  parser.add_argument("--group-size", type=int, default=4)
  parser.add_argument("--turns", type=int, default=3)
  args = parser.parse_args()
  if args.steps < 4:
    parser.error("--steps must be >= 4 (two compile, one validates)")
  print(
      f"machine: {platform.machine()}, {os.cpu_count()} cores, {jax.device_count()} simulated "
      f"{jax.devices()[0].platform} devices; jax {jax.__version__}; {args}"
  )
  rows = {}
  with tempfile.TemporaryDirectory() as root:
    for name, on, stale in (("sync", False, 1), ("split", True, 0), ("async", True, 1)):
      workdir = os.path.join(root, name)
      trainer.train(config(args, on, stale), workdir)
      rows[name] = timings(workdir, args.steps)
  print("\n| run | step s | rollout s | update s | weight copy s |")
  print("|---|---|---|---|---|")
  for name, t in rows.items():
    print(
        f"| {name} | {t['timing_s/step']:.2f} | {t['timing_s/gen']:.2f} | "
        f"{t['timing_s/update']:.2f} | {t['timing_s/weight_sync']:.3f} |"
    )
  step = {name: t["timing_s/step"] for name, t in rows.items()}
  print(f"\nsync / async step time: {step['sync'] / step['async']:.2f}x")
  print(f"split / async (the overlap alone): {step['split'] / step['async']:.2f}x")


if __name__ == "__main__":
  main()

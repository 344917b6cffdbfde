r"""How noisy is one validation, and does a run's gain hold on other levels?

  python -m experiments.validation_noise                                 # the shipped warm start
  python -m experiments.validation_noise runs/sokoban_ppo/checkpoints/25 runs/other   # and these

The trainer measures learning as validation success on 64 fixed levels, sampled at temperature 0.5.
That number moves for two reasons besides learning: the sampling key (the same policy on the same
levels solves a different share with other samples) and the choice of the 64 levels. For the
config's starting policy and every given training checkpoint (a run's workdir for its latest step,
or one `checkpoints/<step>` directory), this prints success on the default levels under
`--keys` sampling keys (seed.init, from which validation draws its key: the spread from sampling
alone) and on `--level_sets` x 64 other levels (seeds seed.val + 64 j, j = 1 ..; disjoint from the
training seeds), each with its standard error. Used in experiments/README.md.
"""

import argparse
import math
from typing import Dict, List

from ragen_jax import evaluate
from ragen_jax.config import cli


def _success(config, model, tok, init: int, val: int) -> float:
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.seed.init, config.seed.val = init, val
  return evaluate.evaluate(config, model=model, tokenizer=tok)["val/success"]


def measure(config, model, tok, keys: int, level_sets: int) -> Dict[str, float]:
  """Success under `keys` sampling keys (default levels) and on `level_sets` other level sets."""
  init, val, groups = config.seed.init, config.seed.val, config.envs.sokoban.val_groups
  by_key = [_success(config, model, tok, init + i, val) for i in range(keys)]
  by_set = [_success(config, model, tok, init, val + groups * j) for j in range(1, level_sets + 1)]
  mean = lambda xs: sum(xs) / len(xs)
  std = lambda xs: math.sqrt(sum((x - mean(xs)) ** 2 for x in xs) / max(len(xs) - 1, 1))
  p = mean(by_set)
  return {
      "default": by_key[0],
      "keys_mean": mean(by_key),
      "keys_std": std(by_key),
      "keys_min": min(by_key),
      "keys_max": max(by_key),
      "other_levels": p,
      "other_levels_se": math.sqrt(p * (1 - p) / (groups * level_sets)),
      "other_sets_std": std(by_set),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("checkpoints", nargs="*", help="training runs or checkpoints/<step> dirs")
  parser.add_argument("--config", default="configs/sokoban_ppo.py")
  parser.add_argument("--keys", type=int, default=8, help="sampling keys on the default levels")
  parser.add_argument("--level_sets", type=int, default=8, help="other sets of 64 levels")
  args = parser.parse_args(argv)
  config = cli.load_config_file(args.config)
  if list(config.envs.keys()) != ["sokoban"]:
    raise ValueError(f"{args.config}: a Sokoban-only config is expected, got {list(config.envs)}")
  rows: List[str] = []
  for name in ["start", *args.checkpoints]:
    model, tok, _ = evaluate.load_policy(config, None if name == "start" else name)
    m = {k: 100 * v for k, v in measure(config, model, tok, args.keys, args.level_sets).items()}
    rows.append(
        f"| {name} | {m['default']:.1f} | {m['keys_mean']:.1f} ± {m['keys_std']:.1f} "
        f"({m['keys_min']:.1f}-{m['keys_max']:.1f}) | {m['other_levels']:.1f} ± "
        f"{m['other_levels_se']:.1f} | {m['other_sets_std']:.1f} |"
    )
    print(rows[-1], flush=True)
  groups = config.envs.sokoban.val_groups
  print(
      f"\n| policy | default levels, default key | default levels, {args.keys} keys: mean ± std "
      f"(range) | {args.level_sets} x {groups} other levels ± s.e. | std between the other "
      f"sets |\n| --- | ---: | ---: | ---: | ---: |"
  )
  print("\n".join(rows))


if __name__ == "__main__":
  main()

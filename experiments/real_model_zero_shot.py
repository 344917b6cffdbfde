"""A pretrained chat model on every environment with no training, beside the tiny warm start
and random play, on the same held-out levels.

  python -m ragen_jax.models.fetch smollm2-135m-instruct
  python -m experiments.real_model_zero_shot [--only sokoban,frozenlake] \
      [--out experiments/results/real_model_zero_shot]

For each environment's config (`CONFIGS`) it plays its first validation levels (seeds
`seed.val` onwards; training draws from `seed.train` = 10000 onwards, so none was ever trained
on), one episode each at RAGEN's validation temperature (0.5), three ways:
  smollm2  SmolLM2-135M-Instruct from the fetched GGUF (`configs/<env>.py:smollm2`: its own chat
           template, RAGEN's prompts and format);
  tiny     the config's own starting policy: the 1.1M-parameter warm start, fine-tuned on
           Sokoban, FrozenLake and Bandit demonstrations only;
  random   uniformly random answers of the right form (`experiments.sokoban_action_quality`'s
           random play for the grid environments, `experiments.text_random_play`'s for the text
           ones), 5 plays a level.
Writes `<out>.md` (the table), `<out>/<env>_<arm>.json` (every validation metric) and the
model arms' trajectories `<out>/<env>_<arm>.jsonl`. An arm whose JSON exists is not run again.
"""

import argparse
import json
import os
import time

import numpy as np

from experiments import sokoban_action_quality
from experiments import text_random_play
from ragen_jax import evaluate
from ragen_jax.config import cli
from ragen_jax.envs.text.code_env import CodeEnv
from ragen_jax.envs.text.countdown import Countdown
from ragen_jax.envs.text.math_env import MathEnv
from ragen_jax.envs.text.search_qa import SearchQA
from ragen_jax.envs.text.sudoku import Sudoku

# environment -> (its config, validation levels played). A 135M model decodes up to 100 tokens a
# turn, each step reading every row's growing cache, on 2 cores: Sokoban and the single-turn
# environments play 32 levels, the other multi-turn ones 16 (2048: the config's 8-move
# full-context variant).
CONFIGS = {
    "sokoban": ("configs/sokoban_ppo.py", 32),
    "frozenlake": ("configs/frozenlake_ppo.py", 16),
    "bandit": ("configs/bandit_ppo.py", 32),
    "2048": ("configs/game2048_ppo.py:full", 16),
    "countdown": ("configs/countdown_grpo.py", 32),
    "math": ("configs/math_ppo.py", 16),
    "sudoku": ("configs/sudoku_ppo.py", 16),
    "search": ("configs/search_ppo.py", 16),
    "code": ("configs/code_grpo.py", 32),
}
ARMS = ("smollm2", "tiny", "random")
RANDOM_PLAYS = 5
# The validation metrics the table shows: (metric, column, format).
COLUMNS = (
    ("val/success", "success", "{:.1%}"),
    ("val/action_is_valid", "valid turns", "{:.1%}"),
    ("val/format_penalty", "format penalty / episode", "{:.2f}"),
    ("val/response_length", "reply tokens / episode", "{:.0f}"),
    ("val/context_truncated", "cut by context", "{:.0%}"),
)


def _text_random(env_name: str, levels: int, seed: int) -> dict:
  """Random play of a text environment (text_random_play's answers and turn budgets)."""
  games = {
      "countdown": (Countdown(), text_random_play.countdown_answer, 1),
      "math": (MathEnv(), lambda env, rng: str(rng.randint(0, 100)), 3),
      "sudoku": (Sudoku(size=4, max_actions_per_turn=2), text_random_play.sudoku_answer, 5),
      "code": (CodeEnv(split="test"), text_random_play.code_answer, 1),
      "search": (SearchQA(split="val", max_search_results=1), text_random_play.search_answer, 4),
  }
  env, answer, turns = games[env_name]
  success, mean_return = text_random_play.play(env, answer, levels, seed, RANDOM_PLAYS, turns)
  return {"val/success": success, "val/return": mean_return}


def run_arm(env_name: str, arm: str, out_dir: str) -> dict:
  """The arm's validation metrics (read back when already run)."""
  config_spec, levels = CONFIGS[env_name]
  path = os.path.join(out_dir, f"{env_name}_{arm}_{levels}.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as fp:
      return json.load(fp)
  spec = config_spec
  if arm == "smollm2":
    spec += ",smollm2" if ":" in spec else ":smollm2"
  config = cli.load_config_file(spec)
  for section in config.envs.values():
    section.val_groups = levels
  start = time.time()
  if arm == "random":
    if env_name in ("sokoban", "frozenlake", "bandit", "2048"):
      wins = sokoban_action_quality.random_play_success(
          spec, RANDOM_PLAYS, env_name=next(iter(config.envs.values())).name, levels=levels
      )
      metrics = {"val/success": float(np.mean(wins))}
    else:
      metrics = _text_random(env_name, levels, config.seed.val)
  else:
    metrics = evaluate.evaluate(config, output=path.replace(".json", ".jsonl"))
  metrics = {k: float(v) for k, v in metrics.items() if np.isscalar(v)}
  metrics["seconds"], metrics["levels"] = time.time() - start, levels
  with open(path, "w", encoding="utf-8") as fp:
    json.dump(metrics, fp, indent=1, sort_keys=True)
  return metrics


def table(results: dict) -> str:
  lines = [
      f"Held-out levels: the first validation levels of each config (random play: {RANDOM_PLAYS} "
      "plays a level). Columns after success are the model arms' own.",
      "",
      "| environment | levels | arm | " + " | ".join(c[1] for c in COLUMNS) + " | seconds |",
      "| --- | ---: | --- | " + " | ".join("---:" for _ in COLUMNS) + " | ---: |",
  ]
  for env_name, arms in results.items():
    for arm, m in arms.items():
      cells = [fmt.format(m[key]) if key in m else "" for key, _, fmt in COLUMNS]
      lines.append(
          f"| {env_name} | {m['levels']:.0f} | {arm} | "
          + " | ".join(cells)
          + f" | {m['seconds']:.0f} |"
      )
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--only", default="", help="comma-separated environments (default: all)")
  parser.add_argument("--arms", default=",".join(ARMS))
  parser.add_argument("--out", default="experiments/results/real_model_zero_shot")
  args = parser.parse_args()
  names = [n for n in args.only.split(",") if n] or list(CONFIGS)
  os.makedirs(args.out, exist_ok=True)
  results = {}
  for env_name in names:
    results[env_name] = {}
    for arm in args.arms.split(","):
      results[env_name][arm] = run_arm(env_name, arm, args.out)
      print(env_name, arm, json.dumps({k: results[env_name][arm].get(k) for k, *_ in COLUMNS}))
  with open(args.out + ".md", "w", encoding="utf-8") as fp:
    fp.write(table(results))
  print(table(results))


if __name__ == "__main__":
  main()

"""Random play on RAGEN's text environments: the floor a trained policy is measured against.

  python -m experiments.text_random_play [--levels 64] [--seed 123] [--plays 20] \
      [--sudoku_rewards ragen|dense]

Plays the validation levels (seeds `seed .. seed + levels - 1`, the configs' `seed.val`) with a
uniformly random answer of the right form: Countdown, the given numbers in a random order joined
by random operators (no parentheses); math, a random whole number from 0 to 100 per attempt;
Sudoku (4x4), a random number in a random empty cell per placement, as many placements as the
config's budget (5 turns of 2), under RAGEN's rewards or the dense scheme (`--sudoku_rewards`).
Code (the generated tasks' held-out split, the config's validation), a function of the right
name returning one of 0, [], '' or its first argument, at most 2 plays a level (every answer
runs 5 sandboxed tests). SearchQA (the shipped encyclopedia's validation questions, the config's
1 result a search), a search for the question's text, then an answer drawn from what it shows: a
passage title, a year or yes / no, uniformly.
Prints each environment's success rate and mean return over `plays` plays of every level.
"""

import argparse
import random
import re

import numpy as np

from ragen_jax.envs.text.code_env import CodeEnv
from ragen_jax.envs.text.countdown import Countdown
from ragen_jax.envs.text.math_env import MathEnv
from ragen_jax.envs.text.search_qa import SearchQA
from ragen_jax.envs.text.sudoku import format_action
from ragen_jax.envs.text.sudoku import Sudoku


def countdown_answer(env: Countdown, rng: random.Random) -> str:
  numbers = list(env.numbers)
  rng.shuffle(numbers)
  text = str(numbers[0])
  for n in numbers[1:]:
    text += f" {rng.choice('+-*/')} {n}"
  return text


def code_answer(env: CodeEnv, rng: random.Random) -> str:
  value = rng.choice(["0", "[]", "''", "args[0]"])
  return f"def {env.problem.func_name}(*args):\n    return {value}"


def sudoku_answer(env: Sudoku, rng: random.Random) -> str:
  empty = [(r, c) for r in range(env.size) for c in range(env.size) if not env.board[r][c]]
  r, c = rng.choice(empty)
  return format_action(r + 1, c + 1, rng.randint(1, env.size))


def search_answer(env: SearchQA, rng: random.Random) -> str:
  if env.searches_done == 0:
    return f"search[{env.item.question}]"
  shown = env.search(env.item.question)
  candidates = re.findall(r'^"(.+)"$', shown, re.MULTILINE) + re.findall(r"\b1\d{3}\b", shown)
  return f"finish[{rng.choice(candidates + ['yes', 'no'])}]"


def play(env, answer, levels: int, seed: int, plays: int, turns: int):
  rng = random.Random(0)
  success, returns = [], []
  for level in range(seed, seed + levels):
    for _ in range(plays):
      env.reset(level)
      total, done, won = 0.0, False, False
      for _ in range(turns):
        _, reward, done, info = env.step(answer(env, rng))
        total += reward
        won = won or bool(info.get("success"))
        if done:
          break
      success.append(won)
      returns.append(total)
  return float(np.mean(success)), float(np.mean(returns))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--levels", type=int, default=64)
  parser.add_argument("--seed", type=int, default=123)
  parser.add_argument("--plays", type=int, default=20)
  parser.add_argument("--sudoku_rewards", choices=("ragen", "dense"), default="ragen")
  args = parser.parse_args()
  games = {
      "countdown": (Countdown(), countdown_answer, 1),
      "math": (MathEnv(), lambda env, rng: str(rng.randint(0, 100)), 3),
      "sudoku": (
          Sudoku(size=4, max_actions_per_turn=2, reward_scheme=args.sudoku_rewards),
          sudoku_answer,
          10,
      ),
      "code": (CodeEnv(split="test"), code_answer, 1),
      "search": (
          SearchQA(split="val", max_search_results=1),
          search_answer,
          4,
      ),
  }
  code_plays = min(args.plays, 2)
  for name, (env, answer, turns) in games.items():
    plays = code_plays if name == "code" else args.plays
    success, mean_return = play(env, answer, args.levels, args.seed, plays, turns)
    print(f"{name}: random play success {success:.1%}, mean return {mean_return:.3f}")


if __name__ == "__main__":
  main()

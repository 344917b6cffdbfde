"""Random play on RAGEN's text environments: the floor a trained policy is measured against.

  python -m experiments.text_random_play [--levels 64] [--seed 123] [--plays 20]

Plays the validation levels (seeds `seed .. seed + levels - 1`, the configs' `seed.val`) with a
uniformly random answer of the right form: Countdown, the given numbers in a random order joined
by random operators (no parentheses); math, a random whole number from 0 to 100 per attempt.
Prints each environment's success rate and mean return over `plays` plays of every level.
"""

import argparse
import random

import numpy as np

from ragen_jax.envs.countdown import Countdown
from ragen_jax.envs.math_env import MathEnv


def countdown_answer(env: Countdown, rng: random.Random) -> str:
  numbers = list(env.numbers)
  rng.shuffle(numbers)
  text = str(numbers[0])
  for n in numbers[1:]:
    text += f" {rng.choice('+-*/')} {n}"
  return text


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
  args = parser.parse_args()
  games = {
      "countdown": (Countdown(), countdown_answer, 1),
      "math": (MathEnv(), lambda env, rng: str(rng.randint(0, 100)), 3),
  }
  for name, (env, answer, turns) in games.items():
    success, mean_return = play(env, answer, args.levels, args.seed, args.plays, turns)
    print(f"{name}: random play success {success:.1%}, mean return {mean_return:.3f}")


if __name__ == "__main__":
  main()

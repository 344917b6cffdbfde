"""A text environment with free-text answers: guess the hidden number, told higher or lower.

Train it: python launch.py --config=configs/custom_env.py
"""

import random

from ragen_jax import envs


class GuessNumber(envs.TextEnv):
  """One episode: a hidden whole number in [low, high]; every wrong guess gets a hint."""

  instruction = (
      "Guess the hidden whole number. After each wrong guess you are told whether it is higher "
      "or lower. Answer with one number, like <answer>3</answer>."
  )

  def __init__(self, low: int = 1, high: int = 8):
    self.low, self.high = low, high
    self.target = low

  def reset(self, seed: int) -> str:
    self.target = random.Random(seed).randint(self.low, self.high)  # same seed, same number
    return f"The number is between {self.low} and {self.high}."

  def step(self, action: str):
    try:
      guess = int(action)
    except ValueError:  # free text: anything may arrive; say so and let the agent retry
      return "That is not a whole number.", 0.0, False, {"action_is_valid": False}
    if guess == self.target:
      return "Correct!", 1.0, True, {"success": True}
    hint = "higher" if guess < self.target else "lower"
    return f"{guess} is wrong: the number is {hint}.", 0.0, False, {"action_is_effective": True}

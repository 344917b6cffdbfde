"""Small deterministic text environments for the HTTP environment tests.

A module of its own (not the test file) so `python -m ragen_jax.envs.serve
text_env_fixtures:Counter` can import it in a subprocess without pytest or hypothesis.
"""

import math
import random
import time

import numpy as np

from ragen_jax.envs import text


class GuessNumber(text.TextEnv):
  """Free-text guessing; observations and info echo the answer, so any unicode is visible."""

  max_actions_per_turn = 1

  def __init__(self, low: int = 1, high: int = 50, max_guesses: int = 5):
    self.low, self.high, self.max_guesses = low, high, max_guesses
    self.target = self.guesses = 0

  def reset(self, seed):
    rng = random.Random(seed)
    self.target = rng.randint(self.low, self.high)
    self.guesses = 0
    # Depends on the episode: the server must read it after reset.
    self.instruction = f"Guess a number between {self.low} and {self.high} (game {seed % 97})."
    return f"You have {self.max_guesses} guesses."

  def step(self, action):
    self.guesses += 1
    out_of_guesses = self.guesses >= self.max_guesses
    info = {"echo": action, "guesses": self.guesses, "history": [action, len(action)]}
    try:
      guess = int(action.strip())
    except ValueError:
      info.update(action_is_valid=False, action_is_effective=False, success=False)
      return f"Not a number: {action}", -0.1, out_of_guesses, info
    success = guess == self.target
    info.update(action_is_valid=True, action_is_effective=True, success=success)
    if success:
      return "Correct!", 1.0, True, info
    hint = "higher" if guess < self.target else "lower"
    return f"{guess}: go {hint}.", -abs(guess - self.target) / 100.0, out_of_guesses, info


class Counter(text.TextEnv):
  """A finite vocabulary: count up to `limit`."""

  instruction = "Reach the limit by counting up."
  action_names = ("inc", "dec", "stop")
  max_actions_per_turn = 2

  def __init__(self, limit: int = 3):
    self.limit = limit
    self.value = 0

  def reset(self, seed):
    self.value = seed % 2
    return f"value {self.value}"

  def step(self, action):
    if action == "stop":
      return f"stopped at {self.value}", 0.0, True, {"success": False}
    self.value += 1 if action == "inc" else -1
    done = self.value >= self.limit
    return f"value {self.value}", float(done), done, {"success": done}


class Faulty(text.TextEnv):
  """Raises in `reset` (seed 13) or `step` ("explode"); fine otherwise."""

  def reset(self, seed):
    if seed == 13:
      raise KeyError("unlucky seed")
    return "ready"

  def step(self, action):
    if action == "explode":
      raise ValueError(f"boom on {action!r}")
    return f"ok {action}", 0.0, False, {}


class Odd(text.TextEnv):
  """What a buggy environment may return: non-finite rewards, non-string observations, numpy
  values and non-string keys in info."""

  REWARDS = (math.nan, math.inf, -math.inf, np.float32(0.25))
  OBSERVATIONS = (None, 7, ["a", 1], "fine")
  seed = 0

  def reset(self, seed):
    self.seed = seed % len(self.REWARDS)
    return self.OBSERVATIONS[self.seed]

  def step(self, action):
    info = {"nan": math.nan, "np_bool": np.bool_(True), "arr": np.arange(3), 5: "int key"}
    return self.OBSERVATIONS[self.seed], self.REWARDS[self.seed], np.bool_(True), info


# ---------------------------------------------------------------------------------------------
# Host pool tests (tests/envs_host_pool_test.py): importable, so mode="process" workers can
# unpickle them.


class PoolWalk(text.TextEnv):
  """Deterministic: walk up to `goal`; every kind of info, and stepping after done raises.

  Actions: "up" (+1, effective), "stay" (-0.1, not effective), "junk" (-0.5, invalid, not
  effective), "bare" (0.25, info None: the defaults), "np" (NumPy reward, done and info).
  """

  action_names = ("up", "stay", "junk", "bare", "np")
  max_actions_per_turn = 3

  def __init__(self, goal: int = 4):
    self.goal = goal
    self.pos = 0
    self.done = True
    self.instruction = ""

  def reset(self, seed):
    self.pos = seed % 3
    self.done = False
    self.instruction = f"Walk from {self.pos} to {self.goal}."
    return f"at {self.pos}"

  def step(self, action):
    if self.done:
      raise RuntimeError("stepped after done")
    info = {}
    if action == "up":
      self.pos += 1
      reward, info = 1.0, {"action_is_effective": True}
    elif action == "stay":
      reward, info = -0.1, {"action_is_effective": False}
    elif action == "junk":
      reward, info = -0.5, {"action_is_valid": False, "action_is_effective": False}
    elif action == "bare":
      reward, info = 0.25, None
    else:
      reward = np.float32(0.5)
      info = {"action_is_valid": np.bool_(True), "action_is_effective": np.bool_(False)}
    self.done = self.pos >= self.goal
    if info is not None:
      info["success"] = self.done
    done = np.bool_(self.done) if action == "np" else self.done
    return f"at {self.pos} after {action}", reward, done, info


class PoolFaulty(text.TextEnv):
  """Misbehaves on request. Reset: seed -1 raises, -2 returns an int, -3 hangs. Step: "raise",
  "hang" (sleeps `hang_s`), "nan", "inf", "str_reward", "int_obs", "list_out", "five",
  "bad_info", "bad_done", "slow" (sleeps `slow_s`); anything else is fine."""

  closed = []  # ids of closed instances (mode="thread" tests read it)

  def __init__(self, hang_s: float = 30.0, slow_s: float = 2.0, close_raises: bool = False):
    self.hang_s, self.slow_s, self.close_raises = hang_s, slow_s, close_raises

  def reset(self, seed):
    if seed == -1:
      return 1 // (seed + 1)
    if seed == -2:
      return 42
    if seed == -3:
      time.sleep(self.hang_s)
    return f"seed {seed}"

  def step(self, action):
    good = (f"did {action}", 1.0, False, {})
    if action == "raise":
      return 1 / 0
    if action == "hang":
      time.sleep(self.hang_s)
    if action == "slow":
      time.sleep(self.slow_s)
    bad = {
        "nan": (good[0], math.nan, False, {}),
        "inf": (good[0], -math.inf, False, {}),
        "str_reward": (good[0], "1.0", False, {}),
        "int_obs": (7, 1.0, False, {}),
        "list_out": "not a tuple",
        "five": good + (False,),
        "bad_info": (good[0], 1.0, False, "info"),
        "bad_done": (good[0], 1.0, "yes", {}),
    }
    return bad.get(action, good)

  def close(self):
    PoolFaulty.closed.append(id(self))
    if self.close_raises:
      raise OSError("close failed")


class PoolNoisyAttributes(text.TextEnv):
  """Malformed optional attributes: reset succeeds, the pool must reject the Start."""

  def __init__(self, which: str = "action_names"):
    self.which = which

  def reset(self, seed):
    if self.which == "action_names":
      self.action_names = "up"  # a str, not a sequence of names
    elif self.which == "max_actions_per_turn":
      self.max_actions_per_turn = 0
    else:
      self.instruction = 5
    return "start"

  def step(self, action):
    return "obs", 0.0, False, {}


class PoolExpert(PoolWalk):
  """PoolWalk with an expert: the moves up to the goal; with goal 99, an episode that starts at
  position 0 returns a malformed plan."""

  def expert(self):
    if self.pos == 0 and self.goal == 99:
      return "up"  # not (answers, thought)
    return ["up"] * (self.goal - self.pos), f"{self.goal - self.pos} to go."

"""The gymnasium adapter against gymnasium itself: same seeds, same actions, same episodes."""

import functools
import sys
import types

import gymnasium
from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

from ragen_jax.envs.bridges import gymnasium as gym_bridge
from ragen_jax.envs.bridges.gymnasium import from_gymnasium

# Built-in envs and their action names in gymnasium's index order.
BUILTINS = {
    "FrozenLake-v1": ("Left", "Down", "Right", "Up"),
    "Taxi-v4": ("South", "North", "East", "West", "Pickup", "Dropoff"),
    "CliffWalking-v1": ("Up", "Right", "Down", "Left"),
    "Blackjack-v1": ("Stick", "Hit"),
}


def _grid_position(text, symbols="PX√"):
  rows = text.split("\n")
  found = [(r, c) for r, row in enumerate(rows) for c, s in enumerate(row) if s in symbols]
  assert len(found) == 1, text
  return found[0]


def _check_text(env_id, env, text, obs):
  """The text shows gymnasium's raw state."""
  core = env.env.unwrapped
  if env_id == "FrozenLake-v1":
    assert _grid_position(text) == divmod(int(obs), core.ncol)
  elif env_id == "CliffWalking-v1":
    assert _grid_position(text, "P√") == divmod(int(obs), 12)
    assert text.split("\n")[3] in ("PCCCCCCCCCCG", "_CCCCCCCCCCG", "_CCCCCCCCCC√")
  elif env_id == "Taxi-v4":
    row, col, passenger, destination = core.decode(int(obs))
    assert f"Taxi: row {row}, column {col}" in text
    assert _grid_position(text.split("\nTaxi")[0], "T") == (1 + row, 2 * col + 1)
    stops = "RGYB"
    if passenger == 4:
      assert "Passenger: in the taxi" in text
    else:
      assert f"Passenger: at {stops[passenger]}" in text
    assert f"Destination: {stops[destination]}" in text
  else:
    player_sum, dealer, ace = obs
    assert f"sum {player_sum}, usable ace: {'yes' if ace else 'no'}" in text
    assert text.endswith("Dealer's visible card: " + ("A" if dealer == 1 else str(dealer)))


def _raw_episode(env_id, seed, indices, **kwargs):
  raw = gymnasium.make(env_id, **kwargs)
  first, _ = raw.reset(seed=seed)
  steps = []
  for index in indices:
    obs, reward, terminated, truncated, _ = raw.step(index)
    steps.append((obs, float(reward), terminated or truncated))
    if terminated or truncated:
      break
  raw.close()
  return first, steps


@pytest.mark.parametrize("env_id", sorted(BUILTINS))
def test_builtin_matches_raw_gymnasium(env_id):
  names = BUILTINS[env_id]
  rng = np.random.default_rng(0)
  for seed in (0, 7, 123):
    indices = rng.integers(0, len(names), size=30).tolist()
    first, raw_steps = _raw_episode(env_id, seed, indices)
    env = from_gymnasium(env_id)
    assert env.action_names == names and env.instruction
    text = env.reset(seed)
    assert text == from_gymnasium(env_id).reset(seed)  # same seed, same start
    _check_text(env_id, env, text, first)
    for index, (obs, reward, done) in zip(indices, raw_steps):
      text, got_reward, got_done, info = env.step(names[index])
      assert (got_reward, got_done) == (reward, done)
      assert env.observation == obs
      assert info["action_is_valid"] is True and isinstance(info["success"], bool)
      _check_text(env_id, env, text, obs)
    env.close()


def test_frozenlake_goal_and_hole():
  # Default 4x4 map: SFFF / FHFH / FFFH / HFFG.
  env = from_gymnasium("FrozenLake-v1", is_slippery=False)
  env.reset(0)
  path = ("Down", "Down", "Right", "Right", "Down", "Right")
  for i, action in enumerate(path):
    text, reward, done, info = env.step(action)
    assert info["action_is_effective"]
    assert done == (i == len(path) - 1)
  assert (reward, done, info["success"]) == (1.0, True, True)
  assert text.split("\n")[-1] == "O__√"
  # The episode is over: further steps change nothing.
  assert env.step("Up") == (
      text,
      0.0,
      True,
      {"action_is_valid": True, "action_is_effective": False, "success": True},
  )

  env.reset(0)
  _, reward, done, info = env.step("Left")  # into the border: no move
  assert not info["action_is_effective"] and not done
  env.step("Right")
  text, reward, done, info = env.step("Down")
  assert (reward, done, info["success"]) == (0.0, True, False)
  assert text.split("\n")[1] == "_X_O"


def test_builtin_success_rules():
  taxi = from_gymnasium("Taxi-v4")
  taxi.reset(0)  # taxi (3, 0), passenger at B (4, 3), destination Y (4, 0)
  route = ["North", "East", "East", "East", "South", "South", "Pickup"]
  route += ["North", "North", "West", "West", "West", "South", "South", "Dropoff"]
  for action in route:
    _, reward, done, info = taxi.step(action)
  assert (reward, done, info["success"]) == (20.0, True, True)

  cliff = from_gymnasium("CliffWalking-v1")
  cliff.reset(0)
  for action in ["Up"] + ["Right"] * 11 + ["Down"]:
    text, reward, done, info = cliff.step(action)
  assert (reward, done, info["success"]) == (-1.0, True, True)
  assert text.endswith("_CCCCCCCCCC√")

  blackjack = from_gymnasium("Blackjack-v1")
  wins = 0
  for seed in range(40):
    blackjack.reset(seed)
    _, reward, done, info = blackjack.step("Stick")
    assert done and info["success"] == (reward > 0)
    wins += info["success"]
  assert 0 < wins < 40


def test_options_and_overrides():
  env = from_gymnasium(
      env_id="FrozenLake-v1",
      map_name="8x8",
      is_slippery=False,
      max_episode_steps=2,
      action_names=["a", "b", "c", "d"],
      instruction="Go.",
      success=lambda reward, terminated, info: not terminated,
      max_actions_per_turn=1,
  )
  assert env.reset(1).count("\n") == 7 and env.instruction == "Go."
  assert env.max_actions_per_turn == 1
  _, _, done, info = env.step("b")
  assert not done and info["success"] and not info["truncated"]
  _, _, done, info = env.step("b")
  assert done and info["truncated"] and not info["terminated"]
  # Non-slippery FrozenLake's instruction does not mention slipping.
  assert "slippery" not in from_gymnasium("FrozenLake-v1", is_slippery=False).instruction
  assert "slippery" in from_gymnasium("FrozenLake-v1").instruction


def test_negative_seed_and_fresh_envs():
  factory = functools.partial(from_gymnasium, "FrozenLake-v1")
  a, b = factory(), factory()
  assert a.env is not b.env
  assert a.reset(-5) == b.reset(-5)


class _Counter(gymnasium.Env):
  """Counts up or down; observation is the count."""

  def __init__(self, box_actions=False):
    self.observation_space = gymnasium.spaces.Discrete(10)
    self.action_space = (
        gymnasium.spaces.Box(-1.0, 1.0, (1,)) if box_actions else gymnasium.spaces.Discrete(3)
    )
    self.count = 0

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.count = int(self.np_random.integers(0, 5))
    return self.count, {"start": self.count, "mask": np.ones(3)}

  def step(self, action):
    self.count += int(action) - 1
    return self.count, 1.0, self.count >= 6, False, {"count": np.int64(self.count), "nan": np.nan}


def test_custom_discrete_env():
  env = from_gymnasium(_Counter, render=lambda env, obs: f"count {obs}")
  assert env.action_names == ("0", "1", "2") and env.instruction == ""
  start = env.reset(3)
  assert start == f"count {env.env.unwrapped.count}"
  text, reward, _, info = env.step("2")
  assert reward == 1.0 and text == f"count {int(start.split()[1]) + 1}"
  # JSON-friendly scalars are copied as Python values; NaN and arrays are left out.
  assert info["count"] == env.observation and type(info["count"]) is int
  assert "nan" not in info and "success" not in info and info["action_is_effective"]
  _, _, _, info = env.step("1")
  assert not info["action_is_effective"]


def test_hooks_named_by_strings(monkeypatch):
  # Config files name render and success as "module:attribute" strings.
  hooks = types.SimpleNamespace(
      render=lambda env, obs: f"at {obs}", success=lambda reward, terminated, info: reward > 0
  )
  monkeypatch.setitem(sys.modules, "my_hooks", hooks)
  env = from_gymnasium(_Counter, render="my_hooks:render", success="my_hooks:success")
  assert env.reset(0) == f"at {env.observation}"
  assert env.step("2")[3]["success"] is True
  with pytest.raises(ValueError, match="module:function"):
    from_gymnasium(_Counter, render="my_hooks")


def test_errors():
  with pytest.raises(ValueError, match="Discrete action space.*Box"):
    from_gymnasium("Pendulum-v1")
  with pytest.raises(ValueError, match="Discrete action space.*Box"):
    from_gymnasium(_Counter, render=str, box_actions=True)
  with pytest.raises(ValueError, match="render="):
    from_gymnasium(_Counter)
  with pytest.raises(ValueError, match="action_names"):
    from_gymnasium("Blackjack-v1", action_names=["Stick"])
  with pytest.raises(TypeError, match="not an env instance"):
    from_gymnasium(gymnasium.make("FrozenLake-v1"))
  env = from_gymnasium("FrozenLake-v1")
  with pytest.raises(RuntimeError, match="reset"):
    env.step("Left")
  env.reset(0)
  with pytest.raises(ValueError, match="Unknown action 'Jump'"):
    env.step("Jump")
  with pytest.raises(ValueError, match="Unknown action"):
    env.step("left")  # the rollout passes canonical names only


def test_gymnasium_missing(monkeypatch):
  monkeypatch.setitem(sys.modules, "gymnasium", None)
  with pytest.raises(ImportError, match="pip install gymnasium"):
    gym_bridge.from_gymnasium("FrozenLake-v1")


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    actions=st.lists(st.integers(0, 3), min_size=1, max_size=40),
)
def test_slippery_frozenlake_matches_raw(seed, actions):
  names = BUILTINS["FrozenLake-v1"]
  first, raw_steps = _raw_episode("FrozenLake-v1", seed, actions)
  env = from_gymnasium("FrozenLake-v1")
  assert _grid_position(env.reset(seed)) == divmod(first, 4)
  for index, (obs, reward, done) in zip(actions, raw_steps):
    text, got_reward, got_done, info = env.step(names[index])
    assert (got_reward, got_done) == (reward, done)
    assert _grid_position(text) == divmod(int(obs), 4)
    assert info["success"] == (reward > 0)

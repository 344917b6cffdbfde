"""Gymnasium environments with a discrete action space as text environments (`TextEnv`).

    import functools
    from ragen_jax.envs.bridges import gymnasium as gym_bridge

    factory = functools.partial(gym_bridge.from_gymnasium, "FrozenLake-v1")
    env = factory(is_slippery=False)  # one TextEnv per episode, each owning a fresh gymnasium env
    text = env.reset(seed=3)          # the 4x4 grid in RAGEN's symbols (P, _, O, G, X, √)
    text, reward, done, info = env.step("Down")

In a config: entry `ragen_jax.envs.bridges.gymnasium:from_gymnasium` with options such as
`{"env_id": "Taxi-v4", "max_episode_steps": 50}`; options the adapter does not take go to
`gymnasium.make`.

Gymnasium's toy-text envs (FrozenLake, Taxi, CliffWalking, Blackjack) come with a text rendering,
action names, an instruction and a success test; they are recognised by their class, so every
registered version and map works. Any other env with a `Discrete` action space needs `render`,
a callable (env, observation) -> str; its actions are named "0".."n-1" unless `action_names` is
given. `render` and `success` may also be "module:attribute" strings (config files).
"""

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from ragen_jax.envs import registry
from ragen_jax.envs import text

Render = Callable[[Any, Any], str]  # (gymnasium env, observation) -> text
Success = Callable[[float, bool, Dict[str, Any]], bool]  # (reward, terminated, gym info) -> bool
# Built-ins may look at the env's state: (env, observation, reward, terminated, info) -> bool.
_FullSuccess = Callable[[Any, Any, float, bool, Dict[str, Any]], bool]

_INSTALL_HINT = "The gymnasium adapter needs gymnasium: pip install gymnasium"
_OWN_INFO_KEYS = ("success", "action_is_valid", "action_is_effective", "terminated", "truncated")


def _import_gymnasium():
  try:
    import gymnasium
  except ImportError as e:
    raise ImportError(_INSTALL_HINT) from e
  return gymnasium


# ---------------------------------------------------------------- built-in toy-text envs


@dataclasses.dataclass(frozen=True)
class _Builtin:
  action_names: Tuple[str, ...]
  render: Render
  instruction: Callable[[Any], str]  # env -> text
  success: _FullSuccess


def _answer_example(actions: str) -> str:
  return f"The answer should be a sequence of actions, like <answer>{actions}</answer>."


def _frozenlake_render(env, obs) -> str:
  lake = env.unwrapped
  player = divmod(int(obs), lake.ncol)
  rows = []
  for r, line in enumerate(lake.desc.astype(str)):
    cells = []
    for c, tile in enumerate(line):
      here = (r, c) == player
      if tile == "H":
        cells.append("X" if here else "O")
      elif tile == "G":
        cells.append("√" if here else "G")
      else:  # the start tile is drawn as frozen ice, as in RAGEN
        cells.append("P" if here else "_")
    rows.append("".join(cells))
  return "\n".join(rows)


def _frozenlake_instruction(env) -> str:
  # FrozenLakeEnv does not keep `is_slippery`; a slippery lake has several outcomes per move.
  slippery = any(
      len(outcomes) > 1 for moves in env.unwrapped.P.values() for outcomes in moves.values()
  )
  parts = ["You are solving the FrozenLake puzzle. Avoid the holes and reach the goal."]
  if slippery:
    parts.append("The ice is slippery, so you may move in an unintended direction.")
  parts.append(
      "The meaning of each symbol in the state is: P: player, _: frozen ice, O: hole, G: goal, "
      "X: player in a hole, √: player on the goal."
  )
  parts.append(_answer_example("Left || Up"))
  return " ".join(parts)


def _frozenlake_success(env, obs, reward, terminated, info) -> bool:
  # The tile under the player rather than the reward: `reward_schedule` can change the rewards.
  lake = env.unwrapped
  row, col = divmod(int(obs), lake.ncol)
  return bool(terminated) and lake.desc[row, col] == b"G"


def _taxi_render(env, obs) -> str:
  taxi = env.unwrapped
  row, col, passenger, destination = (int(x) for x in taxi.decode(int(obs)))
  grid = [list(line) for line in taxi.desc.astype(str)]

  def stop(index: int) -> str:
    r, c = taxi.locs[index]
    return f"{grid[1 + r][2 * c + 1]} (row {r}, column {c})"

  where = "in the taxi" if passenger == len(taxi.locs) else f"at {stop(passenger)}"
  lines = [
      f"Taxi: row {row}, column {col}",
      f"Passenger: {where}",
      f"Destination: {stop(destination)}",
  ]
  grid[1 + row][2 * col + 1] = "T"  # map cell of (row, col): the border and the wall columns
  return "\n".join(["".join(line) for line in grid] + lines)


def _taxi_instruction(env) -> str:
  return (
      "You are driving a taxi on a 5x5 map. Drive to the passenger, pick them up, drive to the "
      "destination and drop them off. R, G, Y and B are the four stops, T is the taxi, | is a "
      "wall that East and West moves cannot cross, and : is an open passage. Rows count from 0 "
      "at the top (South increases the row) and columns from 0 at the left (East increases the "
      "column). Every step costs 1, an illegal Pickup or Dropoff costs 10, and delivering the "
      "passenger earns 20 and ends the episode. " + _answer_example("South || West")
  )


def _cliffwalking_render(env, obs) -> str:
  cliff = env.unwrapped
  nrow, ncol = cliff.shape
  player = divmod(int(obs), ncol)
  goal = (nrow - 1, ncol - 1)
  rows = []
  for r in range(nrow):
    cells = []
    for c in range(ncol):
      if (r, c) == player:
        cells.append("√" if player == goal else "P")
      elif (r, c) == goal:
        cells.append("G")
      else:
        cells.append("C" if cliff._cliff[r, c] else "_")
    rows.append("".join(cells))
  return "\n".join(rows)


def _cliffwalking_instruction(env) -> str:
  nrow, ncol = env.unwrapped.shape
  return (
      f"You are walking on a {nrow}x{ncol} grid from the start at the bottom-left corner to the "
      "goal at the bottom-right corner, along a cliff. The meaning of each symbol in the state "
      "is: P: player, _: ground, C: cliff, G: goal, √: player on the goal. Every step costs 1; "
      "stepping into the cliff costs 100 and sends you back to the start. Reaching the goal ends "
      "the episode. " + _answer_example("Up || Right")
  )


def _blackjack_render(env, obs) -> str:
  player_sum, dealer_card, usable_ace = (int(x) for x in obs)
  card = lambda value: "A" if value == 1 else str(value)
  cards = ", ".join(card(int(v)) for v in env.unwrapped.player)
  return (
      f"Your cards: {cards} (sum {player_sum}, usable ace: {'yes' if usable_ace else 'no'})\n"
      f"Dealer's visible card: {card(dealer_card)}"
  )


def _blackjack_instruction(env) -> str:
  return (
      "You are playing Blackjack against the dealer. Aim for a hand sum closer to 21 than the "
      "dealer's without going over. Face cards count 10 and an ace counts 11 unless that would "
      "bust the hand (then 1; an ace counted as 11 is a usable ace). Hit draws a card; Stick ends "
      "your turn, then the dealer draws until reaching 17 or more. A win earns 1, a draw 0, a "
      "loss -1. " + _answer_example("Hit || Stick")
  )


def _builtin(env) -> Optional[_Builtin]:
  from gymnasium.envs import toy_text

  core = env.unwrapped
  if isinstance(core, toy_text.FrozenLakeEnv):
    return _Builtin(
        ("Left", "Down", "Right", "Up"),
        _frozenlake_render,
        _frozenlake_instruction,
        _frozenlake_success,
    )
  if isinstance(core, toy_text.TaxiEnv):
    return _Builtin(
        ("South", "North", "East", "West", "Pickup", "Dropoff"),
        _taxi_render,
        _taxi_instruction,
        # Only a dropoff at the destination (reward 20) terminates a Taxi episode.
        lambda env, obs, reward, terminated, info: bool(terminated) and reward >= 20,
    )
  if isinstance(core, toy_text.CliffWalkingEnv):
    return _Builtin(
        ("Up", "Right", "Down", "Left"),
        _cliffwalking_render,
        _cliffwalking_instruction,
        lambda env, obs, reward, terminated, info: bool(terminated),
    )
  if isinstance(core, toy_text.BlackjackEnv):
    return _Builtin(
        ("Stick", "Hit"),
        _blackjack_render,
        _blackjack_instruction,
        lambda env, obs, reward, terminated, info: bool(terminated) and reward > 0,
    )
  return None


# ---------------------------------------------------------------- helpers


def _resolve(value, what: str):
  """A callable, or a "module:attribute" string naming one (config files hold strings)."""
  if isinstance(value, str):
    value = registry.import_attribute(value, f"{what} string", "'package.module:function'")
  if not callable(value):
    raise TypeError(f"{what} must be callable, got {type(value).__name__}.")
  return value


def _same_observation(a, b) -> bool:
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same_observation(a[k], b[k]) for k in a)
  if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
    return len(a) == len(b) and all(_same_observation(x, y) for x, y in zip(a, b))
  return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _json_scalar(value) -> Tuple[bool, Any]:
  """(whether `value` is a JSON-friendly scalar, its plain Python form)."""
  if isinstance(value, np.generic):
    value = value.item()
  if value is None or isinstance(value, (bool, int, str)):
    return True, value
  if isinstance(value, float):
    return math.isfinite(value), value  # NaN and infinities are not JSON
  return False, None


# ---------------------------------------------------------------- the adapter


class GymnasiumTextEnv(text.TextEnv):
  """One gymnasium env with a `Discrete` action space, played on strings; see the module doc.

  Owns `env` (closed by `close`). A step after the episode ended changes nothing: it returns the
  last text with reward 0, as RAGEN's JAX envs do.
  """

  def __init__(
      self,
      env,
      render: Optional[Union[Render, str]] = None,
      action_names: Optional[Sequence[str]] = None,
      instruction: Optional[str] = None,
      success: Optional[Union[Success, str]] = None,
      max_actions_per_turn: Optional[int] = None,
  ):
    gymnasium = _import_gymnasium()
    space = env.action_space
    if not isinstance(space, gymnasium.spaces.Discrete):
      raise ValueError(
          f"The gymnasium adapter needs a Discrete action space, got {space!r} from {env}."
      )
    builtin = _builtin(env)
    if render is None and builtin is None:
      raise ValueError(
          f"No built-in text rendering for {env}: pass render=, a callable "
          "(env, observation) -> str (built-ins: FrozenLake, Taxi, CliffWalking, Blackjack)."
      )
    n, start = int(space.n), int(space.start)
    if action_names is None:
      action_names = builtin.action_names if builtin else [str(start + i) for i in range(n)]
    names = tuple(action_names)
    if len(names) != n or len(set(names)) != n or not all(isinstance(x, str) for x in names):
      raise ValueError(f"action_names must be {n} distinct strings for {space}, got {names}.")

    self.env = env
    self.action_names = names
    self.instruction = (
        instruction if instruction is not None else (builtin.instruction(env) if builtin else "")
    )
    self.max_actions_per_turn = max_actions_per_turn
    self._index = {name: start + i for i, name in enumerate(names)}
    self._render = _resolve(render, "render") if render is not None else builtin.render
    if success is not None:
      user = _resolve(success, "success")
      self._success = lambda env, obs, reward, terminated, info: user(reward, terminated, info)
    else:
      self._success = builtin.success if builtin else None
    self.observation = None  # gymnasium's latest observation
    self._text = None
    self._done = False
    self._succeeded = False

  def reset(self, seed: int) -> str:
    seed = int(seed)
    # Gymnasium rejects negative seeds; map them to distinct non-negative ones.
    self.observation, _ = self.env.reset(seed=seed if seed >= 0 else seed % (1 << 64))
    self._text = self._render(self.env, self.observation)
    self._done = False
    self._succeeded = False
    return self._text

  def step(self, action: str) -> text.StepOutput:
    if action not in self._index:
      raise ValueError(f"Unknown action {action!r}; valid actions: {list(self.action_names)}.")
    if self._text is None:
      raise RuntimeError("Call reset(seed) before step.")
    if self._done:
      info = {"action_is_valid": True, "action_is_effective": False}
      if self._success is not None:
        info["success"] = self._succeeded
      return self._text, 0.0, True, info

    observation, reward, terminated, truncated, gym_info = self.env.step(self._index[action])
    reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
    info = {}
    for key, value in gym_info.items():
      ok, plain = _json_scalar(value)
      if ok and isinstance(key, str) and key not in _OWN_INFO_KEYS:
        info[key] = (
            plain  # e.g. FrozenLake's "prob"; arrays such as Taxi's action_mask are left out
        )
    info["action_is_valid"] = True
    info["action_is_effective"] = not _same_observation(observation, self.observation)
    info["terminated"], info["truncated"] = terminated, truncated
    if self._success is not None:
      self._succeeded = bool(self._success(self.env, observation, reward, terminated, gym_info))
      info["success"] = self._succeeded
    self.observation = observation
    self._text = self._render(self.env, observation)
    self._done = terminated or truncated
    return self._text, reward, self._done, info

  def close(self) -> None:
    self.env.close()


def from_gymnasium(
    env_id,
    render: Optional[Union[Render, str]] = None,
    action_names: Optional[Sequence[str]] = None,
    instruction: Optional[str] = None,
    max_episode_steps: Optional[int] = None,
    success: Optional[Union[Success, str]] = None,
    max_actions_per_turn: Optional[int] = None,
    **make_kwargs: Any,
) -> GymnasiumTextEnv:
  """Builds a fresh gymnasium env and wraps it; called once per episode by the rollout.

  Args:
    env_id: a gymnasium id for `gymnasium.make(env_id, **make_kwargs)`, or a callable returning a
      new gymnasium env, called as `env_id(**make_kwargs)`. Not an env instance: each TextEnv
      must own its env.
    render: (env, observation) -> str; required unless the env is a built-in toy-text one.
    action_names: one name per action index; default the built-in names, else "0".."n-1".
    instruction: system-prompt text; default the built-in one, else "".
    max_episode_steps: episode length limit (gymnasium's TimeLimit; truncation ends the episode).
    success: (reward, terminated, gymnasium info) -> bool; default the built-in test, else no
      `success` in info.
    max_actions_per_turn: answers stepped per turn; None keeps the rollout's setting.
    **make_kwargs: options of the env (e.g. is_slippery=False, map_name="8x8").
  """
  gymnasium = _import_gymnasium()
  if isinstance(env_id, gymnasium.Env):
    raise TypeError(
        "from_gymnasium needs an env id or a callable returning a new env, not an env instance: "
        "each episode's TextEnv must own its gymnasium env."
    )
  if isinstance(env_id, str):
    if max_episode_steps is not None:
      make_kwargs["max_episode_steps"] = max_episode_steps
    env = gymnasium.make(env_id, **make_kwargs)
  elif callable(env_id):
    env = env_id(**make_kwargs)
    if not isinstance(env, gymnasium.Env):
      raise TypeError(f"env_id() must return a gymnasium.Env, got {type(env).__name__}.")
    if max_episode_steps is not None:
      env = gymnasium.wrappers.TimeLimit(env, max_episode_steps)
  else:
    raise TypeError(
        f"env_id must be a gymnasium id or a callable returning an env, got {env_id!r}."
    )
  try:
    return GymnasiumTextEnv(env, render, action_names, instruction, success, max_actions_per_turn)
  except Exception:
    env.close()
    raise

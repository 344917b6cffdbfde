"""Scripted expert replies in RAGEN's format: the supervised warm start of a tiny policy.

    policy = demos.expert_policy(env, rollout_config, random_prob=0.25, seed=0)
    result = engine.run_scripted(policy, key, seed)   # a RolloutBatch of demonstrations

Experts (host side, one unbatched state at a time):
  Sokoban     the first moves of an optimal plan from `envs.sokoban.solve` (breadth-first);
  FrozenLake  the first moves of a shortest hole-free path (breadth-first, ignoring slips);
  Bandit      the high-risk arm (its expected payout 0.25 beats the safe arm's 0.1).

Deliberately imperfect: every action of a reply is independently replaced by a uniformly
random action name with probability `random_prob`, so the fine-tuned policy still errs and
reinforcement learning has room to improve it. With `undo_prob`, a share of the replies of two
or more actions take back their first move instead ("Up || Down": a hesitant demonstrator;
experiments/README.md, "Three levers against the loops", says what the tiny model makes of it).
The reasoning restates the positions that matter (short, so it costs few tokens) and the answer joins the actions with
RAGEN's separator. A state the expert cannot solve any more (a box pushed into a corner) gets
random actions.
"""

import collections
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ragen_jax.envs import frozenlake as frozenlake_lib
from ragen_jax.envs import sokoban as sokoban_lib

_SOKOBAN_SOLVE_DEPTH = 30


def _rc(cells) -> str:
  return ", ".join(f"({int(r)}, {int(c)})" for r, c in cells)


def sokoban_expert(env, state) -> Tuple[Optional[List[int]], str]:
  """(optimal plan or None, reasoning text) for one Sokoban state."""
  fixed, boxes, player = (
      np.asarray(x) for x in (state.fixed_HxW, state.boxes_HxW, state.player_rc)
  )
  targets = np.argwhere(fixed == sokoban_lib.TARGET)
  thought = f"Player {_rc([player])}, box {_rc(np.argwhere(boxes))}, " f"target {_rc(targets)}."
  return sokoban_lib.solve(state, _SOKOBAN_SOLVE_DEPTH), thought


def frozenlake_expert(env, state) -> Tuple[Optional[List[int]], str]:
  """(shortest hole-free path as action indices or None, reasoning text)."""
  tiles, player = np.asarray(state.tiles_SxS), tuple(int(x) for x in state.player_rc)
  goal = tuple(int(x) for x in np.argwhere(tiles == frozenlake_lib.GOAL)[0])
  thought = f"Player {_rc([player])}, goal {_rc([goal])}."
  deltas = ((0, -1), (1, 0), (0, 1), (-1, 0))  # the env's action order Left, Down, Right, Up
  parents = {player: None}
  frontier = collections.deque([player])
  while frontier:
    cell = frontier.popleft()
    if cell == goal:
      plan = []
      while parents[cell] is not None:
        cell, action = parents[cell]
        plan.append(action)
      return plan[::-1], thought
    for a, (dr, dc) in enumerate(deltas):
      nxt = (cell[0] + dr, cell[1] + dc)
      if (
          0 <= nxt[0] < env.size
          and 0 <= nxt[1] < env.size
          and nxt not in parents
          and tiles[nxt] != frozenlake_lib.HOLE
      ):
        parents[nxt] = (cell, a)
        frontier.append(nxt)
  return None, thought


def bandit_expert(env, state) -> Tuple[Optional[List[int]], str]:
  """(the high-risk arm's action index, reasoning text)."""
  names = env.action_names_for(state)
  hi = 0 if bool(state.hi_first) else 1
  return [hi], f"{names[hi]} is the riskier arm with the higher expected reward."


EXPERTS = {"sokoban": sokoban_expert, "frozenlake": frozenlake_expert, "bandit": bandit_expert}


def reply_text(thought: str, actions: Sequence[str], enable_think: bool, action_sep: str) -> str:
  """The reply after the generation prefix ("<think>" or "<answer>")."""
  answer = f" {action_sep} ".join(actions)
  if enable_think:
    return f"{thought}</think><answer>{answer}</answer>"
  return f"{answer}</answer>"


# The move that takes back each move (Sokoban's and FrozenLake's action names).
OPPOSITE = {"Up": "Down", "Down": "Up", "Left": "Right", "Right": "Left"}


def expert_policy(env, config, random_prob: float, seed: int, undo_prob: float = 0.0) -> Callable:
  """A `policy(state, episode) -> reply` for `Rollout.run_scripted` (see the module doc).

  Args:
    env: the environment (its name selects the expert).
    config: the rollout's RolloutConfig (actions per turn, separator, think format).
    random_prob: probability that each action is replaced by a random one.
    seed: seed of the host random generator (replies are reproducible per seed).
    undo_prob: probability that a reply of two or more actions is cut to its first action and
      the move that takes it back ("Up || Down"): a hesitant demonstrator.
  """
  if env.name not in EXPERTS:
    raise ValueError(f"no expert for env {env.name!r}; experts exist for {sorted(EXPERTS)}")
  for name, value in (("random_prob", random_prob), ("undo_prob", undo_prob)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"{name} must lie in [0, 1], got {value}")
  expert = EXPERTS[env.name]
  rng = np.random.default_rng(seed)

  def policy(state, episode) -> str:
    plan, thought = expert(env, state)
    names = episode.action_names
    budget = min(config.max_actions_per_turn, episode.actions_left)
    count = budget if plan is None else max(1, min(budget, len(plan)))
    actions = []
    for j in range(count):
      if plan is None or j >= len(plan) or rng.random() < random_prob:
        actions.append(names[int(rng.integers(len(names)))])
      else:
        actions.append(names[plan[j]])
    if len(actions) >= 2 and actions[0] in OPPOSITE and rng.random() < undo_prob:
      actions = [actions[0], OPPOSITE[actions[0]]]
    return reply_text(thought, actions, config.enable_think, config.action_sep)

  return policy

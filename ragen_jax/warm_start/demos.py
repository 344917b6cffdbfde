"""Scripted expert replies in RAGEN's format: the supervised warm start of a tiny policy.

    policy = demos.expert_policy(env, rollout_config, random_prob=0.25, seed=0)
    result = engine.run_scripted(policy, key, seed)   # a RolloutBatch of demonstrations

Experts are the environments' own `expert(state)` methods (host side, one unbatched state at a
time): Sokoban's optimal plan (breadth-first), FrozenLake's shortest hole-free path (ignoring
slips), Bandit's high-risk arm (its expected payout 0.25 beats the safe arm's 0.1), 2048's move of
best expected value one new tile ahead.

Deliberately imperfect: every action of a reply is independently replaced by a uniformly
random action name with probability `random_prob`, so the fine-tuned policy still errs and
reinforcement learning has room to improve it. With `undo_prob`, a share of the replies of two
or more actions take back their first move instead ("Up || Down": a hesitant demonstrator;
experiments/README.md, "Three levers against the loops", says what the tiny model makes of it).
The reasoning restates the positions that matter (short, so it costs few tokens) and the answer joins the actions with
RAGEN's separator. A state the expert cannot solve any more (a box pushed into a corner) gets
random actions.
"""

from typing import Callable, Sequence

import numpy as np

from ragen_jax import envs
from ragen_jax.rollout import env_batch
from ragen_jax.rollout import prompts


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
    env: the environment (its `expert` method plans): a pure-JAX one, or a text environment
      (`envs.HostEnv`) whose class defines `expert()`; free-text answers are used as the
      expert gives them (`random_prob` and `undo_prob` act on action names only).
    config: the rollout's RolloutConfig (actions per turn, separator, think format).
    random_prob: probability that each action is replaced by a random one.
    seed: seed of the host random generator (replies are reproducible per seed).
    undo_prob: probability that a reply of two or more actions is cut to its first action and
      the move that takes it back ("Up || Down"): a hesitant demonstrator.
  """
  if not env_batch.has_expert(env):
    raise ValueError(f"environment {getattr(env, 'name', env)!r} has no expert (env.expert)")
  for name, value in (("random_prob", random_prob), ("undo_prob", undo_prob)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"{name} must lie in [0, 1], got {value}")
  rng = np.random.default_rng(seed)

  def policy(state, episode) -> str:
    names = episode.action_names
    if isinstance(env, envs.HostEnv):  # a text environment: its Plan (env_batch.HostBatch)
      if names is None:  # free text: the expert's answers as they are
        plan = state.answers if state is not None else None
        budget = min(episode.max_actions_per_turn, episode.actions_left)
        answers = list(plan or [])[:budget]
        thought = state.thought if state is not None else ""
        return reply_text(thought, answers, config.enable_think, config.action_sep)
      plan, thought = (None, "") if state is None else (state.answers, state.thought)
      plan = None if plan is None else prompts.match_actions(plan, names)[0]
    else:
      plan, thought = env.expert(state)
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

"""experiments/sokoban_action_quality.py against a hand-worked level."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import sokoban_action_quality as quality  # pylint: disable=g-import-not-at-top,wrong-import-position

# Player (4, 2), box (3, 3), target (3, 2): the only optimal plan is Right, Right, Up, Left
# (Up walks onto the target, Left and Down lead away or into a wall), so one move in four is
# optimal.
_GRID = "######\n######\n###_##\n#_OX_#\n#_P__#\n######"
_PROMPT = f"\nTurn 1:\nState:\nGrid Map: \n{_GRID}\nYou have 10 actions left. Always output..."


def _row(reply, env="sokoban"):
  return {
      "env": env,
      "messages": [
          {"role": "system", "content": "rules"},
          {"role": "user", "content": _PROMPT},
          {"role": "assistant", "content": reply},
      ],
  }


def test_first_actions_are_scored_against_the_solver_and_chance():
  rows = [
      _row("<think>x</think><answer>Right || Up</answer>"),  # optimal first move
      _row("<think>x</think><answer>Up || Right</answer>"),  # onto the target: longer
      _row("no tags at all"),  # malformed: not optimal
      _row("<think>x</think><answer>Right</answer>", env="bandit"),
  ]  # other env: skipped
  q = quality.action_quality(rows)
  assert q["turns"] == 3
  assert q["optimal_share"] == pytest.approx(1 / 3)
  assert q["random_share"] == pytest.approx(0.25)


def _episode(grids, replies, success, env="sokoban"):
  messages = [{"role": "system", "content": "rules"}]
  for grid, reply in zip(grids, replies):
    messages += [
        {"role": "user", "content": f"\nTurn 1:\nState:\nGrid Map: \n{grid}\nYou have"},
        {"role": "assistant", "content": reply},
    ]
  return {"env": env, "success": success, "messages": messages}


def test_loop_stats_count_undone_moves_and_unchanged_boards():
  moved = _GRID.replace("#_P__#", "#__P_#")
  rows = [
      # Up || Down twice on the same board: 2 undoing replies, 1 unchanged turn, a failure.
      _episode([_GRID, _GRID], ["<think>x</think><answer>Up || Down</answer>"] * 2, False),
      # A move that changes the board, then a malformed reply (no actions: not a reply counted).
      _episode([_GRID, moved], ["<think>x</think><answer>Right || Up</answer>", "no tags"], True),
      _episode(
          [_GRID, _GRID], ["<think>x</think><answer>Up || Down</answer>"] * 2, False, env="bandit"
      ),  # another environment: skipped
  ]
  stats = quality.loop_stats(rows)
  assert stats == {
      "replies": 3,
      "undo_share": pytest.approx(2 / 3),
      "turns": 2,
      "stuck_share": 0.5,
      "failed": 1,
      "failed_stuck_share": 1.0,
  }
  with pytest.raises(ValueError, match="no Sokoban replies"):
    quality.loop_stats(rows[2:])


def test_trajectories_without_sokoban_turns_are_an_error():
  with pytest.raises(ValueError, match="no solvable Sokoban turns"):
    quality.action_quality([_row("<answer>Up</answer>", env="bandit")])


def test_random_play_against_the_expert_on_the_default_validation_levels():
  config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  default = os.path.join(config, "sokoban_ppo.py")
  wins = quality.random_play_success(default, plays=2)
  assert wins == quality.random_play_success(default, plays=2)  # reproducible
  assert all(0.0 < w < 0.5 and (w * 64).is_integer() for w in wins)  # 64 levels, chance only
  # The same engine with the noise-free expert solves every level within RAGEN's limits.
  assert quality.random_play_success(default, plays=1, random_prob=0.0) == [1.0]
  with pytest.raises(ValueError, match="no sokoban environment"):
    quality.random_play_success(os.path.join(config, "bandit_ppo.py"), plays=1)

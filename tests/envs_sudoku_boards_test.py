"""Sudoku's boards: generated 4x4 and 9x9 puzzles have one solution (against an independent
enumeration), the expert solves them, the givens option, deterministic resets, and the solution
counter."""

import pytest

from ragen_jax.envs.text import sudoku
from ragen_jax.envs.text.sudoku_boards import count_solutions
from sudoku_reference import board  # pylint: disable=g-bad-import-order
from sudoku_reference import completions
from sudoku_reference import PUZZLE
from sudoku_reference import valid_grid


@pytest.mark.parametrize("seed", range(200))
def test_generated_4x4_is_unique_and_expert_solves_it(seed):
  env = sudoku.Sudoku()
  env.reset(seed)
  assert sum(v != 0 for row in env.puzzle for v in row) == sudoku.DEFAULT_GIVENS[4] == 8
  assert valid_grid(env.solution)
  assert completions(env.puzzle) == [env.solution]  # unique, by the independent enumeration
  assert count_solutions(env.puzzle) == 1
  rewards, done, turns = [], False, 0
  while not done:
    answers, thought = env.expert()
    assert answers and len(answers) <= env.max_actions_per_turn and thought.endswith(".")
    turns += 1
    for answer in answers:
      _, reward, done, info = env.step(answer)
      rewards.append(reward)
      if done:
        break
  assert info["success"] and env.board == env.solution
  assert rewards == [0.0] * (len(rewards) - 1) + [1.0]  # RAGEN's: only the completion pays
  assert len(rewards) == 16 - 8
  assert turns == -(-len(rewards) // env.max_actions_per_turn)
  assert env.expert() == (None, "The board is complete.")


def test_reset_is_deterministic_and_seeds_differ():
  env = sudoku.Sudoku()
  boards = {}
  for seed in range(20):
    first = env.reset(seed)
    assert env.reset(seed) == first
    boards[seed] = first
  assert len(set(boards.values())) > 10


@pytest.mark.parametrize("givens", [4, 5, 12, 16])
def test_4x4_givens_option(givens):
  for seed in range(10):
    env = sudoku.Sudoku(givens=givens)
    env.reset(seed)
    assert sum(v != 0 for row in env.puzzle for v in row) == givens
    assert completions(env.puzzle) == [env.solution]


@pytest.mark.parametrize("givens", [None, 30])
def test_generated_9x9_is_unique(givens):
  env = sudoku.Sudoku(size=9, givens=givens, reward_scheme="dense")
  want = 36 if givens is None else givens
  for seed in range(4):
    env.reset(seed)
    assert sum(v != 0 for row in env.puzzle for v in row) == want
    assert valid_grid(env.solution)
    assert all(v in (0, env.solution[r][c]) for r in range(9) for c, v in enumerate(env.puzzle[r]))
    assert count_solutions(env.puzzle) == 1
  # The expert also finishes a 9x9 with only correct placements.
  rewards, done = [], False
  while not done:
    for answer in env.expert()[0]:
      _, reward, done, _ = env.step(answer)
      rewards.append(reward)
      if done:
        break
  assert rewards == [1.0] * (81 - want - 1) + [11.0]


def test_solver_counts():
  assert count_solutions(board(PUZZLE)) == 1
  assert count_solutions(board("1..4\n..1.\n.1..\n4..1")) == 2  # capped at the limit
  assert len(completions(board("1..4\n..1.\n.1..\n4..1"))) >= 2
  assert count_solutions(board("11..\n....\n....\n....")) == 0  # a repeat
  assert count_solutions(board("12..\n..3.\n....\n....")) == 0  # r2c1, r2c2 both need 4
  assert count_solutions([[0] * 4 for _ in range(4)], limit=300) == 288

"""Sudoku: RAGEN's step rules case by case and against a reference, the dense scheme's
hand-worked rewards, the expert, parsing and rendering (generated boards:
envs_sudoku_boards_test.py)."""

import hypothesis
from hypothesis import strategies as st
import pytest

from ragen_jax.envs.text import sudoku
from sudoku_reference import ALL_4X4  # pylint: disable=g-bad-import-order
from sudoku_reference import board
from sudoku_reference import completions
from sudoku_reference import EMPTY
from sudoku_reference import PUZZLE
from sudoku_reference import SOLUTION
from sudoku_reference import valid_grid


def _env(**options):
  env = sudoku.Sudoku(**options)
  env.load(PUZZLE)
  return env


def test_independent_checkers():
  assert len(ALL_4X4) == 288
  assert valid_grid(SOLUTION)
  assert not valid_grid([[1, 2, 3, 4], [2, 1, 4, 3], [3, 4, 1, 2], [4, 3, 2, 1]])  # boxes
  assert completions(board(PUZZLE)) == [SOLUTION]


def test_fixed_board_solution_and_hand_worked_dense_rewards():
  env = _env(reward_scheme="dense")
  assert env.solution == SOLUTION
  assert env.puzzle == board(PUZZLE)
  start = [list(row) for row in env.board]
  invalid = {
      "1,2,3": "conflict",  # row 1 (and box 1) already has 3
      "place 1 at row 4 col 2": "conflict",  # column 2 has 1 (r3c2), and box 3
      "place 4 at row 1 col 2": "wrong",  # conflicts with nothing yet; the solution has 2
      "1,2,4": "wrong",
      "place 2 at row 1 col 1": "filled",  # a given
      "2,3,1": "filled",  # a given holding that very number
      "5,1,1": "out_of_range",
      "place 5 at row 1 col 2": "out_of_range",
      "0,2,2": "out_of_range",
      "1,0,2": "out_of_range",
      "put 2 in r1c2": "unparseable",
      "": "unparseable",
      "1,2": "unparseable",
      "place 2 at row 1": "unparseable",
      "(1,2,2]": "unparseable",  # brackets must match
  }
  for action, outcome in invalid.items():
    obs, reward, done, info = env.step(action)
    assert (reward, done, info["outcome"]) == (-0.1, False, outcome), action
    assert env.board == start, action
    assert obs == env.render() == sudoku.render(start)
    assert not info["success"] and not info["action_is_effective"]
    assert info["action_is_valid"] == (outcome not in ("unparseable", "out_of_range"))

  # Correct placements in both syntaxes: +1 each, and +10 more on the one that completes it.
  rewards = []
  for i, (r, c) in enumerate(EMPTY):
    v = SOLUTION[r][c]
    action = f"place {v} at row {r + 1} col {c + 1}" if i % 2 else f"{r + 1},{c + 1},{v}"
    _, reward, done, info = env.step(action)
    rewards.append(reward)
    assert info["outcome"] == "correct" and info["action_is_effective"] and info["action_is_valid"]
    assert env.board[r][c] == v
    assert done == info["success"] == (i == len(EMPTY) - 1)
  assert rewards == [1.0] * (len(EMPTY) - 1) + [11.0]
  assert env.board == SOLUTION

  # Stepping a finished episode changes nothing and pays nothing.
  _, reward, done, info = env.step("1,2,2")
  assert (reward, done, info["outcome"], info["success"]) == (0.0, True, "finished", True)


def test_dense_filled_by_placement_is_filled():
  env = _env(reward_scheme="dense")
  assert env.step("1,2,2")[1] == 1.0
  _, reward, _, info = env.step("1,2,2")  # the same correct number again
  assert (reward, info["outcome"]) == (-0.1, "filled")


def _ragen_step(board, puzzle, move, steps, max_steps):
  """RAGEN's SudokuEnv.step (mll-lab-nu/RAGEN 0ce743d, ragen/env/sudoku/env.py) as its code
  reads, on the 1-based (row, col, value) our parser read (None: unparseable), after `steps`
  steps counting this one. Returns (board, reward, done, action_is_valid, action_is_effective,
  success); the board is a new list when a number is written."""
  n = len(board)
  out_of_steps = max_steps is not None and steps >= max_steps
  if move is None:
    return board, 0.0, out_of_steps, False, False, False
  r, c, v = move[0] - 1, move[1] - 1, move[2]
  # _is_action_valid: in range, and not one of the initial board's numbers.
  if not (0 <= r < n and 0 <= c < n and 1 <= v <= n) or puzzle[r][c] != 0:
    return board, 0.0, out_of_steps, False, False, False
  # _is_valid_move on the current board: the row, column and box, the cell itself included.
  side = int(round(n**0.5))
  br, bc = r // side * side, c // side * side
  box = [board[i][j] for i in range(br, br + side) for j in range(bc, bc + side)]
  if v in board[r] or v in [row[c] for row in board] or v in box:
    return board, 0.0, out_of_steps, True, False, False
  board = [list(row) for row in board]
  board[r][c] = v
  if all(all(row) for row in board) and valid_grid(board):
    return board, 1.0, True, True, True, True
  return board, 0.0, out_of_steps, True, True, False


def test_ragen_rules_case_by_case():
  env = _env()
  assert env.reward_scheme == "ragen"
  start = [list(row) for row in env.board]
  # (answer, outcome, action_is_valid, (row, col, number) written or None); each pays 0.
  cases = [
      ("put 2 in r1c2", "unparseable", False, None),
      ("5,1,1", "out_of_range", False, None),
      ("1,2,0", "out_of_range", False, None),
      ("place 2 at row 1 col 1", "filled", False, None),  # a given: refused as invalid
      ("2,3,1", "filled", False, None),  # a given holding that very number
      ("1,2,3", "conflict", True, None),  # row 1 (and box 1) has 3
      ("place 1 at row 4 col 2", "conflict", True, None),  # column 2 has 1 (r3c2)
      ("1,2,4", "wrong", True, (0, 1, 4)),  # conflicts with nothing: written, though not 2
      ("1,4,4", "conflict", True, None),  # the solution's 4, refused: row 1 now holds a 4
      ("1,2,4", "conflict", True, None),  # the cell's own number counts
      ("place 2 at row 1 col 2", "correct", True, (0, 1, 2)),  # a placed number is replaced
  ]
  board = start
  for action, outcome, valid, written in cases:
    obs, reward, done, info = env.step(action)
    assert (reward, done, info["outcome"]) == (0.0, False, outcome), action
    assert (info["action_is_valid"], info["action_is_effective"]) == (valid, bool(written))
    if written:
      board = [list(row) for row in board]
      board[written[0]][written[1]] = written[2]
    assert env.board == board, action
    assert obs == sudoku.render(board) and not info["success"]
  # The other empty cells, right numbers: 0 each, and 1.0 on the one that completes the board.
  rest = [(r, c) for r, c in EMPTY if (r, c) != (0, 1)]
  rewards = []
  for r, c in rest:
    _, reward, done, info = env.step(f"{r + 1},{c + 1},{SOLUTION[r][c]}")
    rewards.append(reward)
    assert done == info["success"] == ((r, c) == rest[-1])
  assert rewards == [0.0] * (len(rest) - 1) + [1.0] and env.board == SOLUTION
  _, reward, done, info = env.step("1,2,2")
  assert (reward, done, info["outcome"]) == (0.0, True, "finished")


def test_ragen_max_steps_ends_the_episode_whatever_the_step():
  env = _env(max_steps=3)
  assert env.step("1,2,4")[1:3] == (0.0, False)  # written, wrong
  assert env.step("nonsense")[1:3] == (0.0, False)
  _, reward, done, info = env.step("1,2,3")  # refused, and the last step
  assert (reward, done, info["success"]) == (0.0, True, False)
  # The step that completes the board pays 1.0 also when it is the last one allowed.
  env = _env(max_steps=len(EMPTY))
  for r, c in EMPTY:
    _, reward, done, _ = env.step(f"{r + 1},{c + 1},{SOLUTION[r][c]}")
  assert (reward, done) == (1.0, True)


@pytest.mark.parametrize(
    "answer",
    [
        "place 2 at row 1 col 2",
        "Place 2 at Row 1 Col 2",
        "  PLACE  2  AT  ROW  1  COL  2  ",
        "place 2 in row 1, column 2.",
        "place 2 on row 1 col 2",
        "place 2 row 1 col 2",
        "place 2 at (row 1, col 2)",
        "place 2 at [row 1 column 2]",
        "place2 at row1 col2",
        "1,2,2",
        " 1 , 2 , 2 ",
        "(1, 2, 2)",
        "[1,2,2].",
        "01,2,2",
    ],
)
def test_both_syntaxes_parse(answer):
  assert sudoku.parse_action(answer) == (1, 2, 2)
  env = _env()
  _, reward, _, info = env.step(answer)
  assert (reward, info["outcome"], info["action_is_effective"]) == (0.0, "correct", True)
  assert env.board[0][1] == 2


@pytest.mark.parametrize(
    "answer",
    [
        "place 2 at row 1",
        "2 at row 1 col 2",
        "place 2 at row 1 col 2 please",
        "1 2 2",
        "1,2,2,3",
        "1;2;2",
        "(1,2,2",
        "place 2 at (row 1 col 2]",
        "place -2 at row 1 col 2",
        "1,2,٢",  # not an ASCII digit
        "r1c2=2",
    ],
)
def test_other_text_does_not_parse(answer):
  assert sudoku.parse_action(answer) is None


def test_format_action_round_trips():
  assert sudoku.parse_action(sudoku.format_action(3, 4, 1)) == (3, 4, 1)


def test_options_are_checked():
  with pytest.raises(ValueError):
    sudoku.Sudoku(size=6)
  with pytest.raises(ValueError):
    sudoku.Sudoku(size=4, givens=3)
  with pytest.raises(ValueError):
    sudoku.Sudoku(size=9, givens=82)
  with pytest.raises(ValueError):
    sudoku.Sudoku(hints="some")
  with pytest.raises(ValueError, match="reward_scheme"):
    sudoku.Sudoku(reward_scheme="sparse")
  with pytest.raises(ValueError):
    _env().load("1..4\n..1.\n.1..\n4..1")  # two solutions
  assert sudoku.Sudoku().hints == "all" and sudoku.Sudoku(size=9).hints == "summary"


def test_max_steps_ends_an_unsolved_episode():
  env = _env(max_steps=2)
  assert env.step("nonsense")[2] is False
  _, _, done, info = env.step("1,2,2")
  assert done and not info["success"]


def test_rendering_of_the_module_doc_example():
  grid = board("1.34\n34.2\n.143\n432.")
  assert sudoku.render(grid) == (
      "   1 2   3 4\n"
      "r1 1 . | 3 4\n"
      "r2 3 4 | . 2\n"
      "   ----+----\n"
      "r3 . 1 | 4 3\n"
      "r4 4 3 | 2 .\n"
      "Possible numbers: r1c2: 2; r2c3: 1; r3c1: 2; r4c4: 1"
  )
  assert sudoku.render(grid, "none").count("\n") == 5
  conflicted = board("11..\n....\n....\n...1")
  text = sudoku.render(conflicted, "none")
  assert text.splitlines()[-1] == "Conflicts: row 1 has 2 1s; box 1 has 2 1s"
  assert sudoku.render(SOLUTION).count("\n") == 5  # solved: no help line


def _digits(observation, n):
  """The board back from its rendering, read by position (independently of the module)."""
  rows = [line for line in observation.splitlines() if line.startswith("r")][:n]
  return [
      [0 if ch == "." else int(ch) for ch in line[3:].replace("|", "").split()] for line in rows
  ]


@pytest.mark.parametrize("size", [4, 9])
def test_rendering_shows_every_given_in_place(size):
  env = sudoku.Sudoku(size=size)
  for seed in range(5):
    obs = env.reset(seed)
    assert _digits(obs, size) == env.puzzle
    header = obs.splitlines()[0].split()
    assert header == [str(c) for c in range(1, size + 1)]
    if size == 9:
      free = sudoku.candidates(env.puzzle)
      count, listed = obs.splitlines()[-1].split(" empty cells. Fewest possible numbers: ")
      assert int(count) == len(free) == 81 - 36
      shown = [part.split(": ") for part in listed.split("; ")]
      assert len(shown) == 3
      fewest = sorted(len(v) for v in free.values())[:3]
      assert [len(values.split()) for _, values in shown] == fewest
      for cell, values in shown:
        r, c = int(cell[1]) - 1, int(cell[3]) - 1
        assert values == " ".join(map(str, free[(r, c)]))
      assert len(obs) < 600
    else:
      help_line = obs.splitlines()[-1]
      for (r, c), values in sudoku.candidates(env.puzzle).items():
        assert f"r{r + 1}c{c + 1}: " + " ".join(map(str, values)) in help_line
        assert env.solution[r][c] in values
      assert len(obs) < 400


def test_instruction_has_rules_and_examples():
  text = sudoku.Sudoku().instruction
  assert "<answer>place 3 at row 1 col 2</answer>" in text and "<answer>1,2,3</answer>" in text
  assert "2x2 box" in text and "up to 3" in text
  assert "3x3 box" in sudoku.Sudoku(size=9, max_actions_per_turn=2).instruction
  assert "Completing the board correctly earns 1" in text and "costs" not in text
  dense = sudoku.Sudoku(reward_scheme="dense").instruction
  assert "A correct number earns 1" in dense and "costs 0.1" in dense
  assert sudoku.Sudoku().action_names is None


def test_expert_needs_aboard():
  with pytest.raises(RuntimeError):
    sudoku.Sudoku().expert()


def test_expert_reasons_on_the_fixedboard():
  env = _env(max_actions_per_turn=2)
  answers, thought = env.expert()
  # Forced cells first, in reading order: r1c4 and r2c2 each have one number left.
  assert answers == ["place 4 at row 1 col 4", "place 4 at row 2 col 2"]
  assert thought == "r1c4 can only be 4; r2c2 can only be 4."


_ACTIONS = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda v, r, c, sep: f"place {v} at row {r}{sep}col {c}",
        st.integers(-2, 12),
        st.integers(-2, 12),
        st.integers(-2, 12),
        st.sampled_from([" ", ", ", ",", "  "]),
    ),
    st.builds(
        lambda r, c, v: f"{r},{c},{v}",
        st.integers(-2, 12),
        st.integers(-2, 12),
        st.integers(-2, 12),
    ),
    st.builds(
        lambda r, c, v: f"{r},{c},{v}", st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)
    ),
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(seed=st.integers(0, 10**6), actions=st.lists(_ACTIONS, max_size=12))
def test_arbitrary_text_never_raises_or_corrupts_dense(seed, actions):
  env = sudoku.Sudoku(reward_scheme="dense")
  env.reset(seed)
  for action in actions:
    before = [list(row) for row in env.board]
    obs, reward, done, info = env.step(action)
    if info["outcome"] == "correct":
      changed = [(r, c) for r in range(4) for c in range(4) if env.board[r][c] != before[r][c]]
      assert len(changed) == 1
      ((r, c),) = changed
      assert before[r][c] == 0 and env.board[r][c] == env.solution[r][c]
      assert reward in (1.0, 11.0)
    else:
      assert env.board == before
      assert reward == (0.0 if info["outcome"] == "finished" else -0.1)
    assert obs == env.render()
    assert done == info["success"] == (env.board == env.solution)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    seed=st.integers(0, 10**6),
    # An integer k: the solution's number at cell k (a given, an empty or a placed cell), so
    # that many examples complete the board.
    actions=st.lists(st.one_of(_ACTIONS, st.integers(0, 15)), max_size=20),
    max_steps=st.one_of(st.none(), st.integers(1, 20)),
)
def test_ragen_rules_equal_the_reference_step(seed, actions, max_steps):
  env = sudoku.Sudoku(max_steps=max_steps)
  env.reset(seed)
  board = [list(row) for row in env.puzzle]
  for steps, action in enumerate(actions, 1):
    if isinstance(action, int):
      r, c = divmod(action, 4)
      action = sudoku.format_action(r + 1, c + 1, env.solution[r][c])
    obs, reward, done, info = env.step(action)
    board, *want = _ragen_step(board, env.puzzle, sudoku.parse_action(action), steps, max_steps)
    got = [reward, done, info["action_is_valid"], info["action_is_effective"], info["success"]]
    assert got == want, action
    assert env.board == board and obs == env.render()
    if done:
      break

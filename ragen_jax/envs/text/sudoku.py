"""Sudoku as a host text environment (RAGEN's `_8_sudoku`): place numbers by free-text answers.

    env = Sudoku(size=4)              # 4x4 with 2x2 boxes, or size=9 with 3x3 boxes
    text = env.reset(seed)            # the board, then help lines
    text, reward, done, info = env.step("place 3 at row 1 col 2")   # or "1,2,3"

Host-side Python rather than JAX: a board with a unique solution comes from a backtracking
search (fill a grid at random, then empty cells one by one while a solver still counts exactly
one solution), whose control flow depends on the data at every step; answers are free text,
parsed on the host anyway; and a board is at most 81 small integers, so nothing here is worth
an accelerator.

Boards come from `sudoku_boards.generate` (the same seed gives the same board); `load` plays a
hand-written board instead (tests, fixed evaluations).

Actions (`parse_action`; case and extra spaces ignored, the whole answer must match):
    place V at row R col C      "at" may be "in" or "on" or left out, "col" may be "column",
                                a comma may follow the row and "(row R, col C)" may be bracketed
    R,C,V                       optionally in ( ) or [ ]; spaces around the commas are fine
R, C and V are 1-based whole numbers written in ASCII digits; a trailing "." is ignored.

Rewards, by `reward_scheme`:
  "ragen" (the default; RAGEN's `ragen/env/sudoku/env.py`): every step pays 0.0 except the one
      that completes the board correctly, which pays 1.0 and ends the episode. An unparseable
      answer, a number out of range or a given cell is refused (not a valid action); a number
      already in the cell's row, column or box (the cell's own number included) is refused too;
      any other number is written, whether or not it is the solution's, also over a number
      placed earlier. So the board never holds a repeat, and a complete board is the solution.
  "dense" (this module's shaping, not RAGEN's): +1 for a correct placement (V is the unique
      solution's number at the empty cell R, C), and +10 more on the placement that completes
      the board (done, success). Anything else costs -0.1 and leaves the board unchanged:
      unparseable text, a number out of range, a filled cell (given or placed), a number
      already in the row, column or box, and a number that conflicts with nothing yet but is
      not the solution's (with a unique solution it is wrong; keeping it would only leave a
      board that cannot be completed). Only correct numbers are ever written.
The answer syntax (`parse_action`) is this module's under both; RAGEN's own parser is looser
(it also reads "R C V", and any text with the words "row" and "col" followed by numbers).
`max_steps` (optional) ends an unsolved episode after that many steps (RAGEN always has one).

info: `success` (the board is complete), `action_is_valid` (the answer parsed into numbers in
range, and under "ragen" names no given cell: a well-formed move, whether or not it is right),
`action_is_effective` (the board changed: a correct placement, or under "ragen" any number
written) and `outcome`, one of OUTCOMES.

The observation is the board alone (`render`), so an answer that changes nothing leaves it
identical (the rollout's unchanged-state check):

       1 2   3 4
    r1 1 . | 3 4
    r2 3 4 | . 2
       ----+----
    r3 . 1 | 4 3
    r4 4 3 | 2 .
    Possible numbers: r1c2: 2; r2c3: 1; r3c1: 2; r4c4: 1

then, if the board had any, a "Conflicts:" line. `hints` picks the help line: "all" lists every
empty cell's numbers left by its row, column and box (the default for 4x4); "summary" gives the
count of empty cells and the three with the fewest numbers (the default for 9x9, whose full list
would run to hundreds of tokens); "none" leaves it out.
"""

import random
import re
from typing import Annotated, Dict, List, Optional, Tuple

from ragen_jax.config_checks import check_arguments, check_value, OneOf, PositiveInt
from ragen_jax.envs import text
from ragen_jax.envs.text.sudoku_boards import Board
from ragen_jax.envs.text.sudoku_boards import box_of
from ragen_jax.envs.text.sudoku_boards import box_side
from ragen_jax.envs.text.sudoku_boards import candidates
from ragen_jax.envs.text.sudoku_boards import Cell
from ragen_jax.envs.text.sudoku_boards import conflicts
from ragen_jax.envs.text.sudoku_boards import generate
from ragen_jax.envs.text.sudoku_boards import MIN_GIVENS
from ragen_jax.envs.text.sudoku_boards import repeats
from ragen_jax.envs.text.sudoku_boards import solve

REWARD_SCHEMES = ("ragen", "dense")
SOLVED_REWARD = 1.0  # "ragen": the step that completes the board; every other step pays 0
CORRECT_REWARD = 1.0  # "dense": per correct placement
COMPLETION_BONUS = 10.0  # "dense": more on the placement that completes the board
INVALID_REWARD = -0.1  # "dense": any other answer
DEFAULT_GIVENS = {4: 8, 9: 36}
HINTS = ("all", "summary", "none")
Hints = Annotated[str, OneOf(HINTS)]  # the help line under the board (module doc)
OUTCOMES = (
    "correct",  # the solution's number, written
    "unparseable",
    "out_of_range",
    "filled",  # the cell holds a number ("ragen": a given; a placed number may be overwritten)
    "conflict",  # the number is already in the cell's row, column or box
    "wrong",  # conflicts with nothing, but is not the solution's number ("ragen": written)
    "finished",  # stepped after the episode ended: 0 reward, nothing changes
)

_PLACE = re.compile(
    r"place\s*([0-9]+)\s*(?:(?:at|in|on)\s*)?([(\[]?)\s*row\s*([0-9]+)\s*,?\s*"
    r"col(?:umn)?\s*([0-9]+)\s*([)\]]?)\s*\.?"
)
_TRIPLE = re.compile(r"([(\[]?)\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*([)\]]?)\s*\.?")
_BRACKETS = {"": "", "(": ")", "[": "]"}


def parse_action(answer: str) -> Optional[Tuple[int, int, int]]:
  """(row, col, value) as written (1-based, not range-checked) from one answer in either syntax
  of the module doc, or None."""
  answer = answer.strip().lower()
  place = _PLACE.fullmatch(answer)
  if place and _BRACKETS[place.group(2)] == place.group(5):
    return int(place.group(3)), int(place.group(4)), int(place.group(1))
  triple = _TRIPLE.fullmatch(answer)
  if triple and _BRACKETS[triple.group(1)] == triple.group(5):
    return int(triple.group(2)), int(triple.group(3)), int(triple.group(4))
  return None


def format_action(row: int, col: int, value: int) -> str:
  """The answer that places `value` at 1-based (row, col)."""
  return f"place {value} at row {row} col {col}"


# ---------------------------------------------------------------------------------------------
# Text.


def _cell(cell: Cell) -> str:
  return f"r{cell[0] + 1}c{cell[1] + 1}"


def _options(cell: Cell, values: List[int]) -> str:
  return f"{_cell(cell)}: " + " ".join(map(str, values))


def render(board: Board, hints: str = "all") -> str:
  """The board as text (module doc), with the help lines that `hints` selects."""
  n = len(board)
  side = box_side(n)
  check_value("hints", hints, Hints)

  def groups(values: List[str], sep: str) -> str:
    return sep.join(" ".join(values[i : i + side]) for i in range(0, n, side))

  width = len(str(n))  # row labels "r1".."r9"
  pad = " " * (width + 2)
  lines = [pad + groups([str(c + 1) for c in range(n)], "   ")]
  for r in range(n):
    if r and not r % side:
      lines.append(pad + "-+-".join(["-" * (2 * side - 1)] * side))
    lines.append(f"r{r + 1:<{width}} " + groups([str(v) if v else "." for v in board[r]], " | "))
  free = candidates(board)
  if hints == "all" and free:
    lines.append("Possible numbers: " + "; ".join(_options(k, v) for k, v in free.items()))
  elif hints == "summary" and free:
    tight = sorted(free, key=lambda k: len(free[k]))[:3]  # stable: reading order on ties
    lines.append(
        f"{len(free)} empty cells. Fewest possible numbers: "
        + "; ".join(_options(k, free[k]) for k in tight)
    )
  found = conflicts(board)
  if found:
    lines.append("Conflicts: " + "; ".join(found))
  return "\n".join(lines)


def instruction_text(size: int, max_actions_per_turn: int, reward_scheme: str = "ragen") -> str:
  side = box_side(size)
  if reward_scheme == "ragen":
    rewards = (
        "Completing the board correctly earns 1 and ends the game; nothing else earns anything. "
        "A given cell, a number already in the row, column or box, or an answer in another "
        "form changes nothing; any other number is written, and a number you placed may be "
        "replaced. "
    )
  else:
    rewards = (
        "A correct number earns 1 and completing the board 10 more; a filled cell, a number "
        "already in the row, column or box, a number that is not the solution's, or an answer "
        "in another form costs 0.1 and changes nothing. "
    )
  return (
      f"You are solving a {size}x{size} Sudoku. Fill every empty cell (shown as '.') with a "
      f"number from 1 to {size} so that every row, every column and every {side}x{side} box "
      f"holds each number exactly once. Rows are numbered 1 to {size} from the top (r1, r2, "
      f"...) and columns 1 to {size} from the left. Place a number as 'place V at row R col C' "
      "or as 'R,C,V': both <answer>place 3 at row 1 col 2</answer> and <answer>1,2,3</answer> "
      f"put 3 in row 1, column 2. You may place up to {max_actions_per_turn} numbers per turn. "
      + rewards
      + "Below the board, each empty cell lists the numbers its row, column and box still "
      "allow."
  )


class Sudoku(text.TextEnv):
  """One episode: a seeded puzzle with a unique solution, filled in by free-text placements."""

  action_names = None  # free text

  def __init__(
      self,
      size: int = 4,
      givens: Optional[int] = None,
      max_actions_per_turn: PositiveInt = 3,
      max_steps: Optional[int] = None,
      hints: Optional[str] = None,
      reward_scheme: Annotated[str, OneOf(REWARD_SCHEMES)] = "ragen",
  ):
    """size: 4 or 9. givens: numbers shown at the start (None: DEFAULT_GIVENS, 8 of 16 on a
    4x4, 36 of 81 on a 9x9). max_actions_per_turn: placements stepped per turn. max_steps:
    steps before an unsolved episode ends (None: no limit but the rollout's action budget).
    hints: "all", "summary" or "none" (None: "all" for 4x4, "summary" for 9x9).
    reward_scheme: "ragen" (RAGEN's rules) or "dense" (per-placement rewards; module doc)."""
    box_side(size)
    self.size = size
    self.givens = DEFAULT_GIVENS[size] if givens is None else givens
    if not MIN_GIVENS[size] <= self.givens <= size * size:
      raise ValueError(f"givens must be in [{MIN_GIVENS[size]}, {size * size}], got {givens}")
    check_arguments(
        Sudoku, {"max_actions_per_turn": max_actions_per_turn, "reward_scheme": reward_scheme}, ""
    )
    self.max_actions_per_turn = max_actions_per_turn
    self.max_steps = max_steps
    self.hints = hints or ("all" if size == 4 else "summary")
    check_value("hints", self.hints, Hints)  # after the size's default: None cannot be annotated
    self.reward_scheme = reward_scheme
    self.instruction = instruction_text(size, max_actions_per_turn, reward_scheme)
    self.puzzle: Board = []
    self.solution: Board = []
    self.board: Board = []
    self.steps = 0
    self.done = False

  def reset(self, seed: int) -> str:
    return self._start(*generate(self.size, self.givens, random.Random(seed)))

  def load(self, puzzle) -> str:
    """Plays `puzzle` (a Board, or rows of digits and '.' in a string, one row a line) from its
    start instead of a generated one; returns the first observation. Raises ValueError unless
    it has this size and exactly one solution."""
    if isinstance(puzzle, str):
      rows = [row.strip() for row in puzzle.strip().splitlines()]
      puzzle = [[0 if ch == "." else int(ch) for ch in row] for row in rows]
    board = [[int(v) for v in row] for row in puzzle]
    n = self.size
    if len(board) != n or any(len(row) != n or not all(0 <= v <= n for v in row) for row in board):
      raise ValueError(f"not a {n}x{n} board of numbers 0 to {n}: {puzzle!r}")
    found = solve(board)
    if len(found) != 1:
      raise ValueError(f"the board has {'several' if found else 'no'} solutions, not one")
    return self._start(board, found[0])

  def _start(self, puzzle: Board, solution: Board) -> str:
    self.puzzle, self.solution = puzzle, solution
    self.board = [list(row) for row in puzzle]
    self.steps, self.done = 0, False
    return self.render()

  def render(self) -> str:
    return render(self.board, self.hints)

  def solved(self) -> bool:
    return self.board == self.solution

  def _judge(self, action: str) -> Tuple[str, Optional[Cell], int]:
    """(outcome, 0-based cell, value) of an answer on the current board."""
    move = parse_action(action)
    if move is None:
      return "unparseable", None, 0
    row, col, value = move
    n = self.size
    if not (1 <= row <= n and 1 <= col <= n and 1 <= value <= n):
      return "out_of_range", None, 0
    r, c = row - 1, col - 1
    if self.reward_scheme == "ragen":
      # RAGEN refuses only the givens; the repeat check reads the cell's own number too.
      if self.puzzle[r][c]:
        return "filled", (r, c), value
      if repeats(self.board, r, c, value):
        return "conflict", (r, c), value
    else:
      if self.board[r][c]:
        return "filled", (r, c), value
      if value not in candidates(self.board)[(r, c)]:
        return "conflict", (r, c), value
    if value != self.solution[r][c]:
      return "wrong", (r, c), value
    return "correct", (r, c), value

  def step(self, action: str) -> text.StepOutput:
    if self.done:
      info = {"success": self.solved(), "action_is_valid": False, "action_is_effective": False}
      return self.render(), 0.0, True, {**info, "outcome": "finished"}
    outcome, cell, value = self._judge(str(action))
    self.steps += 1
    ragen = self.reward_scheme == "ragen"
    written = outcome == "correct" or (ragen and outcome == "wrong")
    if written:
      self.board[cell[0]][cell[1]] = value
    # Nothing written ever repeats a number, so a complete board is a valid grid holding the
    # givens: the unique solution (RAGEN checks "complete and correct").
    success = self.solved()
    if ragen:
      reward = SOLVED_REWARD if success else 0.0
    elif outcome == "correct":
      reward = CORRECT_REWARD + (COMPLETION_BONUS if success else 0.0)
    else:
      reward = INVALID_REWARD
    out_of_steps = self.max_steps is not None and self.steps >= self.max_steps
    self.done = success or out_of_steps
    refused = ("unparseable", "out_of_range") + (("filled",) if ragen else ())
    info = {
        "success": success,
        "action_is_valid": outcome not in refused,
        "action_is_effective": written,
        "outcome": outcome,
    }
    return self.render(), reward, self.done, info

  def expert(self) -> Tuple[Optional[List[str]], str]:
    """Up to `max_actions_per_turn` answers from the unique solution, and a short reason for
    each; (None, thought) once solved. Cells that logic forces come first (one number left in
    the cell, or the only place for a number in its row, column or box), then the cells with
    the fewest numbers left, in reading order."""
    if not self.solution:
      raise RuntimeError("Sudoku.expert before reset")
    if self.solved():
      return None, "The board is complete."
    free = candidates(self.board)
    reasons = {cell: self._reason(cell, free) for cell in free}
    order = sorted(free, key=lambda k: (reasons[k][0], len(free[k])))[: self.max_actions_per_turn]
    answers = [format_action(r + 1, c + 1, self.solution[r][c]) for r, c in order]
    return answers, "; ".join(reasons[k][1] for k in order) + "."

  def _reason(self, cell: Cell, free: Dict[Cell, List[int]]) -> Tuple[int, str]:
    """(rank, text): why the solution's number goes in `cell`; rank 0 when forced."""
    r, c = cell
    v, n = self.solution[r][c], self.size
    if len(free[cell]) == 1:
      return 0, f"{_cell(cell)} can only be {v}"
    b = box_of(n, r, c)
    units = (
        (f"row {r + 1}", [k for k in free if k[0] == r]),
        (f"column {c + 1}", [k for k in free if k[1] == c]),
        (f"box {b + 1}", [k for k in free if box_of(n, *k) == b]),
    )
    for name, cells in units:
      if [k for k in cells if v in free[k]] == [cell]:
        return 0, f"{v} fits {name} only at {_cell(cell)}"
    options = " ".join(map(str, free[cell]))
    return 1, f"{_cell(cell)} is {v} (of {options}; the solution is unique)"

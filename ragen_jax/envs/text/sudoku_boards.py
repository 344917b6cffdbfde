"""Sudoku boards for the Sudoku environment (`sudoku`): the rules, a solver and a generator.

A board is rows of numbers, 0 for an empty cell; 4x4 (2x2 boxes) or 9x9 (3x3 boxes). `solve`
keeps bitmasks of the numbers used per row, column and box (bit v for number v) and backtracks
on the empty cell with the fewest numbers left.

`generate`: `random.Random(seed)` fills a full grid by randomised backtracking, then visits the
cells in a random order and empties each one unless that would admit a second solution, until
`givens` cells remain (the same seed gives the same board). A grid whose minimal puzzles stop
above `givens` is dropped for a fresh one; after `_MAX_GRIDS` grids it raises. Random removal
reaches the minimum of 4 givens on a 4x4, but on a 9x9 rarely fewer than about 24.
"""

import math
import random
from typing import Dict, List, Optional, Tuple

Board = List[List[int]]  # rows of numbers, 0 = empty
Cell = Tuple[int, int]  # (row, col), 0-based

MIN_GIVENS = {4: 4, 9: 17}  # fewer never has a unique solution
_MAX_GRIDS = 50


def box_side(size: int) -> int:
  side = math.isqrt(size)
  if size not in (4, 9):
    raise ValueError(f"size must be 4 or 9, got {size}")
  return side


def box_of(size: int, row: int, col: int) -> int:
  side = box_side(size)
  return (row // side) * side + col // side


def _used(board: Board) -> Optional[Tuple[List[int], List[int], List[int]]]:
  """Masks of the numbers in each row, column and box; None when a number repeats in one."""
  n = len(board)
  rows, cols, boxes = [0] * n, [0] * n, [0] * n
  for r in range(n):
    for c in range(n):
      v = board[r][c]
      if v:
        bit, b = 1 << v, box_of(n, r, c)
        if (rows[r] | cols[c] | boxes[b]) & bit:
          return None
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
  return rows, cols, boxes


def candidates(board: Board) -> Dict[Cell, List[int]]:
  """Each empty cell's numbers not yet in its row, column or box (reading order)."""
  n = len(board)
  out = {}
  for r in range(n):
    for c in range(n):
      if not board[r][c]:
        taken = {board[r][k] for k in range(n)} | {board[k][c] for k in range(n)}
        side = box_side(n)
        r0, c0 = r - r % side, c - c % side
        taken |= {board[r0 + i][c0 + j] for i in range(side) for j in range(side)}
        out[(r, c)] = [v for v in range(1, n + 1) if v not in taken]
  return out


def repeats(board: Board, row: int, col: int, value: int) -> bool:
  """Whether `value` is already in the row, column or box of (row, col), that cell included."""
  n, side = len(board), box_side(len(board))
  r0, c0 = row - row % side, col - col % side
  box = [board[r0 + i][c0 + j] for i in range(side) for j in range(side)]
  return value in board[row] or value in [board[r][col] for r in range(n)] or value in box


def conflicts(board: Board) -> List[str]:
  """Numbers that repeat in a row, column or box, as "row 1 has two 3s" (1-based)."""
  n, side = len(board), box_side(len(board))
  units = [(f"row {r + 1}", [(r, c) for c in range(n)]) for r in range(n)]
  units += [(f"column {c + 1}", [(r, c) for r in range(n)]) for c in range(n)]
  for b in range(n):
    r0, c0 = (b // side) * side, (b % side) * side
    units.append((f"box {b + 1}", [(r0 + i, c0 + j) for i in range(side) for j in range(side)]))
  out = []
  for name, cells in units:
    values = [board[r][c] for r, c in cells if board[r][c]]
    for v in sorted(set(values)):
      k = values.count(v)
      if k > 1:
        out.append(f"{name} has {k} {v}s")
  return out


def solve(board: Board, limit: int = 2, rng: Optional[random.Random] = None) -> List[Board]:
  """Up to `limit` completions of `board` (none if it already repeats a number). Backtracking
  on the empty cell with the fewest numbers left; `rng` shuffles the order numbers are tried in
  (a random full grid from an empty board), otherwise ascending."""
  n = len(board)
  masks = _used(board)
  if masks is None:
    return []
  rows, cols, boxes = masks
  work = [list(row) for row in board]
  empty = [(r, c, box_of(n, r, c)) for r in range(n) for c in range(n) if not work[r][c]]
  every = (1 << (n + 1)) - 2
  found: List[Board] = []

  def search(left: int) -> bool:  # True once `limit` solutions are found
    if not left:
      found.append([list(row) for row in work])
      return len(found) >= limit
    best, best_free, best_count = None, 0, n + 1
    for r, c, b in empty:
      if not work[r][c]:
        free = every & ~(rows[r] | cols[c] | boxes[b])
        count = free.bit_count()
        if count < best_count:
          best, best_free, best_count = (r, c, b), free, count
          if count <= 1:  # a dead end or a forced number: no better choice
            break
    r, c, b = best
    values = [v for v in range(1, n + 1) if best_free >> v & 1]
    if rng is not None:
      rng.shuffle(values)
    for v in values:
      bit = 1 << v
      work[r][c] = v
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      done = search(left - 1)
      work[r][c] = 0
      rows[r] &= ~bit
      cols[c] &= ~bit
      boxes[b] &= ~bit
      if done:
        return True
    return False

  search(len(empty))
  return found


def count_solutions(board: Board, limit: int = 2) -> int:
  """The number of solutions of `board`, counted up to `limit`."""
  return len(solve(board, limit))


def generate(size: int, givens: int, rng: random.Random) -> Tuple[Board, Board]:
  """(puzzle, solution): a puzzle with exactly `givens` numbers and a unique solution."""
  box_side(size)
  if not MIN_GIVENS[size] <= givens <= size * size:
    raise ValueError(f"givens must be in [{MIN_GIVENS[size]}, {size * size}], got {givens}")
  for _ in range(_MAX_GRIDS):
    solution = solve([[0] * size for _ in range(size)], 1, rng)[0]
    puzzle = [list(row) for row in solution]
    cells = [(r, c) for r in range(size) for c in range(size)]
    rng.shuffle(cells)
    left = size * size
    for r, c in cells:
      if left == givens:
        break
      puzzle[r][c] = 0
      if count_solutions(puzzle) == 1:
        left -= 1
      else:  # emptying it would admit a second solution: keep it
        puzzle[r][c] = solution[r][c]
    if left == givens:
      return puzzle, solution
  raise RuntimeError(
      f"no {size}x{size} puzzle with a unique solution and {givens} givens in {_MAX_GRIDS} grids; "
      "ask for more givens"
  )

"""An independent 4x4 and 9x9 Sudoku reference for the tests (nothing from the module under
test): a hand-solved board, the grid rule, and every valid 4x4 grid by enumeration."""

import itertools

# A hand-written 4x4 with 7 givens. Its solution, worked by hand: r1c4 = 4 (row 1 lacks 2, 4;
# column 4 has 2), so r1c2 = 2; column 2 then lacks 3, 4 and box 1 has 4 left for r2c2, so
# r4c2 = 3, r4c1 = 4; row 3 lacks 3, 4 and column 4 has 4 at r1, so r3c4 = 3, r3c3 = 4; row 4
# lacks 1, 2 and column 3 has 1, so r4c3 = 2, r4c4 = 1.
PUZZLE = "1.3.\n3.12\n21..\n...."
SOLUTION = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
EMPTY = [(r, c) for r in range(4) for c in range(4) if PUZZLE.split()[r][c] == "."]


def board(text):
  return [[0 if ch == "." else int(ch) for ch in row] for row in text.split()]


def valid_grid(grid):
  """Independent of the module: every row, column and box holds 1..n once."""
  n = len(grid)
  side = int(round(n**0.5))
  want = set(range(1, n + 1))
  rows = [set(row) for row in grid]
  cols = [{grid[r][c] for r in range(n)} for c in range(n)]
  boxes = [
      {grid[r][c] for r in range(br, br + side) for c in range(bc, bc + side)}
      for br in range(0, n, side)
      for bc in range(0, n, side)
  ]
  return all(unit == want for unit in rows + cols + boxes)


def _all_4x4_grids():
  """Every valid 4x4 grid (there are 288), row by row from permutations, without the module."""
  perms = list(itertools.permutations(range(1, 5)))
  grids = [[]]
  for _ in range(4):
    grids = [g + [list(p)] for g in grids for p in perms if _partial_ok(g + [list(p)])]
  return grids


def _partial_ok(rows):
  for c in range(4):
    col = [row[c] for row in rows]
    if len(set(col)) != len(col):
      return False
  for br in (0, 2):
    for bc in (0, 2):
      box = [rows[r][c] for r in range(br, min(br + 2, len(rows))) for c in (bc, bc + 1)]
      if len(set(box)) != len(box):
        return False
  return True


ALL_4X4 = _all_4x4_grids()


def completions(puzzle):
  return [
      g
      for g in ALL_4X4
      if all(v in (0, g[r][c]) for r, row in enumerate(puzzle) for c, v in enumerate(row))
  ]

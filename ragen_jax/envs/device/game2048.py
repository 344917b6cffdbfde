"""2048 as pure JAX functions, with RAGEN's rules, rewards and text.

Dimensions: S the board side (`size`, 4 as RAGEN); A = 4 actions.

Rules: actions Up, Right, Down, Left slide every tile that way; two equal tiles that meet merge
into their sum, each tile at most once per move, the pair nearest the wall first (`slide`). After
a move that changes the board a new tile appears on a uniformly random empty cell: 2 with
probability `two_prob`, else 4 (a new game starts with two of them). Reward: the sum of the tiles
the move made by merging, or with `use_log_reward` 0.1 * log2(sum + 1). A move that changes
nothing leaves the board (no tile spawns), reports `action_is_valid` and `action_is_effective`
False and pays `invalid_penalty`. Done when no move can change the board; success is RAGEN's
rule: done with a tile of at least 2048 (reaching 2048 does not end the game).
"""

import dataclasses
import re
from typing import Annotated, Dict, List, Optional, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.config_checks import check_fields, FiniteFloat, Range, UnitFloat
from ragen_jax.envs.device import base

UP, RIGHT, DOWN, LEFT = range(4)
WIN_TILE = 2048

# RAGEN's instruction (config/envs.yaml: game_2048); "{n}" is the board side.
INSTRUCTION = (
    "You are playing the 2048 game on a {n}x{n} grid. Merge equal tiles by sliding Up, Right, "
    "Down, or Left.\nIf a move is invalid (no tiles move), a small penalty is applied. Respond "
    "with a single action.\nExample: <answer>Up</answer>\n"
)
_ROW = re.compile(r"^Row (\d+): \[([^\]]*)\]$", re.MULTILINE)
_SCORE = re.compile(r"^Current Score: (\d+)$", re.MULTILINE)


@struct.dataclass
class Game2048State:
  board_SxS: jax.Array  # int32 tile values, 0 = empty
  score: jax.Array  # int32: the merged tiles' sum so far (RAGEN's "Current Score")
  num_steps: jax.Array  # int32: moves played, unchanging ones included
  done: jax.Array  # bool: no move can change the board


# ------------------------------------------------------------------ the rule


def _compact_S(line_S: jax.Array) -> jax.Array:
  """The non-zero tiles in order at the front, zeros behind (a stable compaction)."""
  s = line_S.shape[-1]
  filled = line_S != 0
  slot = jnp.where(filled, jnp.cumsum(filled) - 1, s)  # s: out of range, dropped
  return jnp.zeros_like(line_S).at[slot].set(line_S, mode="drop")


def _merge_left_S(line_S: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """(the line slid towards index 0, the merged tiles' sum)."""
  packed = _compact_S(line_S)
  s = packed.shape[-1]
  # Pair i merges cells i and i + 1 unless cell i was already taken by pair i - 1: scanning from
  # the wall is what forbids double merges ([2, 2, 4] gives [4, 4], not [8]). Unrolled over
  # the S - 1 pairs: S is static and small.
  starts = []
  taken = jnp.bool_(False)
  for i in range(s - 1):
    start = (packed[i] != 0) & (packed[i] == packed[i + 1]) & ~taken
    starts.append(start)
    taken = start
  start_S = jnp.stack(starts + [jnp.bool_(False)])
  eaten_S = jnp.concatenate([jnp.zeros((1,), jnp.bool_), start_S[:-1]])
  merged_S = jnp.where(start_S, 2 * packed, jnp.where(eaten_S, 0, packed))
  return _compact_S(merged_S), jnp.sum(jnp.where(start_S, 2 * packed, 0))


def _to_left(board_SxS: jax.Array, action) -> jax.Array:
  """The board turned so that `action` slides towards column 0 (its own inverse per action)."""
  flips = {UP: lambda b: b.T, RIGHT: lambda b: b[:, ::-1], DOWN: lambda b: b[::-1].T}
  return flips.get(action, lambda b: b)(board_SxS)


def _from_left(board_SxS: jax.Array, action) -> jax.Array:
  flips = {UP: lambda b: b.T, RIGHT: lambda b: b[:, ::-1], DOWN: lambda b: b.T[::-1]}
  return flips.get(action, lambda b: b)(board_SxS)


def slide_all(board_SxS: jax.Array) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`slide` for the four actions at once: (boards [A, S, S], merged sums [A], moved [A])."""
  boards, scores = [], []
  for action in range(4):
    rows_SxS, score_S = jax.vmap(_merge_left_S)(_to_left(board_SxS, action))
    boards.append(_from_left(rows_SxS, action))
    scores.append(jnp.sum(score_S))
  boards_AxSxS = jnp.stack(boards)
  moved_A = jnp.any(boards_AxSxS != board_SxS[None], axis=(1, 2))
  return boards_AxSxS, jnp.stack(scores), moved_A


def slide(board_SxS, action) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """One move of 2048 on tile values (0 = empty), before any new tile: (new board, the sum of
  the tiles made by merging, whether anything changed). Actions 0..3 = Up, Right, Down, Left;
  pure, so it jits and vmaps (over boards and traced actions)."""
  board_SxS = jnp.asarray(board_SxS, jnp.int32)
  boards_AxSxS, scores_A, moved_A = slide_all(board_SxS)
  a = jnp.clip(jnp.asarray(action, jnp.int32), 0, 3)
  return boards_AxSxS[a], scores_A[a], moved_A[a]


def movable(board_SxS, xp=jnp):
  """bool [A]: which actions would change the board (an empty cell ahead of a tile, or two
  equal neighbours along the move). `xp` is jax.numpy on the device, numpy for host text."""
  b = xp.asarray(board_SxS)
  out = []
  for action in range(4):
    rows = _to_left(b, action)
    ahead, behind = rows[:, :-1], rows[:, 1:]
    gap = (ahead == 0) & (behind != 0)
    pair = (ahead != 0) & (ahead == behind)
    out.append(xp.any(gap | pair))
  return xp.stack(out)


def spawn(key: jax.Array, board_SxS: jax.Array, two_prob: float) -> jax.Array:
  """A 2 (probability `two_prob`) or a 4 on a uniformly random empty cell; a full board stays."""
  k_cell, k_value = jax.random.split(key)
  empty_N = board_SxS.reshape(-1) == 0
  # The largest of iid uniforms over the empty cells is at a uniformly random one of them.
  cell = jnp.argmax(jnp.where(empty_N, jax.random.uniform(k_cell, empty_N.shape), -1.0))
  value = jnp.where(jax.random.uniform(k_value) < two_prob, 2, 4).astype(board_SxS.dtype)
  flat = board_SxS.reshape(-1)
  return jnp.where(jnp.any(empty_N), flat.at[cell].set(value), flat).reshape(board_SxS.shape)


# ------------------------------------------------------------------ the environment


@dataclasses.dataclass(frozen=True)
class Game2048(base.Env):
  """RAGEN's 2048: a new game (two random tiles) at every reset."""

  name = "2048"
  action_names = ("Up", "Right", "Down", "Left")

  # int32 tiles: a tile of 2^31 takes some 2^30 moves, far beyond any episode.
  size: Annotated[int, Range(2, 8)] = 4
  two_prob: UnitFloat = 0.9  # P(a new tile is a 2, not a 4)
  use_log_reward: bool = True  # reward 0.1 * log2(merged sum + 1) instead of the sum
  # RAGEN scores an unchanging move -0.1, but its log reward transforms only positive values and
  # so turns it into 0; here it is paid as given, whatever `use_log_reward` (0.0 plays RAGEN's).
  invalid_penalty: FiniteFloat = -0.1

  def __post_init__(self):
    check_fields(self, self.name)
    if not isinstance(self.use_log_reward, bool):
      raise ValueError(f"2048.use_log_reward must be a bool, got {self.use_log_reward!r}")

  def instruction(self, render_format: str = "grid") -> str:
    del render_format  # one text format
    return INSTRUCTION.format(n=self.size)

  # ---------------------------------------------------------------- device side

  def reset(self, key: jax.Array) -> Game2048State:
    k_first, k_second = jax.random.split(key)
    board = jnp.zeros((self.size, self.size), jnp.int32)
    board = spawn(k_second, spawn(k_first, board, self.two_prob), self.two_prob)
    return Game2048State(board, jnp.int32(0), jnp.int32(0), jnp.bool_(False))

  def step(self, key, state: Game2048State, action) -> base.StepResult:
    action = jnp.asarray(action, jnp.int32)
    in_range = (action >= 0) & (action < 4)
    live = in_range & ~state.done
    board, merged, moved = slide(state.board_SxS, action)
    effective = live & moved
    board = jnp.where(effective, spawn(key, board, self.two_prob), state.board_SxS)
    gain = merged.astype(jnp.float32)
    if self.use_log_reward:
      gain = 0.1 * jnp.log2(gain + 1.0)
    reward = jnp.where(effective, gain, jnp.where(live, self.invalid_penalty, 0.0))
    done = state.done | (effective & ~jnp.any(movable(board)))
    max_tile = jnp.max(board)
    new_state = Game2048State(
        board,
        state.score + jnp.where(effective, merged, 0),
        state.num_steps + live.astype(jnp.int32),
        done,
    )
    info = {
        "success": done & (max_tile >= WIN_TILE),
        "action_is_valid": in_range & moved,
        "action_is_effective": effective,
        "max_tile": max_tile,
    }
    return new_state, reward.astype(jnp.float32), done, info

  # ---------------------------------------------------------------- host side

  def render(self, state: Game2048State, fmt: str = "grid") -> str:
    """RAGEN's text (one format: every `fmt` gives it): the rows, the actions that would change
    the board, the goal, the score and the question."""
    base.check_format(fmt)
    board, score = (np.asarray(x) for x in jax.device_get((state.board_SxS, state.score)))
    lines = ["Current 2048 Grid:"]
    lines += [
        f"Row {i + 1}: [{', '.join(str(int(v)) for v in row)}]" for i, row in enumerate(board)
    ]
    valid = [f"{a}({self.action_names[a]})" for a in np.flatnonzero(movable(board, np))]
    lines += [
        "",
        f"Valid Actions: {', '.join(valid) if valid else 'None'}.",
        "Goal: Merge same numbers to reach 2048.",
        f"Current Score: {int(score)}",
        "What is your next move?",
    ]
    return "\n".join(lines)

  def from_text(self, text: str) -> Game2048State:
    """Parses the rows (and the score, 0 when absent) of `render`'s text."""
    rows = _ROW.findall(text)
    if [int(i) for i, _ in rows] != list(range(1, self.size + 1)):
      raise ValueError(
          f"2048 text needs lines 'Row 1: [...]' to 'Row {self.size}: [...]' for size="
          f"{self.size}, found rows {[int(i) for i, _ in rows]}."
      )
    try:
      values = [[int(v) for v in cells.split(",")] for _, cells in rows]
    except ValueError as e:
      raise ValueError(f"2048 rows must hold integers: {e}") from e
    if any(len(row) != self.size for row in values):
      raise ValueError(
          f"2048 rows have {[len(row) for row in values]} cells, but this env has size="
          f"{self.size}."
      )
    board = np.array(values, np.int64)
    tiles = board[board != 0]
    if np.any(tiles < 2) or np.any(tiles & (tiles - 1)) or np.any(tiles >= 2**31):
      raise ValueError(f"2048 tiles are 0 or powers of two from 2 to 2^30, got {sorted(tiles)}.")
    score = _SCORE.search(text)
    return Game2048State(
        jnp.asarray(board, jnp.int32),
        jnp.int32(int(score.group(1)) if score else 0),
        jnp.int32(0),
        jnp.bool_(not movable(board, np).any()),
    )

  def episode_metrics(self, observation: str) -> Dict[str, float]:
    """The largest tile of the episode's last board."""
    return {"max_tile": float(np.max(np.asarray(self.from_text(observation).board_SxS)))}

  def expert(self, state: Game2048State) -> Tuple[Optional[List[int]], str]:
    """The move of best expected value one new tile ahead (`lookahead_values`), which keeps the
    tiles ordered from the top-left corner; None when no move changes the board."""
    board = np.asarray(jax.device_get(state.board_SxS))
    values = np.asarray(lookahead_values(jnp.asarray(board, jnp.int32), self.two_prob))
    best = int(np.argmax(values))
    # Short: a demonstration's reply must fit the smoke configs' 24 new tokens.
    tile = int(board.max())
    if not np.isfinite(values[best]):
      return None, f"Max {tile}: no move left."
    return [best], f"Max {tile}: {self.action_names[best]} keeps it cornered."


def snake_value(boards_xSxS: jax.Array) -> jax.Array:
  """How well boards keep their tiles in order along a snake from the top-left corner (row 0
  left to right, row 1 back, ...; each cell weighs a quarter of the one before), the largest
  tile counting 1, plus a little per empty cell: the expert's evaluation, [...] per board."""
  s = boards_xSxS.shape[-1]
  order = np.arange(s * s).reshape(s, s)
  order[1::2] = order[1::2, ::-1]
  weights = jnp.asarray(4.0**-order, jnp.float32).reshape((1,) * (boards_xSxS.ndim - 2) + (s, s))
  tiles = boards_xSxS.astype(jnp.float32)
  scale = jnp.maximum(jnp.max(tiles, axis=(-2, -1)), 2.0)
  ordered = jnp.sum(tiles * weights, axis=(-2, -1)) / scale
  return ordered + 0.03 * jnp.sum(boards_xSxS == 0, axis=(-2, -1))


@jax.jit
def lookahead_values(board_SxS: jax.Array, two_prob) -> jax.Array:
  """[A] expectimax value of each move: over the new tile (each empty cell; 2 with probability
  `two_prob`, else 4), the best next move's `snake_value`; -inf for a move that changes nothing.
  A new tile after which nothing moves counts as a loss (-1e9)."""
  s = board_SxS.shape[-1]
  boards_AxSxS, _, moved_A = slide_all(board_SxS)
  cells_NxSxS = jnp.eye(s * s, dtype=jnp.bool_).reshape(s * s, s, s)
  empty_AxN = (boards_AxSxS == 0).reshape(4, s * s)

  def best_next(board):  # [S, S] -> the best next move's value
    nexts_AxSxS, _, next_moved_A = slide_all(board)
    return jnp.max(jnp.where(next_moved_A, snake_value(nexts_AxSxS), -1e9))

  def expected(board, empty_N):  # one move's board -> its value averaged over new tiles
    def with_tile(value):
      placed = jnp.where(cells_NxSxS & (board == 0)[None], value, board[None])
      return jax.vmap(best_next)(placed)

    value_N = two_prob * with_tile(2) + (1.0 - two_prob) * with_tile(4)
    return jnp.sum(jnp.where(empty_N, value_N, 0.0)) / jnp.maximum(jnp.sum(empty_N), 1)

  return jnp.where(moved_A, jax.vmap(expected)(boards_AxSxS, empty_AxN), -jnp.inf)

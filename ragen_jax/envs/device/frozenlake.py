"""FrozenLake as pure JAX functions, RAGEN's variant (random maps, random start and goal).

Dimensions: S the board side (`size`); N = S * S cells; M candidate maps per round.

Maps: every tile frozen with probability `p`, start and goal on distinct uniformly random tiles,
redrawn until a 4-connected path of non-hole tiles joins them (a flood fill). Actions Left,
Down, Right, Up; slippery moves go the intended way with probability `success_rate` and each
perpendicular way with half the rest; a move into the border leaves the player in place.
Reaching the goal pays 1 and ends the episode; a hole ends it with 0; `max_steps` bounds it.
"""

import collections
import dataclasses
from typing import Annotated, Dict, List, Optional, Tuple

from flax import struct
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from ragen_jax.config_checks import check_fields, PositiveInt, Range, UnitFloat
from ragen_jax.envs.device import base

# Row/column deltas for action indices 0..3 = Left, Down, Right, Up (gymnasium's order, so the
# perpendicular directions of action a are (a - 1) % 4 and (a + 1) % 4).
_DELTAS = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], np.int32)
FROZEN, HOLE, GOAL = 0, 1, 2
# The text's symbols; `symbol_codes` gives each cell's index into this string.
SYMBOLS = "P_OGX√"
_LEGEND = (
    ("P", "player"),
    ("_", "empty"),
    ("O", "hole"),
    ("G", "goal"),
    ("X", "player in hole"),
    ("√", "player on goal"),
)
_MAX_ROUNDS = 64

# RAGEN's instructions (config/envs.yaml: FrozenLake, CoordFrozenLake), typos included.
INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move "
    "to the unintended direction due to the slippery ice. Example answer format: <think>To forbid "
    "the hole and go to the target, I should go left then go up.</think><answer>Left || "
    "Up</answer>"
)
COORD_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
    "zero-indexed coordinates for the start, goal, player, and any holes.\nCoordinates range "
    "from the top-left corner (0, 0) to the bottom-right corner {corner}.\nBeware that the ice "
    "is slippery, so the agent might slide and end up in an unintended tile.\nRespond with a "
    "sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)


@struct.dataclass
class FrozenLakeState:
  tiles_SxS: jax.Array  # int8: 0 frozen, 1 hole, 2 goal
  start_rc: jax.Array  # int32[2] (shown as frozen in the grid, listed in the coordinates)
  player_rc: jax.Array  # int32[2]
  num_steps: jax.Array  # int32
  done: jax.Array  # bool

  @property
  def player_SxS(self) -> jax.Array:
    return _cell_mask(self.player_rc, self.tiles_SxS.shape[-1])

  @property
  def start_SxS(self) -> jax.Array:
    return _cell_mask(self.start_rc, self.tiles_SxS.shape[-1])


def _cell_mask(rc_x2: jax.Array, s: int) -> jax.Array:
  """bool [..., S, S]: the cell (row, col) `rc_x2` [..., 2] marked, for any leading axes."""
  cells = jnp.arange(s * s).reshape((1,) * (rc_x2.ndim - 1) + (s * s,))
  grid = (rc_x2[..., 0] * s + rc_x2[..., 1])[..., None] == cells
  return grid.reshape(grid.shape[:-1] + (s, s))


@dataclasses.dataclass(frozen=True)
class FrozenLake(base.Env):
  """RAGEN's FrozenLake: a new random map at every reset."""

  name = "frozenlake"
  action_names = ("Left", "Down", "Right", "Up")

  size: Annotated[int, Range(2)] = 4
  p: Annotated[float, Range(0, 1, open_low=True)] = 0.9  # P(a tile is frozen, not a hole)
  success_rate: UnitFloat = 0.8  # probability that a move goes the intended way
  is_slippery: bool = True
  max_steps: PositiveInt = 100
  num_candidates: PositiveInt = 8  # maps drawn per round; the first valid one is used

  def __post_init__(self):
    check_fields(self, self.name)

  @property
  def grid_vocab(self) -> Dict[str, str]:
    return dict(_LEGEND)

  def instruction(self, render_format: str = "grid") -> str:
    if render_format == "grid":
      return INSTRUCTION
    return COORD_INSTRUCTION.format(corner=f"({self.size - 1}, {self.size - 1})")

  def expert(self, state: FrozenLakeState) -> Tuple[Optional[List[int]], str]:
    """The shortest hole-free path as action indices (breadth-first, ignoring slips), or None
    when there is none; the reasoning names player and goal."""
    tiles, player = np.asarray(state.tiles_SxS), tuple(int(x) for x in state.player_rc)
    goal = tuple(int(x) for x in np.argwhere(tiles == GOAL)[0])
    thought = f"Player {base.cells_text([player])}, goal {base.cells_text([goal])}."
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
      for a, (dr, dc) in enumerate(_DELTAS.tolist()):
        nxt = (cell[0] + dr, cell[1] + dc)
        inside = 0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size
        if inside and nxt not in parents and tiles[nxt] != HOLE:
          parents[nxt] = (cell, a)
          frontier.append(nxt)
    return None, thought

  # ---------------------------------------------------------------- device side

  def _candidate(self, key):
    s = self.size
    k_tiles, k_ends = jax.random.split(key)
    holes = jax.random.uniform(k_tiles, (s, s)) >= self.p
    _, ends = lax.top_k(jax.random.uniform(k_ends, (s * s,)), 2)
    start, goal = ends[0], ends[1]
    holes = holes.reshape(-1).at[start].set(False).at[goal].set(False).reshape(s, s)
    seed = jnp.zeros((s * s,), jnp.bool_).at[start].set(True).reshape(s, s)
    reach = base.flood_fill(seed, ~holes, s * s - 1)
    tiles = jnp.where(holes, HOLE, FROZEN).reshape(-1).at[goal].set(GOAL)
    return reach.reshape(-1)[goal], tiles.reshape(s, s).astype(jnp.int8), start, goal

  def reset(self, key: jax.Array) -> FrozenLakeState:
    def draw(k):
      valid_M, tiles_M, start_M, _ = jax.vmap(self._candidate)(
          jax.random.split(k, self.num_candidates)
      )
      i = jnp.argmax(valid_M)
      return valid_M[i], tiles_M[i], start_M[i]

    def body(carry):
      round_, _ = carry
      return round_ + 1, draw(jax.random.fold_in(key, round_))

    _, (_, tiles, start) = lax.while_loop(
        lambda c: ~c[1][0] & (c[0] < _MAX_ROUNDS),
        body,
        (jnp.int32(1), draw(jax.random.fold_in(key, 0))),
    )
    start_rc = jnp.stack([start // self.size, start % self.size]).astype(jnp.int32)
    return FrozenLakeState(tiles, start_rc, start_rc, jnp.int32(0), jnp.bool_(False))

  def step(self, key, state: FrozenLakeState, action) -> base.StepResult:
    action = jnp.asarray(action, jnp.int32)
    valid = (action >= 0) & (action < 4)
    intended = jnp.clip(action, 0, 3)
    if self.is_slippery:
      u = jax.random.uniform(key)
      slip = (1.0 - self.success_rate) / 2.0
      offset = jnp.where(u < self.success_rate, 0, jnp.where(u < self.success_rate + slip, -1, 1))
      direction = (intended + offset) % 4
    else:
      direction = intended
    active = valid & ~state.done
    moved = jnp.clip(state.player_rc + jnp.asarray(_DELTAS)[direction], 0, self.size - 1)
    player = jnp.where(active, moved, state.player_rc)
    tile = state.tiles_SxS[player[0], player[1]]
    success = tile == GOAL
    reward = jnp.where(active & success, 1.0, 0.0).astype(jnp.float32)
    num_steps = state.num_steps + active.astype(jnp.int32)
    done = state.done | success | (tile == HOLE) | (num_steps >= self.max_steps)
    new_state = state.replace(player_rc=player, num_steps=num_steps, done=done)
    info = {
        "success": success,
        "action_is_valid": valid,
        "action_is_effective": jnp.any(player != state.player_rc),
    }
    return new_state, reward, done, info

  # ---------------------------------------------------------------- host side

  def render(self, state: FrozenLakeState, fmt: str = "grid") -> str:
    return self._texts(base.one_row(state), fmt)[0]

  def render_batch(self, states: FrozenLakeState, rows, fmt: str = "grid") -> List[str]:
    return self._texts(base.take_rows(states, rows), fmt)

  def _texts(self, host: FrozenLakeState, fmt: str) -> List[str]:
    """RAGEN's texts for every row of a batched NumPy state, vectorised over the rows."""
    tiles_RxSxS = host.tiles_SxS
    shape = tiles_RxSxS.shape[-2:]
    cell = lambda rc_Rx2: rc_Rx2[:, 0] * shape[1] + rc_Rx2[:, 1]
    player_RxSxS = base.cell_masks(cell(host.player_rc), shape)
    hole, goal = tiles_RxSxS == HOLE, tiles_RxSxS == GOAL
    symbols = np.array(list(SYMBOLS))[symbol_codes(tiles_RxSxS, player_RxSxS, np)]
    entries = [
        ("Start", base.cell_masks(cell(host.start_rc), shape)),
        ("Goal", goal),
        ("Player", player_RxSxS & (tiles_RxSxS == FROZEN)),
        ("Player on goal", player_RxSxS & goal),
        ("Player in hole", player_RxSxS & hole),
        ("Holes", hole),
    ]
    return base.board_texts(fmt, symbols, entries)

  def from_text(self, text: str) -> FrozenLakeState:
    """Parses a grid; the start tile is not drawn, so it is taken to be the player's tile."""
    grid = base.parse_grid(text, SYMBOLS, self.name)
    if grid.shape != (self.size, self.size):
      raise ValueError(f"Grid is {grid.shape}, but this env has size={self.size}.")
    players = np.argwhere(np.isin(grid, ["P", "X", "√"]))
    goals = np.argwhere(np.isin(grid, ["G", "√"]))
    if len(players) != 1 or len(goals) != 1:
      raise ValueError(
          f"FrozenLake grid needs one player and one goal, found {len(players)} "
          f"and {len(goals)}."
      )
    tiles = np.where(
        np.isin(grid, ["O", "X"]), HOLE, np.where(np.isin(grid, ["G", "√"]), GOAL, FROZEN)
    ).astype(np.int8)
    player = jnp.asarray(players[0], jnp.int32)
    done = bool(grid[tuple(players[0])] in ("X", "√"))
    return FrozenLakeState(jnp.asarray(tiles), player, player, jnp.int32(0), jnp.bool_(done))


def symbol_codes(tiles_SxS, player_SxS, xp=jnp):
  """Each cell's symbol as its index into `SYMBOLS`, for any leading axes: the text on the host
  (`xp=np`) and the image on the device (`envs.device.visual`) read the board through it."""
  code = SYMBOLS.index
  hole, goal = tiles_SxS == HOLE, tiles_SxS == GOAL
  codes = xp.where(hole, code("O"), xp.where(goal, code("G"), code("_")))
  on_tile = xp.where(hole, code("X"), xp.where(goal, code("√"), code("P")))
  return xp.where(player_SxS, on_tile, codes)

"""Sokoban as pure JAX functions, with gym-sokoban's rules and RAGEN's text.

Dimensions: H, W room rows and columns.

Rules (gym-sokoban push actions, as RAGEN steps them): actions Up, Down, Left, Right move the
player one cell; walking into a box pushes it when the cell behind is floor or target; a wall, or
a second box behind the first, blocks the push and the move is a no-op that still costs the step.
Reward per step: -0.1; +1 when a box lands on a target; -1 when one leaves a target; +10 more
when every box is on a target. Done when solved or after `max_steps` steps.
"""

import collections
import dataclasses
from typing import Dict, List, Optional, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.config_checks import check_fields, check_value, FiniteFloat, PositiveInt
from ragen_jax.envs.device import base
from ragen_jax.envs.device import sokoban_generator

# RAGEN's instructions (config/envs.yaml: Sokoban, CoordSokoban). "{corner}" is the bottom-right
# coordinate; RAGEN hard-codes "(5, 5)", which is wrong for boards other than 6x6.
INSTRUCTION = (
    "You are solving the Sokoban puzzle. \nYou are the player and you need to push all boxes to "
    "targets. \nWhen you are right next to a box, you can push it by moving in the same "
    "direction. \nYou cannot push a box through a wall, and you cannot pull a box. \nThe answer "
    "should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
)
COORD_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets.\nYou are provided with a symbol grid and the zero-indexed coordinates of the "
    "player, each box, and each target. \nCoordinates range from the top-left corner (0, 0) to "
    "the bottom-right corner {corner}. \nWhen you are exactly next to a box, you can push it by "
    "moving in the same direction. \nYou cannot push a box through a wall, and you cannot pull "
    "a box.\nThe answer should be a sequence of actions, like "
    "<answer>Right || Right || Up</answer>.\n"
)
_EXPERT_DEPTH = 30  # breadth-first search depth of the expert's plan

# Row/column deltas for the action indices 0..3 = Up, Down, Left, Right.
_DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)
# Cell codes of `fixed_HxW`.
WALL, FLOOR, TARGET = 0, 1, 2
# The text's symbols; `symbol_codes` gives each cell's index into this string.
SYMBOLS = "#_O√XPS"
_LEGEND = (
    ("#", "wall"),
    ("_", "empty"),
    ("O", "target"),
    ("√", "box on target"),
    ("X", "box"),
    ("P", "player"),
    ("S", "player on target"),
)


@struct.dataclass
class SokobanState:
  """Cells are flat indices r * W + c; the grid views below work on batched states too."""

  fixed_HxW: jax.Array  # int8: 0 wall, 1 floor, 2 target (never changes)
  boxes_K: jax.Array  # int32[K]: the boxes' cells (K static: boxes are never created)
  player: jax.Array  # int32: the player's cell
  num_steps: jax.Array  # int32: steps taken
  done: jax.Array  # bool

  @property
  def boxes_HxW(self) -> jax.Array:
    h, w = self.fixed_HxW.shape[-2:]
    cells = jnp.arange(h * w).reshape((1,) * self.boxes_K.ndim + (h * w,))
    grid = jnp.any(self.boxes_K[..., :, None] == cells, axis=-2)
    return grid.reshape(grid.shape[:-1] + (h, w))

  @property
  def player_HxW(self) -> jax.Array:
    h, w = self.fixed_HxW.shape[-2:]
    cells = jnp.arange(h * w).reshape((1,) * self.player.ndim + (h * w,))
    grid = self.player[..., None] == cells
    return grid.reshape(grid.shape[:-1] + (h, w))

  @property
  def player_rc(self) -> jax.Array:
    w = self.fixed_HxW.shape[-1]
    return jnp.stack([self.player // w, self.player % w], axis=-1)


@dataclasses.dataclass(frozen=True)
class Sokoban(base.Env):
  """Sokoban with on-device level generation in `reset` (see sokoban_generator)."""

  name = "sokoban"
  action_names = ("Up", "Down", "Left", "Right")

  dim_room: Tuple[int, int] = (6, 6)
  num_boxes: int = 1
  max_steps: PositiveInt = 100
  search_depth: PositiveInt = 40  # steps of each reverse walk (RAGEN: the reverse DFS depth)
  num_reverse_walks: PositiveInt = 32  # parallel reverse walks per room
  num_gen_steps: Optional[int] = None  # topology walk; None -> int(1.7 * (H + W))
  num_candidates: PositiveInt = 4  # rooms drawn per try (RAGEN: 4 topology tries)
  step_reward: FiniteFloat = -0.1
  box_on_target_reward: FiniteFloat = 1.0
  solved_reward: FiniteFloat = 10.0

  def __post_init__(self):
    check_fields(self, self.name)
    if self.num_gen_steps is not None:
      check_value(f"{self.name}.num_gen_steps", self.num_gen_steps, PositiveInt)
    object.__setattr__(self, "dim_room", tuple(int(d) for d in self.dim_room))
    h, w = self.dim_room
    if h < 4 or w < 4:
      raise ValueError(f"sokoban dim_room must be at least (4, 4), got {self.dim_room}.")
    if not 1 <= self.num_boxes <= (h - 2) * (w - 2) - 2:
      raise ValueError(f"sokoban num_boxes={self.num_boxes} does not fit a {h}x{w} room.")

  @property
  def grid_vocab(self) -> Dict[str, str]:
    return dict(_LEGEND)

  def instruction(self, render_format: str = "grid") -> str:
    if render_format == "grid":
      return INSTRUCTION
    h, w = self.dim_room
    return COORD_INSTRUCTION.format(corner=f"({h - 1}, {w - 1})")

  def expert(self, state: SokobanState) -> Tuple[Optional[List[int]], str]:
    """The first moves of an optimal plan (breadth-first `solve`), or None when the level
    cannot be solved any more; the reasoning names player, boxes and targets."""
    fixed, boxes, player = (x[0] for x in _host_masks(base.one_row(state)))
    targets = np.argwhere(fixed == TARGET)
    thought = (
        f"Player {base.cells_text(np.argwhere(player))}, box {base.cells_text(np.argwhere(boxes))}, "
        f"target {base.cells_text(targets)}."
    )
    return solve(state, _EXPERT_DEPTH), thought

  # ---------------------------------------------------------------- device side

  def reset(self, key: jax.Array) -> SokobanState:
    return jax.tree.map(lambda x: x[0], self.reset_batch(key[None]))

  def reset_batch(self, keys_B: jax.Array) -> SokobanState:
    """Same levels as `vmap(reset)` over the keys, faster: rare retries cost a few lanes."""
    h, w = self.dim_room
    gen_steps = self.num_gen_steps or int(1.7 * (h + w))
    floor_BxN, targets_BxK, boxes_BxK, player_B, _ = sokoban_generator.generate(
        keys_B,
        self.dim_room,
        self.num_boxes,
        gen_steps,
        self.search_depth,
        self.num_reverse_walks,
        self.num_candidates,
    )
    batch = keys_B.shape[0]
    is_target = jnp.any(targets_BxK[:, :, None] == jnp.arange(h * w)[None, None, :], axis=1)
    fixed = jnp.where(is_target, TARGET, jnp.where(floor_BxN, FLOOR, WALL)).astype(jnp.int8)
    return SokobanState(
        fixed.reshape(batch, h, w),
        boxes_BxK,
        player_B,
        jnp.zeros((batch,), jnp.int32),
        jnp.zeros((batch,), jnp.bool_),
    )

  def step(self, key, state: SokobanState, action) -> base.StepResult:
    del key  # Deterministic dynamics.
    h, w = self.dim_room
    n = h * w
    action = jnp.asarray(action, jnp.int32)
    valid = (action >= 0) & (action < 4)
    dr, dc = jnp.asarray(_DELTAS)[jnp.clip(action, 0, 3)]
    fixed_N = state.fixed_HxW.reshape(n)
    row, col = state.player // w, state.player % w

    def cell(k):
      # The wall ring keeps generated levels on the board; a hand-made grid without one may
      # send a move off it, which then counts as a wall.
      r, c = row + k * dr, col + k * dc
      on_board = (r >= 0) & (r < h) & (c >= 0) & (c < w)
      flat = jnp.clip(r * w + c, 0, n - 1)
      return flat, on_board & (fixed_N[flat] != WALL)

    (nxt, nxt_ok), (beyond, beyond_ok) = cell(1), cell(2)
    hit_K = state.boxes_K == nxt
    nxt_box = jnp.any(hit_K)
    beyond_free = beyond_ok & ~jnp.any(state.boxes_K == beyond)
    active = valid & ~state.done
    moves = active & nxt_ok & (~nxt_box | beyond_free)
    boxes_K = jnp.where(moves & hit_K, beyond, state.boxes_K)
    player = jnp.where(moves, nxt, state.player)
    target_N = fixed_N == TARGET
    on_before = jnp.sum(target_N[state.boxes_K])
    on_after = jnp.sum(target_N[boxes_K])
    solved = on_after == self.num_boxes
    reward = (
        self.step_reward
        + self.box_on_target_reward * (on_after - on_before).astype(jnp.float32)
        + jnp.where(solved, self.solved_reward, 0.0)
    )
    reward = jnp.where(active, reward, 0.0).astype(jnp.float32)
    num_steps = state.num_steps + active.astype(jnp.int32)
    done = state.done | solved | (num_steps >= self.max_steps)
    new_state = SokobanState(state.fixed_HxW, boxes_K, player, num_steps, done)
    info = {"success": solved, "action_is_valid": valid, "action_is_effective": moves}
    return new_state, reward, done, info

  # ---------------------------------------------------------------- host side

  def render(self, state: SokobanState, fmt: str = "grid") -> str:
    return self._texts(base.one_row(state), fmt)[0]

  def render_batch(self, states: SokobanState, rows, fmt: str = "grid") -> List[str]:
    return self._texts(base.take_rows(states, rows), fmt)

  def _texts(self, host: SokobanState, fmt: str) -> List[str]:
    """RAGEN's texts for every row of a batched NumPy state, vectorised over the rows."""
    fixed_RxHxW, boxes_RxHxW, player_RxHxW = _host_masks(host)
    target = fixed_RxHxW == TARGET
    symbols = np.array(list(SYMBOLS))[symbol_codes(fixed_RxHxW, boxes_RxHxW, player_RxHxW, np)]
    entries = [
        ("Targets", target),
        ("Boxes", boxes_RxHxW & ~target),
        ("Boxes on target", boxes_RxHxW & target),
        ("Player", player_RxHxW & ~target),
        ("Player on target", player_RxHxW & target),
    ]
    return base.board_texts(fmt, symbols, entries)

  def from_text(self, text: str) -> SokobanState:
    grid = base.parse_grid(text, SYMBOLS, self.name)
    if grid.shape != self.dim_room:
      raise ValueError(f"Grid is {grid.shape}, but this env has dim_room={self.dim_room}.")
    players = np.argwhere((grid == "P") | (grid == "S"))
    if len(players) != 1:
      raise ValueError(f"Sokoban grid needs exactly one player (P or S), found {len(players)}.")
    boxes = (grid == "X") | (grid == "√")
    targets = (grid == "O") | (grid == "√") | (grid == "S")
    if boxes.sum() != self.num_boxes or targets.sum() != self.num_boxes:
      raise ValueError(
          f"Grid has {boxes.sum()} boxes and {targets.sum()} targets; this env "
          f"has num_boxes={self.num_boxes}."
      )
    fixed = np.where(grid == "#", WALL, np.where(targets, TARGET, FLOOR)).astype(np.int8)
    solved = bool((boxes & targets).sum() == self.num_boxes)
    w = self.dim_room[1]
    return SokobanState(
        jnp.asarray(fixed),
        jnp.asarray(np.flatnonzero(boxes), jnp.int32),
        jnp.int32(players[0][0] * w + players[0][1]),
        jnp.int32(0),
        jnp.bool_(solved),
    )


def symbol_codes(fixed_HxW, boxes_HxW, player_HxW, xp=jnp):
  """Each cell's symbol as its index into `SYMBOLS`, for any leading axes: the text on the host
  (`xp=np`) and the image on the device (`envs.device.visual`) read the board through it."""
  code = SYMBOLS.index
  target = fixed_HxW == TARGET
  codes = xp.where(fixed_HxW == WALL, code("#"), xp.where(target, code("O"), code("_")))
  codes = xp.where(boxes_HxW, xp.where(target, code("√"), code("X")), codes)
  return xp.where(player_HxW, xp.where(target, code("S"), code("P")), codes)


def _host_masks(states: SokobanState) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(fixed, boxes, player) [R, H, W] of a batched host state, with NumPy: the `boxes_HxW`
  property is jnp, which would send a host state to the device and back."""
  fixed_RxHxW = np.asarray(states.fixed_HxW)
  shape = fixed_RxHxW.shape[-2:]
  return fixed_RxHxW, base.cell_masks(states.boxes_K, shape), base.cell_masks(states.player, shape)


def solve(state: SokobanState, max_depth: int = 100) -> Optional[List[int]]:
  """Breadth-first search for an optimal action list (indices into action_names), or None.

  Host-side and independent of the JAX step (its own push rule), so tests can use it as a
  second implementation. Returns [] for an already solved state and None when no solution of
  at most `max_depth` moves exists.
  """
  fixed, boxes, player_HxW = (x[0] for x in _host_masks(base.one_row(state)))
  player = np.argwhere(player_HxW)[0]
  h, w = fixed.shape
  walls = {(r, c) for r, c in np.argwhere(fixed == WALL)}
  targets = frozenset((int(r), int(c)) for r, c in np.argwhere(fixed == TARGET))
  start = (
      (int(player[0]), int(player[1])),
      frozenset((int(r), int(c)) for r, c in np.argwhere(np.asarray(boxes))),
  )
  if start[1] == targets:
    return []
  parents = {start: None}
  frontier = collections.deque([(start, 0)])
  while frontier:
    (pos, bxs), depth = frontier.popleft()
    if depth >= max_depth:
      continue
    for a, (dr, dc) in enumerate(_DELTAS.tolist()):
      nxt = (pos[0] + dr, pos[1] + dc)
      if nxt in walls or not (0 <= nxt[0] < h and 0 <= nxt[1] < w):
        continue
      new_boxes = bxs
      if nxt in bxs:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in bxs or not (0 <= beyond[0] < h and 0 <= beyond[1] < w):
          continue
        new_boxes = (bxs - {nxt}) | {beyond}
      child = (nxt, new_boxes)
      if child in parents:
        continue
      parents[child] = ((pos, bxs), a)
      if new_boxes == targets:
        path = []
        node = child
        while parents[node] is not None:
          node, act = parents[node]
          path.append(act)
        return path[::-1]
      frontier.append((child, depth + 1))
  return None

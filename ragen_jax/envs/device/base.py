"""What every environment shares: the pure-function contract and coordinate text.

An environment is a frozen (hashable) dataclass holding only Python constants (shapes, rewards,
probabilities), so `jax.jit(env.step)` closes over it and `jax.vmap` maps over states and keys:

  state = env.reset(key)                                   # pure; same key -> same level
  states = env.reset_batch(keys)                           # the same as vmap(reset)
  state, reward, done, info = env.step(key, state, action) # pure; int32 action index
  text = env.render(state)                                 # host side, one unbatched state
  texts = env.render_batch(states, rows, fmt)              # host side, rows of a batched state
  state = env.from_text(text)                              # inverse of render for the grid format

Rendering is host work on NumPy arrays: given a host state (`jax.device_get`) it moves nothing
to a device, and the rollout renders every stepped row of a turn in one `render_batch` call.
`info` is a dict of arrays with at least `success`, `action_is_effective` and `action_is_valid`.
An environment that can demonstrate defines `expert(state) -> (plan as action indices or None,
short reasoning text)` for one unbatched state: the scripted expert of `ragen_jax.warm_start.demos`.
A visual environment also draws a state: `render_image(state)` gives uint8 [H, W, 3] in jax.numpy
for one unbatched state (jit- and vmap-able, rendered on the device beside `step`), and
`image_shape` is that frame's shape; it is None for an environment seen only as text. A
visual environment alone takes render format "image" (`IMAGE`): the text then says the board is
in the picture and holds no grid symbol, so the frame is the only view of the state.
`episode_metrics(observation)` gives figures of an episode's last observation that training logs
beside the rollout's own (2048's largest tile); none by default. `memory(history)` gives the
text that stands in for the turns a context window leaves out; none by default.
Stepping a finished episode is a no-op with zero reward (the batch keeps its static shape while
other episodes continue). An out-of-range action is a no-op that costs no step and reports
`action_is_valid=False`.
"""

import abc
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

Info = Dict[str, jax.Array]
StepResult = Tuple[Any, jax.Array, jax.Array, Info]

IMAGE = "image"  # the state in the frame only (visual environments)
TEXT_FORMATS = ("grid", "coord", "grid_coord")  # RAGEN's: the board as text
RENDER_FORMATS = TEXT_FORMATS + (IMAGE,)
SYMBOL_FORMATS = ("grid", "grid_coord")  # the texts that show the grid's symbols: the legend's


class Env(abc.ABC):
  """Abstract base; concrete environments are frozen dataclasses."""

  name: str = ""
  action_names: Tuple[str, ...] = ()

  @property
  def num_actions(self) -> int:
    return len(self.action_names)

  @abc.abstractmethod
  def reset(self, key: jax.Array) -> Any:
    """Returns the initial state drawn with `key` (pure: same key, same state)."""

  def reset_batch(self, keys_B: jax.Array) -> Any:
    """Initial states for a batch of keys, equal to `vmap(reset)`; Sokoban overrides it with a
    faster batched generator."""
    return jax.vmap(self.reset)(keys_B)

  @abc.abstractmethod
  def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
    """Returns (next_state, reward float32, done bool, info dict of arrays)."""

  @abc.abstractmethod
  def render(self, state: Any, fmt: str = "grid") -> str:
    """RAGEN's text for one unbatched state."""

  def render_batch(self, states: Any, rows: Sequence[int], fmt: str = "grid") -> List[str]:
    """RAGEN's texts for rows `rows` of a batched host state, in order; per row by default, the
    grid worlds vectorised over the rows."""
    return [self.render(jax.tree.map(lambda x, i=i: x[i], states), fmt) for i in rows]

  @abc.abstractmethod
  def from_text(self, text: str) -> Any:
    """Parses the grid text back into a state (for tests and hand-built scenarios)."""

  def action_names_for(self, state: Any) -> Tuple[str, ...]:
    """The action names as shown to the agent in `state` (fixed for grid worlds)."""
    del state
    return self.action_names

  @property
  def image_shape(self) -> Optional[Tuple[int, int, int]]:
    """[H, W, 3] of `render_image`'s frames, or None for an environment seen only as text."""
    return None

  def render_image(self, state: Any) -> jax.Array:
    """The state as an RGB image, uint8 `image_shape`, in jax.numpy (vmap it for a batch)."""
    raise ValueError(f"environment {self.name!r} has no image observation (image_shape is None)")

  @property
  def grid_vocab(self) -> Dict[str, str]:
    """Symbol -> meaning, in RAGEN's legend order (empty for text-only environments)."""
    return {}

  def episode_metrics(self, observation: str) -> Dict[str, float]:
    """Figures of an episode read from its last observation, logged per tag beside the
    rollout's metrics (`ragen_jax.train.batching.add_env_metrics`); none by default."""
    del observation
    return {}

  def memory(self, history: Sequence[Dict[str, str]]) -> str:
    """RAGEN's memory hook for context windows (`rollout.context_window`): text standing in
    for the turns a prompt leaves out, given their chat messages (user and assistant, in
    order); it opens the first user message shown. None by default ("")."""
    del history
    return ""

  def instruction(self, render_format: str = "grid") -> str:
    """RAGEN's system-prompt text for this environment and render format ("" for Bandit,
    whose observation explains the task)."""
    del render_format
    return ""


def flood_fill(seed_HxW: jax.Array, passable_HxW: jax.Array, steps: int) -> jax.Array:
  """Cells 4-connected to `seed` through `passable` cells, after `steps` growth steps.

  A fixed step count (at least the longest shortest path) keeps shapes and trip counts static,
  so it vmaps without waiting on the slowest lane of a `while_loop`.
  """

  def grow(_, reach):
    pad = jnp.pad(reach, 1)
    near = pad[:-2, 1:-1] | pad[2:, 1:-1] | pad[1:-1, :-2] | pad[1:-1, 2:]
    return reach | (near & passable_HxW)

  return lax.fori_loop(0, steps, grow, seed_HxW)


def check_format(fmt: str) -> None:
  if fmt not in RENDER_FORMATS:
    raise ValueError(f"Unknown render format {fmt!r}; expected one of {RENDER_FORMATS}.")


def check_render_format(env: Any, fmt: str) -> None:
  """Raises unless `env` can show its states in `fmt`: "image" needs a frame to show."""
  check_format(fmt)
  if fmt == IMAGE and getattr(env, "image_shape", None) is None:
    raise ValueError(
        f"render_format {IMAGE!r} shows the board only as an image, and environment "
        f"{getattr(env, 'name', env)!r} is not drawn as one (visual_sokoban and "
        "visual_frozenlake are)"
    )


def one_row(state: Any) -> Any:
  """An unbatched state as a host batch of one row (what `render` hands `render_batch`)."""
  return jax.tree.map(lambda x: np.asarray(x)[None], jax.device_get(state))


def take_rows(states: Any, rows: Sequence[int]) -> Any:
  """Rows `rows` of a batched state as NumPy arrays (an explicit copy if on a device)."""
  index_R = np.asarray(rows, np.int64)
  return jax.tree.map(lambda x: np.asarray(x)[index_R], jax.device_get(states))


def cell_masks(cells_RxK: np.ndarray, shape: Tuple[int, int]) -> np.ndarray:
  """bool [R, H, W]: each row's flat cells r * W + c marked (`cells` [R] or [R, K])."""
  h, w = shape
  cells_RxK = np.asarray(cells_RxK)
  cells_RxK = cells_RxK[:, None] if cells_RxK.ndim == 1 else cells_RxK
  return np.any(cells_RxK[:, :, None] == np.arange(h * w), axis=1).reshape(-1, h, w)


def grid_texts(symbols_RxHxW: np.ndarray) -> List[str]:
  """Each row's board of single-character symbols as lines of text."""
  r, h, w = symbols_RxHxW.shape
  lines_RxHxW1 = np.full((r, h, w + 1), "\n", "<U1")
  lines_RxHxW1[:, :, :w] = symbols_RxHxW
  # One fixed-width string per row from the contiguous characters, the last newline cut.
  texts = lines_RxHxW1.reshape(r, h * (w + 1)).view(f"<U{h * (w + 1)}")[:, 0].tolist()
  return [text[:-1] for text in texts]


def coord_blocks(
    shape: Tuple[int, int], entries: Sequence[Tuple[str, np.ndarray]], num_rows: int
) -> List[str]:
  """RAGEN's coordinate text per row: a board-size line, then `Label: (r, c), ...` per
  non-empty category; `entries` pairs each label with its masks, bool [R, H, W]."""
  h, w = shape
  names_N = np.array([f"({r}, {c})" for r in range(h) for c in range(w)], object)
  lines = [[f"Board size: {h} rows x {w} cols (zero-indexed)."] for _ in range(num_rows)]
  for label, mask_RxHxW in entries:
    mask_RxN = mask_RxHxW.reshape(num_rows, h * w)
    for i in np.flatnonzero(mask_RxN.any(axis=1)):
      lines[i].append(f"{label}: " + ", ".join(names_N[mask_RxN[i]]))
  return ["\n".join(row_lines) for row_lines in lines]


def board_texts(
    fmt: str, symbols_RxHxW: np.ndarray, entries: Sequence[Tuple[str, np.ndarray]]
) -> List[str]:
  """A grid world's texts in `fmt`: the symbol grid, the coordinates, or both."""
  check_format(fmt)
  if fmt == IMAGE:  # a visual environment answers it before the text boards are drawn
    raise ValueError(f"render_format {IMAGE!r} has no text board; it needs a visual environment")
  r, h, w = symbols_RxHxW.shape
  if fmt == "grid":
    return grid_texts(symbols_RxHxW)
  coords = coord_blocks((h, w), entries, r)
  if fmt == "coord":
    return coords
  return [grid_coord(c, g) for c, g in zip(coords, grid_texts(symbols_RxHxW))]


def cells_text(cells) -> str:
  """Cells as "(r, c), (r, c)" (the experts' reasoning text)."""
  return ", ".join(f"({int(r)}, {int(c)})" for r, c in cells)


def grid_coord(coord: str, grid: str) -> str:
  # RAGEN writes a space before each newline of these two headers.
  return "Coordinates: \n" + coord + "\n" + "Grid Map: \n" + grid


def parse_grid(text: str, symbols: str, env_name: str) -> np.ndarray:
  """Splits grid text into a [H, W] array of single-character strings, validating symbols."""
  rows = [r for r in text.strip("\n").split("\n")]
  if not rows or any(len(r) != len(rows[0]) for r in rows):
    raise ValueError(f"{env_name} grid text must be a rectangle of symbols, got {text!r}.")
  grid = np.array([list(r) for r in rows])
  bad = sorted(set(grid.ravel()) - set(symbols))
  if bad:
    raise ValueError(f"{env_name} grid text has unknown symbols {bad}; valid: {list(symbols)}.")
  return grid


def check_options(cls: type, kwargs: Dict[str, Any]) -> None:
  """Raises a ValueError naming any keyword that is not a field of the env dataclass."""
  valid = [f.name for f in dataclasses.fields(cls) if f.init]
  for key in kwargs:
    if key not in valid:
      raise ValueError(
          f"Unknown option {key!r} for environment {cls.name!r}; " f"valid options: {valid}."
      )

"""Sokoban and FrozenLake seen as images: each text environment plus a renderer of sprites.

A visual environment is its text environment unchanged (levels, rules, rewards, text and
expert are inherited) that also draws a state: `render_image(state)` gives uint8 [H, W, 3] in
jax.numpy for one unbatched state, jit- and vmap-able, so the frames of a batch are rendered on
the device right after `step` (`jax.vmap(env.render_image)`). `image_shape` is that frame's
shape. Each cell's symbol, read by the text environment's own `symbol_codes`, picks a sprite of
`cell_px` x `cell_px` pixels. At the default 14-pixel cells a 6x6 Sokoban is 84x84 and a 4x4
FrozenLake 56x56: sides that are multiples of 28, which Qwen2.5-VL takes without resampling
(`ragen_jax.vision`), one vision patch per cell and one LLM token per 2x2 cells.

The sprites are drawn by code from one table, `SPRITES`: per game and symbol, a background
colour from `PALETTE` and shapes painted over it in order, in coordinates of the unit cell (so
any `cell_px` draws them). FrozenLake's image also marks the start tile once the player has left
it, with a stool as gymnasium draws (its text shows the start as frozen ice).

Render format "image" (`base.IMAGE`, these environments only) shows the state in the frame
alone: the observation text says the board is in the image (`IMAGE_TEXT`, no grid symbol, no
coordinates) and the instruction, RAGEN's grid one, goes on to describe the picture (`PICTURE`:
each sprite's colours and shapes) where the other formats give the text legend. Levels, rules,
rewards and frames are those of every other format.
"""

import dataclasses
import functools
from typing import Annotated, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.config_checks import Range
from ragen_jax.envs.device import base
from ragen_jax.envs.device import frozenlake
from ragen_jax.envs.device import sokoban

PALETTE = {
    # Sokoban
    "brick": (156, 66, 42),
    "mortar": (92, 86, 80),
    "floor": (34, 34, 38),
    "target": (226, 48, 48),
    "crate": (222, 154, 44),
    "crate_edge": (118, 74, 22),
    "placed": (70, 190, 70),
    "placed_edge": (24, 98, 30),
    "shirt": (54, 108, 232),
    "skin": (248, 204, 160),
    # FrozenLake
    "ice": (188, 224, 248),
    "ice_edge": (160, 200, 230),
    "glint": (250, 253, 255),
    "hole": (20, 36, 78),
    "gift": (240, 198, 36),
    "ribbon": (208, 36, 60),
    "stool": (136, 90, 50),
    "coat": (214, 60, 44),
}


def _crate(edge: str, face: str) -> tuple:
  return (("rect", 0.1, 0.1, 0.9, 0.9), edge), (("rect", 0.22, 0.22, 0.78, 0.78), face)


def _figure(body: str) -> tuple:
  return (("disc", 0.7, 0.5, 0.24), body), (("disc", 0.3, 0.5, 0.17), "skin")


# Shapes in unit-cell coordinates (y down, x right; pixel centres at (i + 0.5) / cell_px):
# ("disc", cy, cx, r), ("ring", cy, cx, r_in, r_out), ("rect", top, left, bottom, right),
# ("border", width) a frame along the cell's edges, ("bricks",) the mortar of a brick wall.
_TARGET = ((("ring", 0.5, 0.5, 0.3, 0.45), "target"),)
_PLAYER, _SKATER = _figure("shirt"), _figure("coat")
_ICE = ((("border", 0.07), "ice_edge"),)  # a thin line between cells, to count them by
_HOLE = ((("disc", 0.5, 0.5, 0.42), "hole"),)
_GIFT = (
    (("rect", 0.15, 0.15, 0.85, 0.85), "gift"),
    (("rect", 0.15, 0.43, 0.85, 0.57), "ribbon"),
    (("rect", 0.43, 0.15, 0.57, 0.85), "ribbon"),
)
_START = (
    (("rect", 0.45, 0.25, 0.58, 0.75), "stool"),
    (("rect", 0.58, 0.3, 0.85, 0.4), "stool"),
    (("rect", 0.58, 0.6, 0.85, 0.7), "stool"),
)
START = "start"  # FrozenLake's image-only symbol: the start tile without the player on it

# game -> symbol -> (background colour, layers of (shape, colour) painted in order).
SPRITES = {
    "sokoban": {
        "#": ("brick", ((("bricks",), "mortar"),)),
        "_": ("floor", ()),
        "O": ("floor", _TARGET),
        "√": ("floor", _crate("placed_edge", "placed")),
        "X": ("floor", _crate("crate_edge", "crate")),
        "P": ("floor", _PLAYER),
        "S": ("floor", _TARGET + _PLAYER),
    },
    "frozenlake": {
        "P": ("ice", _ICE + _SKATER),
        "_": ("ice", _ICE + ((("rect", 0.2, 0.2, 0.28, 0.45), "glint"),)),
        "O": ("ice", _ICE + _HOLE),
        "G": ("ice", _ICE + _GIFT),
        "X": ("ice", _ICE + _HOLE + ((("disc", 0.5, 0.5, 0.2), "skin"),)),  # only the head shows
        "√": ("ice", _ICE + _GIFT + _SKATER),
        START: ("ice", _ICE + _START),
    },
}


# The codes each game's image paints: the text's symbol codes (`symbol_codes`), then the symbols
# only the image shows.
_CODES = {
    "sokoban": tuple(sokoban.SYMBOLS),
    "frozenlake": tuple(frozenlake.SYMBOLS) + (START,),
}


def _shape_mask(shape: tuple, n: int) -> np.ndarray:
  """bool [n, n]: the pixels whose centres lie in `shape` (see the shapes' comment)."""
  y, x = np.meshgrid((np.arange(n) + 0.5) / n, (np.arange(n) + 0.5) / n, indexing="ij")
  kind, *args = shape
  if kind == "disc":
    cy, cx, r = args
    return (y - cy) ** 2 + (x - cx) ** 2 <= r**2
  if kind == "ring":
    cy, cx, r_in, r_out = args
    d2 = (y - cy) ** 2 + (x - cx) ** 2
    return (d2 >= r_in**2) & (d2 <= r_out**2)
  if kind == "rect":
    top, left, bottom, right = args
    return (y >= top) & (y < bottom) & (x >= left) & (x < right)
  if kind == "border":
    (width,) = args
    return (np.minimum(y, 1 - y) < width) | (np.minimum(x, 1 - x) < width)
  if kind == "bricks":
    # Three courses a cell; the joints of every other course shifted by half a brick.
    course = np.floor(y * 3)
    bed = (y * 3) % 1 < 0.25
    joint = (x * 2 + 0.5 * (course % 2)) % 1 < 0.15
    return bed | joint
  raise ValueError(f"unknown sprite shape {kind!r}")


@functools.lru_cache(maxsize=None)
def sprite_table(game: str, cell_px: int) -> np.ndarray:
  """uint8 [K, cell_px, cell_px, 3]: `game`'s sprites, indexed by the codes of `symbols`."""
  sprites = []
  for symbol in symbols(game):
    background, layers = SPRITES[game][symbol]
    sprite = np.empty((cell_px, cell_px, 3), np.uint8)
    sprite[:] = PALETTE[background]
    for shape, colour in layers:
      sprite[_shape_mask(shape, cell_px)] = PALETTE[colour]
    sprites.append(sprite)
  table = np.stack(sprites)
  table.setflags(write=False)
  return table


def symbols(game: str) -> Tuple[str, ...]:
  """The symbols of `game`'s image, indexed by the codes `render_image` paints."""
  return _CODES[game]


def paint(codes_HxW: jax.Array, sprites_KxCxCx3: np.ndarray) -> jax.Array:
  """uint8 [H * C, W * C, 3]: each cell's sprite (leading axes of `codes` carried along)."""
  h, w = codes_HxW.shape[-2:]
  c = sprites_KxCxCx3.shape[1]
  tiles = jnp.asarray(sprites_KxCxCx3)[codes_HxW]  # [..., H, W, C, C, 3]
  tiles = jnp.swapaxes(tiles, -4, -3)  # [..., H, C, W, C, 3]: pixel rows, then columns
  return tiles.reshape(codes_HxW.shape[:-2] + (h * c, w * c, 3))


IMAGE_TEXT = "The board is shown in the image."  # the whole observation text in format "image"

# What the image shows, in words (the instruction of format "image"; the sprites of SPRITES).
PICTURE = {
    "sokoban": (
        "you are the figure in a blue shirt; walls are red-brown bricks; the floor is dark grey; "
        "a target is a red ring; a box is an orange crate, green once it is on a target"
    ),
    "frozenlake": (
        "you are the skater in a red coat; the ice is light blue tiles; a hole is a dark blue "
        "disc; the goal is a yellow gift with a red ribbon; a brown stool marks the start once "
        "you have left it; in a hole only your head shows"
    ),
}


class ImageObservation:
  """Format "image" for a visual environment (mixed in before its text environment): the text
  and the instruction of that format, every other format the text environment's."""

  game: str = ""

  def instruction(self, render_format: str = "grid") -> str:
    if render_format != base.IMAGE:
      return super().instruction(render_format)
    h, w = self.image_shape[0] // self.cell_px, self.image_shape[1] // self.cell_px
    return (
        f"{super().instruction('grid').rstrip()}\nThe board is an image of {h} x {w} cells: "
        f"{PICTURE[self.game]}."
    )

  def render(self, state, fmt: str = "grid") -> str:
    return IMAGE_TEXT if fmt == base.IMAGE else super().render(state, fmt)

  def render_batch(self, states, rows, fmt: str = "grid") -> List[str]:
    if fmt == base.IMAGE:
      return [IMAGE_TEXT] * len(rows)
    return super().render_batch(states, rows, fmt)


@dataclasses.dataclass(frozen=True)
class VisualSokoban(ImageObservation, sokoban.Sokoban):
  """Sokoban (`envs.device.sokoban`) with `render_image`: 14-pixel cells, 84x84 at 6x6."""

  name = "visual_sokoban"
  game = "sokoban"

  cell_px: Annotated[int, Range(8)] = 14  # pixels a side of one cell's sprite

  @property
  def image_shape(self) -> Tuple[int, int, int]:
    h, w = self.dim_room
    return h * self.cell_px, w * self.cell_px, 3

  def render_image(self, state: sokoban.SokobanState) -> jax.Array:
    codes_HxW = sokoban.symbol_codes(state.fixed_HxW, state.boxes_HxW, state.player_HxW)
    return paint(codes_HxW, sprite_table("sokoban", self.cell_px))


@dataclasses.dataclass(frozen=True)
class VisualFrozenLake(ImageObservation, frozenlake.FrozenLake):
  """FrozenLake (`envs.device.frozenlake`) with `render_image`: 14-pixel cells, 56x56 at 4x4."""

  name = "visual_frozenlake"
  game = "frozenlake"

  cell_px: Annotated[int, Range(8)] = 14  # pixels a side of one cell's sprite

  @property
  def image_shape(self) -> Tuple[int, int, int]:
    side = self.size * self.cell_px
    return side, side, 3

  def render_image(self, state: frozenlake.FrozenLakeState) -> jax.Array:
    codes_SxS = frozenlake.symbol_codes(state.tiles_SxS, state.player_SxS)
    plain = codes_SxS == frozenlake.SYMBOLS.index("_")
    codes_SxS = jnp.where(state.start_SxS & plain, symbols("frozenlake").index(START), codes_SxS)
    return paint(codes_SxS, sprite_table("frozenlake", self.cell_px))

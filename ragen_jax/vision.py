"""Qwen2.5-VL's image preprocessing: RGB frames to the vision tower's rows of patches.

Dimensions: N images; H, W their pixel rows and columns; p the patch side (14), m the merge side
(2), t the temporal patch (2); gh, gw = H / p, W / p patches; P = N * gh * gw rows of
D = 3 * t * p * p values (1176).

    pixel_values_PxD, grid_thw_Nx3 = vision.preprocess(frames_NxHxWx3)       # NumPy, on the host
    pixel_values_PxD, grid_thw_Nx3 = jax.jit(vision.preprocess)(frames)      # jax arrays, on device

The result equals transformers' `Qwen2VLImageProcessorPil` at its defaults (`ImageConfig`):

1. Size (`smart_resize`): each side rounded to a multiple of p * m = 28, the area kept within
   [min_pixels, max_pixels] at about the same aspect ratio. An image that this leaves at its size
   is not resampled; any other is resized with PIL's bicubic filter on its uint8 pixels, on the
   host, as the reference does.
2. Values: x / 255 normalised with CLIP's mean and std, float32. A table of the 3 x 256 possible
   values, each computed in the reference's arithmetic order and precision, turns the pixels into
   values with one gather, so the device gives the reference's values to the bit.
3. Layout (`patchify`): rows in merge-block order, the m x m patches that the tower's merger joins
   into one LLM token on consecutive rows; each row holds a patch's channels, each repeated t
   times (one frame filling the temporal patch), as [C, t, p, p].

A jax array input (a frame rendered on the device: `envs.make("visual_sokoban").render_image`)
takes the same code with jax.numpy, under jit; its size must need no resampling (sides multiples
of 28 within the pixel bounds), or the call raises a ValueError before anything runs. The grid
[N, 3] of (t, gh, gw) is NumPy int64, as the reference's (under jit, a constant of the program).
"""

import dataclasses
import functools
import math
from typing import Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from ragen_jax.config_checks import check_fields, PositiveInt

# OpenAI CLIP's per-channel mean and standard deviation (RGB), Qwen2.5-VL's normalisation.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_MAX_ASPECT = 200  # the reference refuses longer strips


@dataclasses.dataclass(frozen=True)
class ImageConfig:
  """Qwen2.5-VL's preprocessing settings (its processor's defaults)."""

  patch_size: PositiveInt = 14  # pixels a side of one vision patch
  merge_size: PositiveInt = 2  # patches a side of one merged (LLM) token
  temporal_patch_size: PositiveInt = 2  # frames per patch; an image fills them with copies
  min_pixels: PositiveInt = 56 * 56  # smallest area after resizing
  max_pixels: PositiveInt = 28 * 28 * 1280  # largest area after resizing

  def __post_init__(self):
    check_fields(self, "vision")
    if self.max_pixels < self.min_pixels:
      raise ValueError(
          f"vision.max_pixels={self.max_pixels} is below vision.min_pixels={self.min_pixels}"
      )

  @property
  def factor(self) -> int:
    """Pixels a side of one merged token: every side after resizing is a multiple of it."""
    return self.patch_size * self.merge_size

  @property
  def patch_dim(self) -> int:
    """D, the values in one row of `pixel_values`."""
    return 3 * self.temporal_patch_size * self.patch_size**2


DEFAULT = ImageConfig()


def smart_resize(height: int, width: int, config: ImageConfig = DEFAULT) -> Tuple[int, int]:
  """(height, width) the image is resized to: multiples of `config.factor` whose product lies in
  [min_pixels, max_pixels], the aspect ratio kept as far as rounding allows."""
  if min(height, width) < 1:
    raise ValueError(f"an image needs at least one pixel a side, got {height}x{width}")
  if max(height, width) / min(height, width) > _MAX_ASPECT:
    raise ValueError(f"image {height}x{width}: the long side exceeds {_MAX_ASPECT}x the short one")
  f = config.factor
  # Python's round (half to even) and these float operations in this order: the reference's.
  rows, cols = round(height / f) * f, round(width / f) * f
  if rows * cols > config.max_pixels:
    shrink = math.sqrt(height * width / config.max_pixels)
    rows = max(f, math.floor(height / shrink / f) * f)
    cols = max(f, math.floor(width / shrink / f) * f)
  elif rows * cols < config.min_pixels:
    grow = math.sqrt(config.min_pixels / (height * width))
    rows = math.ceil(height * grow / f) * f
    cols = math.ceil(width * grow / f) * f
  return rows, cols


def grid_thw(height: int, width: int, config: ImageConfig = DEFAULT) -> Tuple[int, int, int]:
  """(t, gh, gw): the patch grid of an image of this size after resizing (t = 1 frame)."""
  rows, cols = smart_resize(height, width, config)
  return 1, rows // config.patch_size, cols // config.patch_size


def num_tokens(height: int, width: int, config: ImageConfig = DEFAULT) -> int:
  """LLM tokens an image of this size becomes: its patches over the m x m merge."""
  _, gh, gw = grid_thw(height, width, config)
  return gh * gw // config.merge_size**2


@functools.lru_cache(maxsize=None)
def _value_table() -> np.ndarray:
  """float32 [256, 3]: the value of each uint8 level in each channel. The reference rescales
  in float64 and rounds to float32, then normalises in float32; so does this."""
  scaled_V = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
  mean_C, std_C = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
  table_VxC = (scaled_V[:, None] - mean_C[None, :]) / std_C[None, :]
  table_VxC.setflags(write=False)
  return table_VxC


def patchify(images_NxHxWx3, config: ImageConfig = DEFAULT, xp=jnp):
  """float32 [N * gh * gw, D]: uint8 frames of one size that need no resizing, as rows of
  normalised patches in merge-block order; NumPy (`xp=np`) or jax.numpy, jit-able."""
  n, h, w, c = images_NxHxWx3.shape
  p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
  if h % config.factor or w % config.factor:
    raise ValueError(f"patchify takes sides that are multiples of {config.factor}, got {h}x{w}")
  table_VxC = xp.asarray(_value_table())
  channel_1x1x1xC = xp.arange(c).reshape(1, 1, 1, c)
  values_NxHxWxC = table_VxC[images_NxHxWx3.astype(xp.int32), channel_1x1x1xC]
  # [N, blocks down, m, p, blocks across, m, p, C] -> [N, blocks, blocks, m, m, C, p, p]
  blocks = values_NxHxWxC.reshape(n, h // (p * m), m, p, w // (p * m), m, p, c)
  blocks = xp.transpose(blocks, (0, 1, 4, 2, 5, 7, 3, 6))
  frames = xp.broadcast_to(blocks[:, :, :, :, :, :, None], blocks.shape[:6] + (t, p, p))
  return frames.reshape(n * (h // p) * (w // p), config.patch_dim)


def preprocess(
    images: Union[np.ndarray, jax.Array, Sequence[np.ndarray]], config: ImageConfig = DEFAULT
) -> Tuple[Union[np.ndarray, jax.Array], np.ndarray]:
  """(pixel_values float32 [P, D], image_grid_thw int64 [N, 3]) of uint8 RGB images.

  `images`: NumPy uint8 [N, H, W, 3] or a sequence of [H, W, 3] of any sizes (on the host,
  resized where `smart_resize` says); or a jax array [N, H, W, 3] (jax.numpy, jit-able), whose
  size must need no resizing. Rows follow the images' order.
  """
  if isinstance(images, jax.Array):
    if images.ndim != 4:
      raise ValueError(f"a jax array of images is [N, H, W, 3], got {images.shape}")
    _check_frame(images.shape[1:], images.dtype)
    n, h, w, _ = images.shape
    if smart_resize(h, w, config) != (h, w):
      raise ValueError(
          f"images of {h}x{w} need resizing to {smart_resize(h, w, config)}, which runs on the "
          "host: pass them as NumPy arrays (or render at sides that are multiples of "
          f"{config.factor} with at least {config.min_pixels} pixels)"
      )
    return patchify(images, config, jnp), np.array([grid_thw(h, w, config)] * n, np.int64)
  rows, grids = [], []
  for image in images:
    image = np.asarray(image)
    _check_frame(image.shape, image.dtype)
    size = smart_resize(image.shape[0], image.shape[1], config)
    if size != image.shape[:2]:
      image = np.asarray(Image.fromarray(image).resize(size[::-1], Image.Resampling.BICUBIC))
    rows.append(patchify(image[None], config, np))
    grids.append(grid_thw(*size, config))
  if not rows:
    raise ValueError("preprocess needs at least one image")
  return np.concatenate(rows), np.array(grids, np.int64)


def _check_frame(shape, dtype) -> None:
  """Raises unless one image is [H, W, 3] of uint8 pixels."""
  if len(shape) != 3 or shape[-1] != 3 or dtype != np.uint8:
    raise ValueError(f"an image is uint8 RGB [H, W, 3], got {tuple(shape)} {dtype}")

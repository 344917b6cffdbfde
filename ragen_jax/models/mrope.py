"""Qwen2.5-VL's 3-axis rotary positions (M-RoPE), computed on the host in NumPy.

Every token has a temporal, a row and a column position (t, h, w). A text token has t = h = w,
one more than the token before it, which is the 1-D rotary exactly. An image whose first token
would sit at p has t = p, h = p + row and w = p + column over its grid of image tokens, and the
token after it starts at p + max(rows, columns). Padding is skipped. The positions are a pure
function of the ids, the mask and the images' grids, as transformers' `get_rope_index` (whose
numbers `rope_index` reproduces, padding positions aside).

A row's positions therefore run ahead of (or behind) its count of real tokens by its rope delta,
the last position + 1 minus that count: the position of the next token, whatever it is, is the
count of real tokens before it plus the delta. The decoder keeps the delta in its KV cache
(`KVCache.rope_delta_B`) and offsets a later chunk's positions by it, so a chunk's positions are
computed from 0 on its own. `fixed_grid_positions` gives the same positions in jax.numpy for
images of one grid (an environment's frames), from the ids on the device. Dimension legend: B
rows, T tokens, N images.
"""

import jax.numpy as jnp
import numpy as np


def _image_positions(start: int, t: int, rows: int, cols: int) -> np.ndarray:
  """[3, t * rows * cols] (t, h, w) positions of an image's tokens, row-major, from `start`."""
  t_, h_, w_ = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
  return start + np.stack([t_.ravel(), h_.ravel(), w_.ravel()])


def rope_index(
    ids_BxT, mask_BxT, image_grid_thw_Nx3, *, image_token_id: int, spatial_merge_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """The M-RoPE positions of a batch and each row's rope delta.

  Args:
    ids_BxT: token ids; each image is a run of t * (h / m) * (w / m) `image_token_id` tokens.
    mask_BxT: 1 for real tokens (None: all real); padding gets position 0 and is skipped.
    image_grid_thw_Nx3: every image's (frames, patch rows, patch columns), in the order the
      images appear, row after row.
    image_token_id: the image-pad token.
    spatial_merge_size: m, patches per side of an image token.

  Returns:
    (positions_3xBxT, rope_delta_B), int32.

  Raises:
    ValueError: the image tokens and the grids disagree (a run of the wrong length, too many or
      too few images).
  """
  ids_BxT = np.asarray(ids_BxT)
  b, t = ids_BxT.shape
  mask_BxT = np.ones((b, t), bool) if mask_BxT is None else np.asarray(mask_BxT).astype(bool)
  grids = [tuple(g) for g in np.asarray(image_grid_thw_Nx3, np.int64).reshape(-1, 3).tolist()]
  used = 0
  positions_3xBxT = np.zeros((3, b, t), np.int64)
  rope_delta_B = np.zeros(b, np.int64)
  for row in range(b):
    real = np.flatnonzero(mask_BxT[row])
    ids_R = ids_BxT[row, real]
    positions_3xR = np.zeros((3, len(real)), np.int64)
    k = next_position = 0
    while k < len(real):
      if ids_R[k] != image_token_id:
        positions_3xR[:, k] = next_position
        k, next_position = k + 1, next_position + 1
        continue
      if used == len(grids):
        raise ValueError(f"row {row} has more images than the {len(grids)} grids given")
      frames, rows, cols = grids[used]
      rows, cols = rows // spatial_merge_size, cols // spatial_merge_size
      n = frames * rows * cols
      if k + n > len(real) or np.any(ids_R[k : k + n] != image_token_id):
        raise ValueError(
            f"image {used} (grid {grids[used]}) needs {n} image tokens in row {row}, "
            f"from real token {k}"
        )
      positions_3xR[:, k : k + n] = _image_positions(next_position, frames, rows, cols)
      k, next_position, used = k + n, next_position + max(rows, cols), used + 1
    positions_3xBxT[:, row, real] = positions_3xR
    if len(real):
      rope_delta_B[row] = positions_3xR.max() + 1 - len(real)
  if used != len(grids):
    raise ValueError(f"{len(grids)} image grids given, {used} images in the ids")
  return positions_3xBxT.astype(np.int32), rope_delta_B.astype(np.int32)


def fixed_grid_positions(ids_BxT, mask_BxT, *, image_token_id: int, rows: int, cols: int):
  """`rope_index`'s positions, in jax.numpy (jit-able), when every image is one frame of the
  same `rows` x `cols` grid of image tokens: int32 [3, B, T] (padding 0).

  A text token sits at its count of real text tokens before it plus max(rows, cols) per image
  before it; the j-th token of an image starting at p at (p, p + j // cols, p + j % cols).
  """
  real_BxT = mask_BxT > 0
  image_BxT = real_BxT & (ids_BxT == image_token_id)
  text_BxT = real_BxT & ~image_BxT
  n = rows * cols
  seen_BxT = jnp.cumsum(image_BxT, axis=1, dtype=jnp.int32) - image_BxT  # image tokens before
  text_before_BxT = jnp.cumsum(text_BxT, axis=1, dtype=jnp.int32) - text_BxT
  # Before a text token, whole images; within an image, its index j past the image's start.
  start_BxT = text_before_BxT + (seen_BxT // n) * max(rows, cols)
  j_BxT = seen_BxT % n
  t_BxT = start_BxT
  h_BxT = jnp.where(image_BxT, start_BxT + j_BxT // cols, start_BxT)
  w_BxT = jnp.where(image_BxT, start_BxT + j_BxT % cols, start_BxT)
  return jnp.where(real_BxT[None], jnp.stack([t_BxT, h_BxT, w_BxT]), 0).astype(jnp.int32)

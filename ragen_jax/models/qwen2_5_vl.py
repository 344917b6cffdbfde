"""Qwen2.5-VL in Flax NNX: the Qwen2 causal LM with a vision tower whose image features take the
place of the image-pad tokens' embeddings, and 3-axis rotary positions (models/mrope.py).

    model = models.load_hf(path)  # a qwen2_5_vl checkpoint directory
    logits_BxTxV = model(ids_BxT, mask_BxT)  # text alone: Qwen2's 1-D positions
    logits_BxTxV = model(ids_BxT, mask_BxT, pixel_values=pixels_PxC, image_grid_thw=grid_Nx3)
    images = models.prepare_images(model.config, ids_BxT, mask_BxT, pixels_PxC, grid_Nx3)
    forward = jax.jit(lambda state, i, m, images: nnx.merge(graphdef, state)(i, m, images=images))

The third line runs eagerly, or under jit with ids known at trace time (constants).

What depends on the token ids (the M-RoPE positions) and on the images' grids (where each patch
sits) is computed on the host by `prepare_images`, into an `ImageInputs` of arrays that a jitted
forward takes: its shapes are fixed by the number of tokens and of patches, so images of fixed
sizes never recompile. A model without images runs every text path of the Qwen2 class unchanged.

Cached decoding: a chunk with images passes `images` with a cache; its positions count from each
row's next position and its rope delta joins the cache's (`KVCache.rope_delta_B`), so the later
text tokens and chunks, with or without images, continue where transformers would put them.

Dimension legend: B batch, T tokens, P patches, C values per patch, N images, I image tokens,
D model dim, V vocab.
"""

import functools

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import vision as image_prep
from ragen_jax.models import mrope
from ragen_jax.models import vision
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.qwen2 import Qwen2


@struct.dataclass
class ImageInputs:
  """What a forward pass over tokens with images takes beside the ids, all arrays.

  Attributes:
    pixel_values_PxC: every image's patches, one after the other (transformers' pixel_values).
    patch_hw_2xP, patch_frame_P, patch_window_P: where each patch sits (`vision.PatchLayout`).
    positions_3xBxT: M-RoPE positions of the tokens, counted from each row's next position.
    rope_delta_B: how far the tokens move each row's next position beyond their count.
  """

  pixel_values_PxC: jax.Array
  patch_hw_2xP: jax.Array
  patch_frame_P: jax.Array
  patch_window_P: jax.Array
  positions_3xBxT: jax.Array
  rope_delta_B: jax.Array


def prepare_images(
    config: ModelConfig, ids_BxT, mask_BxT, pixel_values_PxC, image_grid_thw_Nx3
) -> ImageInputs:
  """The ImageInputs of a batch, computed on the host (NumPy) from concrete ids and grids.

  Args:
    config: a Qwen2.5-VL config (`config.vision` set).
    ids_BxT: token ids, each image a run of its image tokens.
    mask_BxT: 1 for real tokens (None: all real).
    pixel_values_PxC: the images' patches, as transformers' image processor writes them.
    image_grid_thw_Nx3: each image's (frames, patch rows, patch columns), in order.

  Raises:
    ValueError: the config has no vision tower, or the ids, patches and grids disagree.
  """
  v = config.vision
  if v is None:
    raise ValueError(f"model_type {config.model_type!r} takes no images")
  grid_Nx3 = np.asarray(image_grid_thw_Nx3, np.int64).reshape(-1, 3)
  patches = int(np.prod(grid_Nx3, axis=1).sum())
  if tuple(np.shape(pixel_values_PxC)) != (patches, v.patch_values):
    raise ValueError(
        f"pixel_values has shape {np.shape(pixel_values_PxC)}; the grids need "
        f"({patches}, {v.patch_values})"
    )
  layout = vision.patch_layout(grid_Nx3, v)
  positions_3xBxT, rope_delta_B = mrope.rope_index(
      ids_BxT,
      mask_BxT,
      grid_Nx3,
      image_token_id=v.image_token_id,
      spatial_merge_size=v.spatial_merge_size,
  )
  return ImageInputs(
      np.asarray(pixel_values_PxC, np.float32), *layout, positions_3xBxT, rope_delta_B
  )


@functools.lru_cache(maxsize=None)
def _frames_layout(grid: tuple, n: int, v) -> vision.PatchLayout:
  """The patch layout of n images of one grid (host constants of a jitted forward)."""
  return vision.patch_layout(np.asarray([grid] * n), v)


class Qwen2_5_VL(Qwen2):
  """Qwen2.5-VL: `model(ids_BxT, mask_BxT, images=...)` -> float32 logits_BxTxV.

  A Qwen2 (decoder, LM head and every text path) with `visual`, the vision tower.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    if config.vision is None:
      raise ValueError(f"Qwen2_5_VL needs a vision config; model_type {config.model_type!r}")
    super().__init__(config, rngs=rngs)
    self.visual = vision.VisionTower(config, rngs=rngs)

  def image_features(self, images: ImageInputs) -> jax.Array:
    """features_IxD of the images, in config.dtype: what the image tokens become."""
    return self.visual(
        images.pixel_values_PxC, images.patch_hw_2xP, images.patch_frame_P, images.patch_window_P
    )

  def frame_features(self, frames_NxHxWx3) -> jax.Array:
    """features [N, I, D] of N uint8 frames of one size that needs no resizing, preprocessed
    here (`ragen_jax.vision.preprocess`'s jnp path; jit-able, the patch layout a constant)."""
    n = frames_NxHxWx3.shape[0]
    pixels_PxC, grid_Nx3 = image_prep.preprocess(frames_NxHxWx3)
    layout = _frames_layout(tuple(int(x) for x in grid_Nx3[0]), n, self.config.vision)
    features_IxD = self.visual(pixels_PxC, *layout)
    return features_IxD.reshape(n, -1, features_IxD.shape[-1])

  def frames_backbone(
      self, input_ids_BxT, attention_mask_BxT, frames_BxNxHxWx3, train_tower, cache=None
  ):
    """(final-normed hidden states, the updated cache or None) of rows whose k-th image is their
    k-th frame (frames past a row's images are ignored), M-RoPE positions from the ids on the
    device (`mrope.fixed_grid_positions`); without `train_tower` no gradient reaches the tower.
    With a `cache` (empty: the tokens are a prefill) it keeps the rows' rope delta."""
    b, n = frames_BxNxHxWx3.shape[:2]
    features_BNxIxD = self.frame_features(
        frames_BxNxHxWx3.reshape((b * n,) + frames_BxNxHxWx3.shape[2:])
    )
    if not train_tower:
      features_BNxIxD = jax.lax.stop_gradient(features_BNxIxD)
    features_BxJxD = features_BNxIxD.reshape(b, -1, features_BNxIxD.shape[-1])
    m = self.config.vision.spatial_merge_size
    h, w = frames_BxNxHxWx3.shape[2:4]
    patch = self.config.vision.patch_size
    rows, cols = h // patch // m, w // patch // m
    image_token_id = self.config.vision.image_token_id
    positions_3xBxT = mrope.fixed_grid_positions(
        input_ids_BxT, attention_mask_BxT, image_token_id=image_token_id, rows=rows, cols=cols
    )
    # Each image's rows * cols tokens advance the positions by max(rows, cols) (mrope doc).
    image_tokens_B = jnp.sum(
        (input_ids_BxT == image_token_id) & (attention_mask_BxT > 0), axis=1, dtype=jnp.int32
    )
    rope_delta_B = image_tokens_B // (rows * cols) * (max(rows, cols) - rows * cols)
    return self.decoder(
        input_ids_BxT,
        attention_mask_BxT,
        image_features_IxD=features_BxJxD,
        positions_BxT=positions_3xBxT,
        rope_delta_B=rope_delta_B,
        cache=cache,
    )

  def _image_arguments(self, images: ImageInputs | None) -> dict:
    """The decoder's image arguments (none without images)."""
    if images is None:
      return {}
    return dict(
        image_features_IxD=self.image_features(images),
        positions_BxT=images.positions_3xBxT,
        rope_delta_B=images.rope_delta_B,
    )

  def backbone(
      self, input_ids_BxT, attention_mask=None, *, images=None, positions_BxT=None, cache=None
  ):
    """Final-normed hidden states: `Qwen2.backbone`, with `images` (ImageInputs) when the tokens
    hold images (their positions replace `positions_BxT`)."""
    arguments = self._image_arguments(images)
    if positions_BxT is not None:
      if images is not None:
        raise ValueError("images bring their own positions; pass positions_BxT without them")
      arguments["positions_BxT"] = positions_BxT
    return self.decoder(input_ids_BxT, attention_mask, cache=cache, **arguments)

  def __call__(
      self,
      input_ids_BxT,
      attention_mask=None,
      *,
      images: ImageInputs | None = None,
      pixel_values=None,
      image_grid_thw=None,
      positions_BxT=None,
      cache=None,
  ):
    """Logits of the next token at every position.

    Args:
      input_ids_BxT, attention_mask, positions_BxT, cache: as for `Qwen2.__call__`.
      images: the ImageInputs of the tokens' images (`prepare_images`), or None.
      pixel_values, image_grid_thw: transformers' arguments instead of `images`; turned into
        them on the host, so the ids and mask must be concrete (not traced by jit).

    Returns:
      float32 logits_BxTxV, or (logits_BxTxV, new_cache) when a cache is given.
    """
    if pixel_values is not None:
      if images is not None:
        raise ValueError("pass images or pixel_values and image_grid_thw, not both")
      images = prepare_images(
          self.config, input_ids_BxT, attention_mask, pixel_values, image_grid_thw
      )
    hidden_BxTxD, new_cache = self.backbone(
        input_ids_BxT, attention_mask, images=images, positions_BxT=positions_BxT, cache=cache
    )
    logits_BxTxV = self.logits(hidden_BxTxD)
    return logits_BxTxV if cache is None else (logits_BxTxV, new_cache)

  def decode(self, input_ids_BxT, attention_mask, *, cache, weights, images=None):
    """(float32 logits_BxTxV, the updated LayerCache): `Qwen2.decode`, a sampler's step, with
    `images` for a prefill whose tokens hold images."""
    hidden_BxTxD, new_cache = self.decoder.decode(
        input_ids_BxT, attention_mask, cache=cache, weights=weights, **self._image_arguments(images)
    )
    return self.logits(hidden_BxTxD), new_cache

"""What a turn shows beside its text: nothing (`TextTurns`), or the environment's current frame
(`ImageTurns`), and what the model's sampler takes of it.

    shown = images.make(env, tokenizer)   # ImageTurns when env has an image_shape, else TextTurns
    shown.mark(user_text)                 # the user's message, with the image's place marked
    shown.encode(text)                    # ids: the text's, the image's tokens at the mark
    frames_BxHxWx3 = shown.frames(envs)   # every row's frame, rendered on the device, or None
    shown.chunk(model_inputs, frames_BxHxWx3, ids_BxC, mask_BxC)   # sampling.ChunkImages or None

An image is Qwen2.5-VL's block `<|vision_start|>` + n x `<|image_pad|>` + `<|vision_end|>`,
opening the user's message (after the reward text of the last turn). Its ids come from the
tokenizer's `token_to_id` and go into the prompt as ids (never encoded from text); n is fixed by
the environment's `image_shape` (`vision.num_tokens`: 9 for 84x84 Sokoban), so every turn's
image has the same number of tokens and patches: static shapes, no recompiles.

Per turn the frames of all B rows are drawn in one vmapped, jitted call on the device
(`render_image`), preprocessed with `vision.preprocess`'s jnp path and run through the vision
tower in one jitted call: the pixels never reach the host. Rows that do not play the turn are
drawn too (a fixed batch); their features are never spliced, as their chunks hold no image
tokens (`layers.splice` with per-row features). The chunk's M-RoPE positions are computed on the
host from its ids (`mrope.rope_index`), as its text already is.

Dimension legend: B rows, C appended chunk length, H x W x 3 a frame, P patches of a frame,
I image tokens of a frame, D model width.
"""

import functools
from typing import Any, Tuple

from flax import nnx
import jax
import numpy as np

from ragen_jax import sampling
from ragen_jax import vision
from ragen_jax.models import mrope
from ragen_jax.models import vision as tower

MARK = "<image>"  # where the image sits in a message's text (never encoded)
VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


def make(env, tokenizer):
  """ImageTurns when `env` draws its states (`image_shape` set), else TextTurns."""
  if getattr(env, "image_shape", None) is None:
    return TextTurns(tokenizer)
  return ImageTurns(env, tokenizer)


class TextTurns:
  """Turns of text alone."""

  vision_ids: Tuple[int, ...] = ()  # no token opens an image

  def __init__(self, tokenizer):
    self.tok = tokenizer

  def mark(self, user: str) -> str:
    return user

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text)

  def frames(self, envs) -> None:
    del envs
    return None

  def chunk(self, model_inputs, frames, ids_BxC, mask_BxC) -> None:
    del model_inputs, frames, ids_BxC, mask_BxC

  def stack(self, frames_by_turn) -> None:
    del frames_by_turn
    return None


class ImageTurns:
  """Each user message opens with the environment's current frame (module doc)."""

  def __init__(self, env, tokenizer):
    self.tok = tokenizer
    h, w, _ = env.image_shape
    self.grid_1x3 = np.asarray([vision.grid_thw(h, w)], np.int64)
    self.tokens_per_image = vision.num_tokens(h, w)
    self.start_id, self.end_id, self.image_id = (
        tokenizer.token_to_id(t) for t in (VISION_START, VISION_END, IMAGE_PAD)
    )
    self.vision_ids = (self.start_id,)  # an image's block opens with it
    self.block = [self.start_id] + [self.image_id] * self.tokens_per_image + [self.end_id]
    self._render = jax.jit(jax.vmap(env.render_image))

  def mark(self, user: str) -> str:
    return MARK + user

  def encode(self, text: str) -> list[int]:
    """The ids of `text`, each MARK replaced by the image's block (each part encoded alone)."""
    parts = text.split(MARK)
    ids = self.tok.encode(parts[0])
    for part in parts[1:]:
      ids += self.block + self.tok.encode(part)
    return ids

  def frames(self, envs) -> jax.Array:
    """uint8 [B, H, W, 3]: every row's current state drawn, on the device."""
    return self._render(envs.device_states)

  def layout(self, config, b: int) -> tower.PatchLayout:
    """Where the patches of B frames sit (host constants, the same every turn)."""
    v = config.vision
    if v is None:
      raise ValueError(
          f"the environment shows images but model_type {config.model_type!r} takes none"
      )
    ic = vision.DEFAULT  # the preprocessing's settings (frame_features)
    if (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) != (
        ic.patch_size,
        ic.merge_size,
        ic.temporal_patch_size,
    ):
      raise ValueError(f"the model's vision config {v} does not match the preprocessing {ic}")
    return _layout(tuple(self.grid_1x3[0]), b, v)

  def chunk(self, model_inputs, frames_BxHxWx3, ids_BxC, mask_BxC) -> sampling.ChunkImages:
    """The chunk's images: every row's frame through the tower, and the chunk's positions.

    `model_inputs` is (graphdef, params, config) of the model.
    """
    graphdef, params, config = model_inputs
    layout = self.layout(config, frames_BxHxWx3.shape[0])
    features_BxIxD = frame_features(graphdef, params, frames_BxHxWx3, *layout)
    ids_BxC, mask_BxC = np.asarray(ids_BxC), np.asarray(mask_BxC)
    shown = int(np.sum((ids_BxC == self.image_id) & (mask_BxC > 0))) // self.tokens_per_image
    positions_3xBxC, rope_delta_B = mrope.rope_index(
        ids_BxC,
        mask_BxC,
        np.repeat(self.grid_1x3, shown, axis=0),
        image_token_id=self.image_id,
        spatial_merge_size=config.vision.spatial_merge_size,
    )
    return sampling.ChunkImages(features_BxIxD, positions_3xBxC, rope_delta_B)

  def stack(self, frames_by_turn) -> Any:
    """uint8 [K, B, H, W, 3]: the frames of the K turns played (on the device)."""
    return jax.numpy.stack(frames_by_turn) if frames_by_turn else None


@functools.lru_cache(maxsize=None)
def _layout(grid: Tuple[int, int, int], b: int, v) -> tower.PatchLayout:
  return tower.patch_layout(np.asarray([grid] * b), v)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def frame_features(graphdef, params, frames_BxHxWx3, patch_hw_2xP, patch_frame_P, patch_window_P):
  """float [B, I, D]: the vision tower's features of each row's frame (preprocessed here)."""
  model = nnx.merge(graphdef, params)
  b = frames_BxHxWx3.shape[0]
  pixels_PxC, _ = vision.preprocess(frames_BxHxWx3)
  features_IxD = model.visual(pixels_PxC, patch_hw_2xP, patch_frame_P, patch_window_P)
  return features_IxD.reshape(b, -1, features_IxD.shape[-1])

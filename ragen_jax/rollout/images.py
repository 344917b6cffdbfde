"""What a turn shows beside its text: nothing (`TextTurns`), or the environment's current frame
(`ImageTurns`), and what the model's sampler takes of it.

    shown = images.make(env, tokenizer)   # ImageTurns when env has an image_shape, else TextTurns
    shown.mark(user_text)                 # the user's message, with the image's place marked
    shown.encode(text)                    # ids: the text's, the image's tokens at the mark
    frames_BxHxWx3 = shown.frames(envs)   # every row's frame, rendered on the device, or None
    play = shown.start(model_inputs, b, max_turns, per_prompt)   # one batch's (a model's) play
    play.chunk(turn, frames_BxHxWx3, ids_BxC, mask_BxC)          # sampling.ChunkImages, or None
    shown.attach(batch, frames_KxBxHxWx3, layout.row_turns(eps, k))  # each training row's frames
    shown.record_frames(result)           # validation: each turn's frame in the episode records

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

The features are kept for the batch, one slot per turn (`FrameFeatures`): a chunk's n images
are always its row's last n turns' frames (the full context appends the current one; a window
re-prefills the kept turns' and the current one), so they are gathered from the kept slots and
the tower never sees a frame twice. At most `per_prompt` images a chunk (1 in full context,
k + 1 with a window of k turns) keeps the gathered shape static.

For people (validation's `eval/step_<s>.jsonl`, the trajectory viewer), each turn's frame is
kept in its episode's record as a PNG data URI (`Episode.turn_frames`), encoded on the host:
about 0.55 kB of PNG, 0.75 kB as base64, a turn for 84x84 Sokoban; 0.5 kB for 56x56 FrozenLake.

Dimension legend: B rows, C appended chunk length, H x W x 3 a frame, P patches of a frame,
I image tokens of a frame, D model width.
"""

import base64
import functools
import io
from typing import Any, Tuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from ragen_jax import distributed
from ragen_jax import sampling
from ragen_jax import vision
from ragen_jax.models import mrope

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

  def start(self, model_inputs, b: int, max_turns: int, per_prompt: int) -> "TextTurns":
    del model_inputs, b, max_turns, per_prompt
    return self

  def chunk(self, turn: int, frames, ids_BxC, mask_BxC) -> None:
    del turn, frames, ids_BxC, mask_BxC

  def stack(self, frames_by_turn) -> None:
    del frames_by_turn
    return None

  def attach(self, batch, frames, row_turns):
    del frames, row_turns
    return batch

  def record_frames(self, result) -> None:
    del result


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

  def check(self, config) -> None:
    """Raises unless the model takes these frames' images."""
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

  def start(self, model_inputs, b: int, max_turns: int, per_prompt: int) -> "FrameFeatures":
    """The features of one batch's frames, played by the model of `model_inputs`
    ((graphdef, params, config)) over `max_turns` turns, `per_prompt` images a chunk at most."""
    return FrameFeatures(self, model_inputs, b, max_turns, per_prompt)

  def stack(self, frames_by_turn) -> Any:
    """uint8 [K, B, H, W, 3]: the frames of the K turns played (on the device)."""
    return jnp.stack(frames_by_turn) if frames_by_turn else None

  def attach(self, batch, frames_KxBxHxWx3, row_turns):
    """`batch` with each row's frames (`RolloutBatch.frames_BxNxHxWx3`), gathered on the
    device: row r shows the frames of its episode's turns `row_turns[r]` = (episode, turns).
    N is the most any row shows (1 at least); a row's frames past its own repeat its last."""
    if frames_KxBxHxWx3 is None:  # no turn was played
      return batch
    n = max([len(turns) for _, turns in row_turns] + [1])
    turn_RxN = np.zeros((len(row_turns), n), np.int32)
    episode_R = np.zeros((len(row_turns),), np.int32)
    for r, (episode, turns) in enumerate(row_turns):
      turns = list(turns) or [0]
      turn_RxN[r] = turns + [turns[-1]] * (n - len(turns))
      episode_R[r] = episode
    frames = frames_KxBxHxWx3[turn_RxN, episode_R[:, None]]
    return batch.replace(frames_BxNxHxWx3=frames)

  def record_frames(self, result) -> None:
    """Sets each episode's `turn_frames` (a RolloutResult's): the frame of every turn it
    played, a PNG data URI. Every process calls it (the frames may span processes)."""
    if result.frames_KxBxHxWx3 is None:  # no turn was played
      return
    frames_BxKxHxWx3 = distributed.local_rows(
        jnp.swapaxes(result.frames_KxBxHxWx3, 0, 1), 0, len(result.episodes)
    )
    for ep, frames_KxHxWx3 in zip(result.episodes, frames_BxKxHxWx3):
      ep.turn_frames = [png_data_uri(frames_KxHxWx3[t]) for t in range(len(ep.turns))]


class FrameFeatures:
  """One batch's image features, a slot per turn, and the chunks that show them (module doc)."""

  def __init__(self, shown: ImageTurns, model_inputs, b: int, max_turns: int, per_prompt: int):
    shown.check(model_inputs[2])
    del b  # every chunk's frames are the batch's
    self.shown, self.model_inputs = shown, model_inputs
    self.max_turns, self.per_prompt = max_turns, per_prompt
    self.kept_KxBxIxD = None  # made on the first turn, in the tower's dtype

  def chunk(self, turn: int, frames_BxHxWx3, ids_BxC, mask_BxC) -> sampling.ChunkImages:
    """Turn `turn`'s chunk's images: this turn's frames through the tower (kept), each row's
    images gathered from the kept turns, and the chunk's positions."""
    graphdef, params, config = self.model_inputs
    new_BxIxD = frame_features(graphdef, params, frames_BxHxWx3)
    if self.kept_KxBxIxD is None:
      self.kept_KxBxIxD = jnp.zeros((self.max_turns,) + new_BxIxD.shape, new_BxIxD.dtype)
    self.kept_KxBxIxD = _keep(self.kept_KxBxIxD, new_BxIxD, turn - 1)
    ids_BxC, mask_BxC = np.asarray(ids_BxC), np.asarray(mask_BxC)
    shown, n = self.shown, self.shown.tokens_per_image
    images_B = np.sum((ids_BxC == shown.image_id) & (mask_BxC > 0), axis=1) // n
    if images_B.max(initial=0) > self.per_prompt:
      raise ValueError(f"a prompt shows {images_B.max()} images, more than {self.per_prompt}")
    # A row's images are its last turns' frames: turns turn - n_b + 1 .. turn (1-based).
    turn_BxJ = (turn - images_B)[:, None] + np.arange(self.per_prompt)[None]
    features_BxJIxD = _gather(self.kept_KxBxIxD, np.clip(turn_BxJ, 0, turn - 1).astype(np.int32))
    positions_3xBxC, rope_delta_B = mrope.rope_index(
        ids_BxC,
        mask_BxC,
        np.repeat(shown.grid_1x3, int(images_B.sum()), axis=0),
        image_token_id=shown.image_id,
        spatial_merge_size=config.vision.spatial_merge_size,
    )
    return sampling.ChunkImages(features_BxJIxD, positions_3xBxC, rope_delta_B)


def png_data_uri(frame_HxWx3: np.ndarray) -> str:
  """A uint8 RGB frame as a `data:image/png;base64,...` URI (lossless)."""
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(frame_HxWx3, np.uint8)).save(buffer, "PNG", optimize=True)
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@functools.partial(jax.jit, donate_argnames=("kept_KxBxIxD",))
def _keep(kept_KxBxIxD, new_BxIxD, k):
  return kept_KxBxIxD.at[k].set(new_BxIxD)


@jax.jit
def _gather(kept_KxBxIxD, turn_BxJ):
  """[B, J * I, D]: row b's kept features of turns turn_BxJ[b], one after the other."""
  b = turn_BxJ.shape[0]
  picked_BxJxIxD = kept_KxBxIxD[turn_BxJ, jnp.arange(b)[:, None]]
  return picked_BxJxIxD.reshape(b, -1, picked_BxJxIxD.shape[-1])


@functools.partial(jax.jit, static_argnames=("graphdef",))
def frame_features(graphdef, params, frames_BxHxWx3):
  """float [B, I, D]: the vision tower's features of each row's frame (preprocessed there)."""
  return nnx.merge(graphdef, params).frame_features(frames_BxHxWx3)

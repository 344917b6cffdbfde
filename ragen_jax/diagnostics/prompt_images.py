"""What the cross-scoring's prompts show beside their tokens: nothing, or their frames.

    frames = prompt_images.of_results(results)         # NoFrames, or StepFrames (visual envs)
    images = frames.for_columns(sample.column_frames)  # TextPrompts, or FramePrompts
    logp, n = scoring.cross_logprobs(model, z, x, pad_id=..., images=images)

A visual environment's prompt x_j holds one image block per turn it shows (rollout.images); the
policy sampled its reply with those frames' features in the blocks, so the scoring forward
splices the same ones (`Qwen2_5_VL.frames_backbone`: the frames through the vision tower, the
M-RoPE positions and rope delta that they imply), and the cross-score l(i, j) is the policy's
log p(z_i | x_j). Column j's frames are those of the turns its prompt shows (`Sample.
column_frames`: its episode and turns), gathered on the device from the step's rollouts
(`RolloutResult.frames_KxBxHxWx3`). Token-identical prompts are the same column only when their
frames are identical too (`column_ids`).

Dimension legend: P prompt columns, N frames a prompt shows (the most of any column; a column's
frames past its own repeat its last and are never spliced), K turns, E episodes of the step,
H x W x 3 a frame.
"""

from typing import Dict, Sequence, Tuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import distributed

Columns = Sequence[Tuple[int, Sequence[int]]]  # (episode, turns shown) of each column


@struct.dataclass
class TextPrompts:
  """Prompts of text alone: the plain backbone."""

  def rows(self, num_rows: int) -> "TextPrompts":
    del num_rows
    return self

  def prefill(self, model, ids_PxW, mask_PxW, cache):
    """The cache after `model` reads the prompts (inside the jitted prefill)."""
    return model.backbone(ids_PxW, mask_PxW, cache=cache)[1]

  def column_ids(self, column_ids_P: np.ndarray) -> np.ndarray:
    return column_ids_P


@struct.dataclass
class FramePrompts:
  """Prompts whose k-th image block shows frames_PxNxHxWx3[j, k]."""

  frames_PxNxHxWx3: jax.Array  # uint8

  def rows(self, num_rows: int) -> "FramePrompts":
    """The frames of `num_rows` >= P prompt rows; the padding rows (no image tokens) repeat
    column 0's."""
    extra = num_rows - self.frames_PxNxHxWx3.shape[0]
    pad = jnp.repeat(self.frames_PxNxHxWx3[:1], extra, axis=0)
    return FramePrompts(jnp.concatenate([self.frames_PxNxHxWx3, pad]))

  def prefill(self, model, ids_PxW, mask_PxW, cache):
    """The cache (with each row's rope delta) after `model` reads the prompts and their frames;
    no gradient: the diagnostics only score."""
    return model.frames_backbone(ids_PxW, mask_PxW, self.frames_PxNxHxWx3, False, cache=cache)[1]

  def column_ids(self, column_ids_P: np.ndarray) -> np.ndarray:
    """`column_ids_P` (equal for token-identical prompts) split where the frames differ."""
    p = self.frames_PxNxHxWx3.shape[0]
    frames = distributed.local_rows(self.frames_PxNxHxWx3, 0, p)  # whole, on every process
    seen: Dict[Tuple[int, bytes], int] = {}
    return np.array(
        [seen.setdefault((int(c), f.tobytes()), len(seen)) for c, f in zip(column_ids_P, frames)],
        np.int32,
    )


class NoFrames:
  """A step whose environments are seen as text."""

  def for_columns(self, columns: Columns) -> TextPrompts:
    del columns
    return TextPrompts()


class StepFrames:
  """The frames of a step's episodes (numbered over the tags in order, as `collect_turns`)."""

  def __init__(self, frames_KxExHxWx3: jax.Array):
    self.frames_KxExHxWx3 = frames_KxExHxWx3

  def for_columns(self, columns: Columns) -> FramePrompts:
    """Each column's frames: those of its episode's turns shown, in order (on the device)."""
    n = max([len(turns) for _, turns in columns] + [1])
    turn_PxN = np.zeros((len(columns), n), np.int32)
    episode_P = np.zeros((len(columns),), np.int32)
    for j, (episode, turns) in enumerate(columns):
      turns = list(turns) or [0]
      turn_PxN[j] = turns + [turns[-1]] * (n - len(turns))
      episode_P[j] = episode
    return FramePrompts(self.frames_KxExHxWx3[turn_PxN, episode_P[:, None]])


def of_results(results: Dict[str, object]) -> NoFrames | StepFrames:
  """The frames of a step's rollouts (`{tag: RolloutResult}`): StepFrames when every tag's
  environment is seen as images, NoFrames when none is.

  Raises:
    ValueError: the tags mix environments seen as images and as text (training rejects such a
      step too).
  """
  frames = [r.frames_KxBxHxWx3 for r in results.values()]
  if all(f is None for f in frames):
    return NoFrames()
  if any(f is None for f in frames):
    raise ValueError("the step mixes environments seen as images and as text")
  k = max(f.shape[0] for f in frames)
  # Tags that played fewer turns: turns they did not play are never shown.
  grow = lambda f: jnp.pad(jnp.asarray(f), [(0, k - f.shape[0])] + [(0, 0)] * (f.ndim - 1))
  return StepFrames(jnp.concatenate([grow(f) for f in frames], axis=1))

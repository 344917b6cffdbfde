"""Qwen2.5-VL's vision tower in Flax NNX: patches -> image features of the decoder's width.

    layout = vision.patch_layout(image_grid_thw_Nx3, config.vision)     # host, NumPy
    features_IxD = tower(pixel_values_PxC, *layout)   # jit: shapes fixed by P, frame_patches static

pixel_values holds every image's patches one after the other, as transformers' image processor
writes them: P rows of C values, each image's rows ordered so that every M consecutive rows form
one 2x2 merge block. The tower is the linear patch embedding (transformers' Conv3d with stride =
kernel), Lv pre-norm blocks (attention with a 2-D rotary over each patch's row and column, then
a SwiGLU with biases) and the patch merger (RMSNorm, M patches as one vector, Linear, GELU,
Linear). Window blocks attend within the windows of `window_size` pixels, the others over the
whole image (transformers' cu_seqlens). When every frame of a call has as many patches p (the
visual environments' frames, one size), attention runs per frame: [N, Hv, p, p] scores, window
blocks masked within the frame, so memory and time grow linearly with the frames of a call.
Frames of several sizes in one call share one [P, P] square masked to the same window or frame
(`PatchLayout.frame_patches` 0). transformers reorders the patches window by window instead;
attention does not depend on the order and the rotary is per patch, so all compute the same
features.

Dimension legend: P patches, C values per patch, N images, Lv blocks, Dv width, Hv heads,
Dhv head dim, Fv MLP width, M patches per image token, I = P / M image tokens, D decoder width.
"""

from typing import Callable, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models import layers as ops
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.vision_config import vision_table
from ragen_jax.models.vision_config import VisionConfig

_NORM_EPS = 1e-6  # transformers fixes the tower's RMSNorm epsilon


class PatchLayout(NamedTuple):
  """Where each patch of pixel_values sits (int32 NumPy arrays, computed on the host).

  Attributes:
    hw_2xP: its row and column in its image's patch grid (the rotary positions).
    frame_P: which image (frame) it belongs to: full-attention blocks attend within it.
    window_P: which window it belongs to (ids unique over all images).
    frame_patches: p, the patches of every frame when all frames have as many (attention per
      frame); 0 when they differ (one masked [P, P] square). A Python int: a jit static.
  """

  hw_2xP: np.ndarray
  frame_P: np.ndarray
  window_P: np.ndarray
  frame_patches: int


def _merge_block_order(a_HxW: np.ndarray, m: int) -> np.ndarray:
  """a's values in transformers' patch order: m x m merge blocks row-major, each row-major."""
  h, w = a_HxW.shape
  return a_HxW.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)


def patch_layout(image_grid_thw_Nx3, v: VisionConfig) -> PatchLayout:
  """The PatchLayout of the images with these (frames, rows, columns) patch grids, in
  transformers' patch order (block-major over the M-patch merge blocks).

  Raises:
    ValueError: a grid side that is not a multiple of spatial_merge_size.
  """
  m, side = v.spatial_merge_size, v.window_tokens
  hw, frames, windows, sizes = [], [], [], set()
  frame_id = window_id = 0
  for t, h, w in np.asarray(image_grid_thw_Nx3, np.int64).reshape(-1, 3).tolist():
    if h % m or w % m:
      raise ValueError(f"image grid {h}x{w} patches is not a multiple of the merge size {m}")
    rows_HxW, cols_HxW = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    rows, cols = _merge_block_order(rows_HxW, m), _merge_block_order(cols_HxW, m)
    windows_across = -(-(w // m) // side)
    window = (rows // m // side) * windows_across + (cols // m // side)
    windows_per_frame = -(-(h // m) // side) * windows_across
    sizes.add(h * w)
    for _ in range(t):
      hw.append(np.stack([rows, cols]))
      frames.append(np.full(h * w, frame_id))
      windows.append(window + window_id)
      frame_id, window_id = frame_id + 1, window_id + windows_per_frame
  if not hw:
    empty = np.zeros(0, np.int32)
    return PatchLayout(np.zeros((2, 0), np.int32), empty, empty, 0)
  cat = lambda arrays, axis=0: np.concatenate(arrays, axis=axis).astype(np.int32)
  frame_patches = sizes.pop() if len(sizes) == 1 else 0
  return PatchLayout(cat(hw, 1), cat(frames), cat(windows), frame_patches)


# attend(q, k, v [P, Hv, Dhv], full: a block attending over whole frames) -> [P, Hv, Dhv]
Attend = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def _attention(q_NxQxHxDh, k_NxKxHxDh, v_NxKxHxDh, allowed_NxQxK, scale: float) -> jax.Array:
  """Softmax attention of each group n's queries over its keys where allowed; float32 scores."""
  scores_NxHxQxK = (
      jnp.einsum("nqhe,nkhe->nhqk", q_NxQxHxDh, k_NxKxHxDh, preferred_element_type=jnp.float32)
      * scale
  )
  scores_NxHxQxK = jnp.where(allowed_NxQxK[:, None], scores_NxHxQxK, jnp.finfo(jnp.float32).min)
  probs_NxHxQxK = jax.nn.softmax(scores_NxHxQxK, axis=-1).astype(v_NxKxHxDh.dtype)
  return jnp.einsum("nhqk,nkhe->nqhe", probs_NxHxQxK, v_NxKxHxDh)


def attention_pattern(layout: PatchLayout, scale: float) -> Attend:
  """How the blocks attend over the patches of `layout` (arrays possibly traced; frame_patches
  static): per frame when every frame has as many patches, else over one masked square."""
  _, frame_P, window_P, p = layout
  if p:
    window_NxP = window_P.reshape(-1, p)
    same_window_NxPxP = window_NxP[:, :, None] == window_NxP[:, None, :]

    def per_frame(q_PxHxDh, k_PxHxDh, v_PxHxDh, full):
      frames = lambda a_PxHxDh: a_PxHxDh.reshape((-1, p) + a_PxHxDh.shape[1:])
      allowed_NxPxP = jnp.logical_or(same_window_NxPxP, full)
      out = _attention(frames(q_PxHxDh), frames(k_PxHxDh), frames(v_PxHxDh), allowed_NxPxP, scale)
      return out.reshape(q_PxHxDh.shape)

    return per_frame
  same_frame_PxP = frame_P[:, None] == frame_P[None, :]
  same_window_PxP = window_P[:, None] == window_P[None, :]

  def square(q_PxHxDh, k_PxHxDh, v_PxHxDh, full):
    allowed_1xPxP = jnp.where(full, same_frame_PxP, same_window_PxP)[None]
    return _attention(q_PxHxDh[None], k_PxHxDh[None], v_PxHxDh[None], allowed_1xPxP, scale)[0]

  return square


def _block(p, x_PxDv, angles_1xPxDh2, attend: Attend, full):
  """One pre-norm vision block; `p` holds its slice of the stacked parameters, `full` whether it
  attends over whole frames (else within windows)."""
  h_PxDv = ops.rms_norm(x_PxDv, p["vision_attn_norm"], _NORM_EPS)
  qkv_Px3xHxDh = jnp.einsum("pd,dkhe->pkhe", h_PxDv, p["vision_qkv_kernel"])
  qkv_Px3xHxDh = qkv_Px3xHxDh + p["vision_qkv_bias"][None]
  rotate = lambda a_PxHxDh: ops.apply_rope(a_PxHxDh[None], angles_1xPxDh2)[0]
  q_PxHxDh, k_PxHxDh = rotate(qkv_Px3xHxDh[:, 0]), rotate(qkv_Px3xHxDh[:, 1])
  attn_PxHxDh = attend(q_PxHxDh, k_PxHxDh, qkv_Px3xHxDh[:, 2], full)
  out_PxDv = jnp.einsum("phe,hed->pd", attn_PxHxDh, p["vision_o_kernel"]) + p["vision_o_bias"][None]
  x_PxDv = x_PxDv + out_PxDv
  h_PxDv = ops.rms_norm(x_PxDv, p["vision_mlp_norm"], _NORM_EPS)
  gate_PxF = h_PxDv @ p["vision_gate_kernel"] + p["vision_gate_bias"][None]
  up_PxF = h_PxDv @ p["vision_up_kernel"] + p["vision_up_bias"][None]
  down_PxDv = (jax.nn.silu(gate_PxF) * up_PxF) @ p["vision_down_kernel"] + p["vision_down_bias"][
      None
  ]
  return x_PxDv + down_PxDv


class VisionTower(nnx.Module):
  """The vision tower of `config.vision`, its parameters those of `vision_config.vision_table`
  (per-block ones stacked on a leading Lv axis)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    table = vision_table(config.vision, config.hidden_size)
    kernels = [name for name in table if name.endswith("_kernel")]
    values = dict(zip(kernels, ops.normal_arrays(rngs, [table[n][0] for n in kernels])))
    for name, (shape, axes) in table.items():
      # As transformers initialises them: kernels normal, biases 0, norm scales 1.
      fill = jnp.ones if name.endswith("_norm") else jnp.zeros
      value = values[name] if name in values else fill(shape)
      setattr(self, name, ops.param(value, axes, config.param_dtype))

  def __call__(self, pixel_values_PxC, hw_2xP, frame_P, window_P, frame_patches: int) -> jax.Array:
    """features_IxD, one per M consecutive patches, in config.dtype (`patch_layout` gives the
    last four arguments; frame_patches a Python int)."""
    c, v = self.config, self.config.vision
    table = vision_table(v, c.hidden_size)
    p = {name: getattr(self, name)[...].astype(c.dtype) for name in table}
    x_PxDv = pixel_values_PxC.astype(c.dtype) @ p["vision_patch_kernel"]
    # 2-D rotary: half of each head turns with the patch's row, half with its column.
    quarter = v.head_dim // 4
    inv_freq_Dh2 = jnp.tile(ops.rope_inv_freq(v.head_dim // 2, v.rope_theta), 2)
    angles_1xPxDh2 = ops.rope_angles(hw_2xP[:, None, :], inv_freq_Dh2, (quarter, quarter))
    layout = PatchLayout(hw_2xP, frame_P, window_P, frame_patches)
    attend = attention_pattern(layout, v.head_dim**-0.5)
    full_L = np.isin(np.arange(v.depth), v.fullatt_block_indexes)
    stacked = {name: p[name] for name, (_, axes) in table.items() if axes[0] == "layers"}

    def block(x_PxDv, xs):
      params, full = xs
      return _block(params, x_PxDv, angles_1xPxDh2, attend, full), None

    x_PxDv, _ = jax.lax.scan(block, x_PxDv, (stacked, full_L))
    h_PxDv = ops.rms_norm(x_PxDv, p["vision_merger_norm"], _NORM_EPS)
    h_IxMDv = h_PxDv.reshape(-1, v.merge_unit * v.hidden_size)
    h_IxMDv = h_IxMDv @ p["vision_merger_hidden_kernel"] + p["vision_merger_hidden_bias"][None]
    h_IxMDv = jax.nn.gelu(h_IxMDv, approximate=False)  # torch's nn.GELU(): the erf form
    return h_IxMDv @ p["vision_merger_out_kernel"] + p["vision_merger_out_bias"][None]

"""Qwen2.5-VL's vision tower in Flax NNX: patches -> image features of the decoder's width.

    layout = vision.patch_layout(image_grid_thw_Nx3, config.vision)     # host, NumPy
    features_IxD = tower(pixel_values_PxC, *layout)                     # jit: shapes fixed by P

pixel_values holds every image's patches one after the other, as transformers' image processor
writes them: P rows of C values, each image's rows ordered so that every M consecutive rows form
one 2x2 merge block. The tower is the linear patch embedding (transformers' Conv3d with stride =
kernel), Lv pre-norm blocks (attention with a 2-D rotary over each patch's row and column, then
a SwiGLU with biases) and the patch merger (RMSNorm, M patches as one vector, Linear, GELU,
Linear). Window blocks attend within the windows of `window_size` pixels, the others over the
whole image: here as a [P, P] mask of the same window or image. transformers reorders the patches
window by window instead; attention does not depend on the order and the rotary is per patch, so
both compute the same features.

Dimension legend: P patches, C values per patch, N images, Lv blocks, Dv width, Hv heads,
Dhv head dim, Fv MLP width, M patches per image token, I = P / M image tokens, D decoder width.
"""

from typing import NamedTuple

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
  """

  hw_2xP: np.ndarray
  frame_P: np.ndarray
  window_P: np.ndarray


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
  hw, frames, windows = [], [], []
  frame_id = window_id = 0
  for t, h, w in np.asarray(image_grid_thw_Nx3, np.int64).reshape(-1, 3).tolist():
    if h % m or w % m:
      raise ValueError(f"image grid {h}x{w} patches is not a multiple of the merge size {m}")
    rows_HxW, cols_HxW = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    rows, cols = _merge_block_order(rows_HxW, m), _merge_block_order(cols_HxW, m)
    windows_across = -(-(w // m) // side)
    window = (rows // m // side) * windows_across + (cols // m // side)
    windows_per_frame = -(-(h // m) // side) * windows_across
    for _ in range(t):
      hw.append(np.stack([rows, cols]))
      frames.append(np.full(h * w, frame_id))
      windows.append(window + window_id)
      frame_id, window_id = frame_id + 1, window_id + windows_per_frame
  if not hw:
    return PatchLayout(np.zeros((2, 0), np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))
  cat = lambda arrays, axis=0: np.concatenate(arrays, axis=axis).astype(np.int32)
  return PatchLayout(cat(hw, 1), cat(frames), cat(windows))


def _block(v: VisionConfig, p, x_PxDv, angles_1xPxDh2, allowed_PxP):
  """One pre-norm vision block; `p` holds its slice of the stacked parameters."""
  h_PxDv = ops.rms_norm(x_PxDv, p["vision_attn_norm"], _NORM_EPS)
  qkv_Px3xHxDh = jnp.einsum("pd,dkhe->pkhe", h_PxDv, p["vision_qkv_kernel"])
  qkv_Px3xHxDh = qkv_Px3xHxDh + p["vision_qkv_bias"][None]
  rotate = lambda a_PxHxDh: ops.apply_rope(a_PxHxDh[None], angles_1xPxDh2)[0]
  q_PxHxDh, k_PxHxDh = rotate(qkv_Px3xHxDh[:, 0]), rotate(qkv_Px3xHxDh[:, 1])
  scores_HxPxP = jnp.einsum(
      "qhe,khe->hqk", q_PxHxDh, k_PxHxDh, preferred_element_type=jnp.float32
  ) * (v.head_dim**-0.5)
  scores_HxPxP = jnp.where(allowed_PxP[None], scores_HxPxP, jnp.finfo(jnp.float32).min)
  probs_HxPxP = jax.nn.softmax(scores_HxPxP, axis=-1).astype(x_PxDv.dtype)
  attn_PxHxDh = jnp.einsum("hqk,khe->qhe", probs_HxPxP, qkv_Px3xHxDh[:, 2])
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

  def __call__(self, pixel_values_PxC, hw_2xP, frame_P, window_P) -> jax.Array:
    """features_IxD, one per M consecutive patches, in config.dtype (`patch_layout` gives the
    last three arguments)."""
    c, v = self.config, self.config.vision
    table = vision_table(v, c.hidden_size)
    p = {name: getattr(self, name)[...].astype(c.dtype) for name in table}
    x_PxDv = pixel_values_PxC.astype(c.dtype) @ p["vision_patch_kernel"]
    # 2-D rotary: half of each head turns with the patch's row, half with its column.
    quarter = v.head_dim // 4
    inv_freq_Dh2 = jnp.tile(ops.rope_inv_freq(v.head_dim // 2, v.rope_theta), 2)
    angles_1xPxDh2 = ops.rope_angles(hw_2xP[:, None, :], inv_freq_Dh2, (quarter, quarter))
    same_frame_PxP = frame_P[:, None] == frame_P[None, :]
    same_window_PxP = window_P[:, None] == window_P[None, :]
    full_L = np.isin(np.arange(v.depth), v.fullatt_block_indexes)
    stacked = {name: p[name] for name, (_, axes) in table.items() if axes[0] == "layers"}

    def block(x_PxDv, xs):
      params, full = xs
      allowed_PxP = jnp.where(full, same_frame_PxP, same_window_PxP)
      return _block(v, params, x_PxDv, angles_1xPxDh2, allowed_PxP), None

    x_PxDv, _ = jax.lax.scan(block, x_PxDv, (stacked, full_L))
    h_PxDv = ops.rms_norm(x_PxDv, p["vision_merger_norm"], _NORM_EPS)
    h_IxMDv = h_PxDv.reshape(-1, v.merge_unit * v.hidden_size)
    h_IxMDv = h_IxMDv @ p["vision_merger_hidden_kernel"] + p["vision_merger_hidden_bias"][None]
    h_IxMDv = jax.nn.gelu(h_IxMDv, approximate=False)  # torch's nn.GELU(): the erf form
    return h_IxMDv @ p["vision_merger_out_kernel"] + p["vision_merger_out_bias"][None]

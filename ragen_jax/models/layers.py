"""Pure-function pieces of the decoder (Qwen2, Qwen3, Llama, Qwen2.5-VL) and its vision tower:
RMSNorm, RoPE over 1-D or multi-axis positions, the splice of image features into the token
embeddings, and the parameter initialisers (attention: attention.py; the SwiGLU MLP is in the
layer, whose one `linear` carries LoRA).

They take raw arrays (one layer's slice of the stacked parameters) so that the
decoder can `lax.scan` over layers. Dimension legend: B batch, T new tokens,
S keys, D model dim, H query heads, K kv heads, G = H // K, Dh head dim,
F mlp dim, A position axes, I image tokens, N = B * T.
"""

import itertools
import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

_INIT_STD = 0.02  # transformers' initializer_range for Qwen2 and Qwen2.5-VL.


def param(value, axes, dtype) -> nnx.Param:
  """A parameter with logical axis names `axes` (`out_sharding` metadata)."""
  # eager_sharding=False: names are metadata only; no mesh is needed here.
  return nnx.Param(jnp.asarray(value).astype(dtype), out_sharding=axes, eager_sharding=False)


def normal_arrays(rngs: nnx.Rngs, shapes: list[tuple[int, ...]]) -> list[jax.Array]:
  """N(0, 0.02^2) arrays for all `shapes` from one flat draw.

  One threefry kernel instead of one per tensor: on CPU this cuts the compile
  time of model initialisation about tenfold.
  """
  sizes = [math.prod(shape) for shape in shapes]
  flat = _INIT_STD * jax.random.normal(rngs.params(), (sum(sizes),), jnp.float32)
  offsets = [0] + list(itertools.accumulate(sizes))
  return [flat[o : o + n].reshape(shape) for o, n, shape in zip(offsets, sizes, shapes)]


def rms_norm(x_BxTxD: jax.Array, scale_D: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis computed in float32, as in transformers' Qwen2RMSNorm.

  Also Qwen3's q/k norm: x [B, T, N, Dh] with a [Dh] scale normalises each head.

  Args:
    x_BxTxD: activations.
    scale_D: learned per-channel scale.
    eps: added to the mean square.

  Returns:
    The normalised activations in x's dtype.
  """
  x32 = x_BxTxD.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  # transformers casts back before the scale; keep that order for bf16 parity.
  scale = scale_D.astype(x_BxTxD.dtype).reshape((1,) * (x32.ndim - 1) + (-1,))
  return scale * x32.astype(x_BxTxD.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> jax.Array:
  """The Dh/2 rotary frequencies, in float32 as transformers computes them.

  Args:
    head_dim: Dh.
    theta: base frequency.
    scaling: a config.RopeScaling (Llama 3.1's "llama3" remapping) or None.

  Returns:
    inv_freq_Dh2, radians per position of each rotated pair.
  """
  inv_freq_Dh2 = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if scaling is None:
    return inv_freq_Dh2
  # llama3: pre-trained at `original` positions, the model keeps the frequencies that turn
  # many times within that context (wavelength below original / high_freq_factor), slows
  # those that turn less than once in it (wavelength above original / low_freq_factor) by
  # `factor`, and blends the two linearly in original / wavelength between them.
  original = float(scaling.original_max_position_embeddings)
  low, high = scaling.low_freq_factor, scaling.high_freq_factor
  wavelen_Dh2 = 2 * math.pi / inv_freq_Dh2
  scaled_Dh2 = inv_freq_Dh2 / scaling.factor
  smooth_Dh2 = (original / wavelen_Dh2 - low) / (high - low)
  blended_Dh2 = (1 - smooth_Dh2) * scaled_Dh2 + smooth_Dh2 * inv_freq_Dh2
  return jnp.where(
      wavelen_Dh2 < original / high,
      inv_freq_Dh2,
      jnp.where(wavelen_Dh2 > original / low, scaled_Dh2, blended_Dh2),
  )


def rope_angles(positions, inv_freq_Dh2: jax.Array, sections=None) -> jax.Array:
  """angles_BxTxDh2, radians of each rotated pair at each position.

  Args:
    positions: integer positions, [B, T] (every frequency turns with one position), or [A, B, T]
      (M-RoPE: Qwen2.5-VL's t, h, w; the tower's h, w).
    inv_freq_Dh2: the frequencies.
    sections: with [A, B, T] positions, the sizes of consecutive chunks of the Dh/2 frequencies
      (summing to Dh/2); chunk i turns with axis i % A, as transformers' mrope_section. Where
      all A axes are equal this is exactly the 1-D rotary.
  """
  positions = positions.astype(jnp.float32)
  if positions.ndim == 2:
    return positions[..., None] * inv_freq_Dh2[None, None]
  axis_Dh2 = np.repeat(np.arange(len(sections)) % positions.shape[0], sections)  # static
  return jnp.moveaxis(positions[axis_Dh2], 0, -1) * inv_freq_Dh2[None, None]


def rope(x_BxTxNxDh: jax.Array, positions, theta: float, scaling=None, sections=None) -> jax.Array:
  """Rotary embedding with the half-split layout of Qwen2, Qwen3, Llama and Qwen2.5-VL.

  Args:
    x_BxTxNxDh: queries or keys (N = H or K).
    positions: integer positions, [B, T] or, with `sections`, [A, B, T] (`rope_angles`).
    theta: base frequency.
    scaling: optional frequency remapping (config.RopeScaling), see `rope_inv_freq`.
    sections: M-RoPE's split of the frequencies over the position axes (`rope_angles`).

  Returns:
    The rotated array, same shape and dtype.
  """
  inv_freq_Dh2 = rope_inv_freq(x_BxTxNxDh.shape[-1], theta, scaling)
  return apply_rope(x_BxTxNxDh, rope_angles(positions, inv_freq_Dh2, sections))


def apply_rope(x_BxTxNxDh: jax.Array, angles_BxTxDh2: jax.Array) -> jax.Array:
  """x rotated by `angles` in float32, the first half of Dh paired with the second."""
  sin = jnp.sin(angles_BxTxDh2)[:, :, None, :]
  cos = jnp.cos(angles_BxTxDh2)[:, :, None, :]
  x1, x2 = jnp.split(x_BxTxNxDh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxDh.dtype)


def splice(x_BxTxD: jax.Array, is_image_BxT: jax.Array, features: jax.Array) -> jax.Array:
  """x with the image-pad positions replaced by image features.

  transformers' masked_scatter, in a form that jit accepts: the k-th image position takes row k
  of the features through a cumulative-sum gather. `features` is [I, D], taken in row-major
  order over the whole batch (the positions must number I), or [B, I, D], each row's own (a
  row takes its first features, one per image position, and may have none: a batch of fixed
  shape whose rows do not all show an image this chunk).
  """
  b, t, d = x_BxTxD.shape
  if features.ndim == 3:
    row_BxT = jnp.clip(jnp.cumsum(is_image_BxT, axis=1, dtype=jnp.int32) - 1, 0, None)
    row_BxT = jnp.minimum(row_BxT, features.shape[1] - 1)
    gathered_BxTxD = jnp.take_along_axis(features, row_BxT[..., None], axis=1)
    return jnp.where(is_image_BxT[..., None], gathered_BxTxD.astype(x_BxTxD.dtype), x_BxTxD)
  is_image_N = is_image_BxT.reshape(b * t)
  row_N = jnp.clip(jnp.cumsum(is_image_N, dtype=jnp.int32) - 1, 0, features.shape[0] - 1)
  gathered_NxD = jnp.take(features, row_N, axis=0).astype(x_BxTxD.dtype)
  return jnp.where(is_image_N[:, None], gathered_NxD, x_BxTxD.reshape(b * t, d)).reshape(b, t, d)

"""Pure-function pieces of the decoder (Qwen2, Qwen3, Llama): RMSNorm and RoPE (attention:
attention.py; the SwiGLU MLP is in the layer, whose one `linear` carries LoRA).

They take raw arrays (one layer's slice of the stacked parameters) so that the
decoder can `lax.scan` over layers. Dimension legend: B batch, T new tokens,
S keys, D model dim, H query heads, K kv heads, G = H // K, Dh head dim,
F mlp dim.
"""

import math

import jax
import jax.numpy as jnp


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


def rope(x_BxTxNxDh: jax.Array, positions_BxT: jax.Array, theta: float, scaling=None) -> jax.Array:
  """Rotary embedding with the half-split layout of Qwen2, Qwen3 and Llama.

  Args:
    x_BxTxNxDh: queries or keys (N = H or K).
    positions_BxT: integer positions.
    theta: base frequency.
    scaling: optional frequency remapping (config.RopeScaling), see `rope_inv_freq`.

  Returns:
    The rotated array, same shape and dtype.
  """
  inv_freq_Dh2 = rope_inv_freq(x_BxTxNxDh.shape[-1], theta, scaling)
  angles_BxTxDh2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_Dh2[None, None]
  sin = jnp.sin(angles_BxTxDh2)[:, :, None, :]
  cos = jnp.cos(angles_BxTxDh2)[:, :, None, :]
  x1, x2 = jnp.split(x_BxTxNxDh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxDh.dtype)

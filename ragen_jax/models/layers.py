"""Pure-function pieces of the Qwen2 decoder: RMSNorm, RoPE, MLP (attention: attention.py).

They take raw arrays (one layer's slice of the stacked parameters) so that the
decoder can `lax.scan` over layers. Dimension legend: B batch, T new tokens,
S keys, D model dim, H query heads, K kv heads, G = H // K, Dh head dim,
F mlp dim.
"""

import jax
import jax.numpy as jnp

def rms_norm(x_BxTxD: jax.Array, scale_D: jax.Array, eps: float) -> jax.Array:
  """RMSNorm computed in float32, as in transformers' Qwen2RMSNorm.

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


def rope(x_BxTxNxDh: jax.Array, positions_BxT: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding with the half-split layout that Qwen2 uses.

  Args:
    x_BxTxNxDh: queries or keys (N = H or K).
    positions_BxT: integer positions.
    theta: base frequency.

  Returns:
    The rotated array, same shape and dtype.
  """
  dh = x_BxTxNxDh.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
  angles_BxTxDh2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq[None, None]
  sin = jnp.sin(angles_BxTxDh2)[:, :, None, :]
  cos = jnp.cos(angles_BxTxDh2)[:, :, None, :]
  x1, x2 = jnp.split(x_BxTxNxDh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxDh.dtype)


def swiglu(
    x_BxTxD: jax.Array, gate_DxF: jax.Array, up_DxF: jax.Array, down_FxD: jax.Array
) -> jax.Array:
  """Qwen2's MLP: down(silu(gate(x)) * up(x)), no biases."""
  gate_BxTxF = jax.nn.silu(x_BxTxD @ gate_DxF)
  return (gate_BxTxF * (x_BxTxD @ up_DxF)) @ down_FxD

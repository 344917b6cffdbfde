"""The decoder's KV caches: one stacked [L, B, K, S, Dh] buffer per tensor (`KVCache`), or one
array per layer (`LayerCache`, what a sampler call carries into `Decoder.decode`).

Dimension legend: B batch, S cache capacity (slots), L layers, K kv heads, Dh head dim.
"""

from typing import Tuple

from flax import struct
import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
  """Keys and values of all layers, written in place at `end_index`.

  Kv heads come before slots ([B, K, S, Dh] per layer), the layout decoding reads one query at
  a time from without a transpose per step.

  Attributes:
    k_LxBxKxSxDh: rotated keys.
    v_LxBxKxSxDh: values.
    mask_BxS: True for slots that hold a real (non-padding) token.
    end_index: int32 scalar, the slot the next token is written to.
    rope_delta_B: int32, how far each row's next rotary position lies beyond its real slots
      (Qwen2.5-VL: an image's tokens advance the position by the larger side of its token grid,
      not by their number; transformers' rope_deltas). None: 0, every position counts the real
      slots before it (text-only models). A chunk with images sets it (`Decoder`).
  """

  k_LxBxKxSxDh: jax.Array
  v_LxBxKxSxDh: jax.Array
  mask_BxS: jax.Array
  end_index: jax.Array
  rope_delta_B: jax.Array | None = None

  @property
  def capacity(self) -> int:
    return self.mask_BxS.shape[1]

  def per_layer(self, window: int) -> "LayerCache":
    """The first `window` slots as one array per layer (the rest must stay empty meanwhile)."""
    split = lambda a: tuple(a[layer, :, :, :window] for layer in range(a.shape[0]))
    return LayerCache(
        split(self.k_LxBxKxSxDh),
        split(self.v_LxBxKxSxDh),
        self.mask_BxS[:, :window],
        self.end_index,
        self.rope_delta_B,
    )


@struct.dataclass
class LayerCache:
  """A KVCache (or its first slots) held as one [B, K, S, Dh] array per layer.

  What a decode loop carries (beside the layers' weights, `Decoder.layer_weights`): each step
  updates a layer's buffer in place and reads it whole, where slicing a layer out of one stacked
  buffer would copy it every step, and the attention costs the window, not the whole capacity.
  """

  k_layers: Tuple[jax.Array, ...]  # L arrays of [B, K, S, Dh]
  v_layers: Tuple[jax.Array, ...]
  mask_BxS: jax.Array
  end_index: jax.Array
  rope_delta_B: jax.Array | None = None  # as KVCache's

  @property
  def capacity(self) -> int:
    return self.mask_BxS.shape[1]

  def into(self, cache: KVCache) -> KVCache:
    """`cache` with its first slots replaced by these."""
    put = lambda full, part: jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)
    return KVCache(
        put(cache.k_LxBxKxSxDh, jnp.stack(self.k_layers)),
        put(cache.v_LxBxKxSxDh, jnp.stack(self.v_layers)),
        put(cache.mask_BxS, self.mask_BxS),
        self.end_index,
        self.rope_delta_B,
    )


def init_cache(config: ModelConfig, batch: int, capacity: int, dtype=None) -> KVCache:
  """Returns an empty cache for `batch` sequences of up to `capacity` tokens.

  Args:
    config: the model config.
    batch: B.
    capacity: S, total prompt plus generated tokens. Writing past it is not
      checked under jit (dynamic_update_slice clamps), so size it generously.
    dtype: storage dtype of k and v; defaults to config.dtype.

  A Qwen2.5-VL config's cache starts with rope deltas of 0 (text-only models have none), so its
  structure stays the same through prefills with and without images and decoding.
  """
  shape = (config.num_layers, batch, config.num_kv_heads, capacity, config.head_dim)
  dtype = config.dtype if dtype is None else dtype
  return KVCache(
      k_LxBxKxSxDh=jnp.zeros(shape, dtype),
      v_LxBxKxSxDh=jnp.zeros(shape, dtype),
      mask_BxS=jnp.zeros((batch, capacity), bool),
      end_index=jnp.zeros((), jnp.int32),
      rope_delta_B=None if config.vision is None else jnp.zeros((batch,), jnp.int32),
  )

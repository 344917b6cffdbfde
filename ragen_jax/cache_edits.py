"""Edits of a sampler's KV cache between calls: a prompt prefilled apart (`prefill`,
`prefill_shared`), a cache reopened with its slots (`restore_prefix`), holes squeezed out
(`compact`), and the attention window a call needs (`window_for`). `ragen_jax.sampling`
exports them all; the multi-turn rollout (rollout.policies) calls them there.

A Qwen2.5-VL cache's rope delta (`KVCache.rope_delta_B`) goes with its slots: a reopened cache
takes the prefix's, a compacted row keeps its own.

Dimension legend: B rows, T prompt tokens, P prefix slots, S cache capacity.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from ragen_jax import models


def _prefill(graphdef, params, ids_BxT, mask_BxT) -> models.KVCache:
  model = nnx.merge(graphdef, params)
  b, t = ids_BxT.shape
  cache = models.init_cache(model.config, b, t)
  return model.backbone(ids_BxT, mask_BxT, cache=cache)[1]


def _restore_prefix(cache: models.KVCache, prefix: models.KVCache, rows_B=None):
  b, p = cache.mask_BxS.shape[0], prefix.mask_BxS.shape[1]
  put = lambda full, part: jax.lax.dynamic_update_slice(
      full, jnp.broadcast_to(part, full.shape[:1] + (b,) + part.shape[2:]), (0,) * full.ndim
  )
  mask_BxP = jnp.broadcast_to(prefix.mask_BxS, (b, p))
  if rows_B is not None:
    mask_BxP = mask_BxP & rows_B[:, None]
  return models.KVCache(
      k_LxBxKxSxDh=put(cache.k_LxBxKxSxDh, prefix.k_LxBxKxSxDh.astype(cache.k_LxBxKxSxDh.dtype)),
      v_LxBxKxSxDh=put(cache.v_LxBxKxSxDh, prefix.v_LxBxKxSxDh.astype(cache.v_LxBxKxSxDh.dtype)),
      mask_BxS=jnp.zeros_like(cache.mask_BxS).at[:, :p].set(mask_BxP),
      end_index=jnp.int32(p),
      rope_delta_B=_prefix_delta(cache, prefix, b),
  )


def _prefix_delta(cache: models.KVCache, prefix: models.KVCache, b: int):
  """The rope delta of a cache reopened with `prefix`'s slots: the prefix's (broadcast to the
  B rows), in the cache's structure (None for a text-only model)."""
  if cache.rope_delta_B is None:
    return None
  if prefix.rope_delta_B is None:
    return jnp.zeros_like(cache.rope_delta_B)
  return jnp.broadcast_to(prefix.rope_delta_B, (b,)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def prefill(graphdef, params, ids_BxT, mask_BxT) -> models.KVCache:
  """A cache holding exactly the left-padded prompts ids_BxT (capacity T, end_index T): the keys
  and values that `restore_prefix` copies into a rollout's cache."""
  return _prefill(graphdef, params, ids_BxT, mask_BxT)


@functools.partial(jax.jit, donate_argnames=("cache",))
def restore_prefix(cache: models.KVCache, prefix: models.KVCache, rows_B=None) -> models.KVCache:
  """`cache` emptied, then `prefix`'s P slots in its first P slots (one prefix row broadcast to
  every row, or one per row), end_index P; `rows_B` (optional) keeps only those rows' slots.

  Slots past P keep stale keys and values under mask 0, which attention never reads.
  """
  return _restore_prefix(cache, prefix, rows_B)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def prefill_shared(graphdef, params, cache: models.KVCache, ids_1xT, mask_1xT, rows_B):
  """An empty cache with one prompt prefilled once, at batch 1, in the first T slots of each
  row in rows_B (others stay empty); end_index T.

  What every episode's first prompt shares (the system prompt) costs one row's prefill, not
  B; each row's own tokens then follow with `extend`. The keys and values are a row's own:
  positions count real slots, so the copies sit where a row's prefill would have put them.
  """
  return _restore_prefix(cache, _prefill(graphdef, params, ids_1xT, mask_1xT), rows_B)


def window_for(slots: int, capacity: int) -> int:
  """The bucketed attention window for `slots` used slots: a multiple of 256, <= capacity."""
  return min(capacity, -(-slots // 256) * 256)


@functools.partial(jax.jit, donate_argnames=("cache",))
def compact(cache: models.KVCache, keep_B: jax.Array) -> models.KVCache:
  """Removes holes: each kept row's real slots, in order, end at slot M = max real count.

  Rows with keep False are emptied. Afterwards end_index = M, so S - M slots are free.
  """
  mask_BxS = cache.mask_BxS & keep_B[:, None]
  s = mask_BxS.shape[1]
  count_B = jnp.sum(mask_BxS, axis=1, dtype=jnp.int32)
  m = jnp.max(count_B)
  # Stable sort puts the holes first and keeps the real slots in order; slot j of the result
  # takes sorted index j + S - M, which is real exactly for j in [M - count, M).
  order_BxS = jnp.argsort(mask_BxS, axis=1, stable=True)
  slot_S = jnp.arange(s, dtype=jnp.int32)
  src_BxS = order_BxS[:, jnp.clip(slot_S + s - m, 0, s - 1)]
  new_mask_BxS = (slot_S[None] >= m - count_B[:, None]) & (slot_S[None] < m)
  gather = lambda a: jnp.take_along_axis(a, src_BxS[None, :, None, :, None], axis=3)
  # A kept row's real slots keep their order and number, so its rope delta holds as it was.
  delta_B = None if cache.rope_delta_B is None else jnp.where(keep_B, cache.rope_delta_B, 0)
  return models.KVCache(
      k_LxBxKxSxDh=gather(cache.k_LxBxKxSxDh),
      v_LxBxKxSxDh=gather(cache.v_LxBxKxSxDh),
      mask_BxS=new_mask_BxS,
      end_index=m,
      rope_delta_B=delta_B,
  )

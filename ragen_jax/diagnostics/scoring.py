"""Cross-scoring for the MI proxies: log p(z_i | x_j) for every sampled reasoning and every prompt.

RAGEN-2 runs N forward passes over all N·K concatenations [x_j | z_i]. Here each prompt is
encoded once: x_j without its last token is prefilled into a KV cache (P rows), and each pair
(i, j) then appends only [last token of x_j, z_i] to a copy of row j, so a pair costs |z_i| + 1
tokens of compute instead of |x_j| + |z_i| (x is the whole multi-turn context, z a few dozen
tokens). Teacher forcing gives every z token's log-prob; they are summed per pair. Prompts of a
visual environment are prefilled with their frames (`images`, diagnostics.prompt_images), so the
rows' caches hold what the policy saw and carry the rope delta the images imply.

Dimensions: S sampled reasonings, P prompt columns (padded to Pp), W prompt width (bucketed,
left-padded), M pairs per micro-batch, C appended chunk width (bucketed, right-padded),
L layers, K kv heads, Dh head size.
"""

import functools
from typing import Sequence, Tuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import models
from ragen_jax import sampling
from ragen_jax.algos import logprobs as logprobs_lib
from ragen_jax.diagnostics import prompt_images


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity"))
def _prefill(graphdef, params, ids_PxW, mask_PxW, images, *, capacity: int) -> models.KVCache:
  model = nnx.merge(graphdef, params)
  cache = models.init_cache(model.config, ids_PxW.shape[0], capacity)
  return images.prefill(model, ids_PxW, mask_PxW, cache)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score(
    graphdef,
    params,
    cache: models.KVCache,
    column_M,
    chunk_MxC,
    chunk_mask_MxC,
    target_mask_MxC,
    temperature,
):
  """Sum of log p(chunk[t] | ...) over target positions, each row over its column's prefix."""
  model = nnx.merge(graphdef, params)
  rows = models.KVCache(
      k_LxBxKxSxDh=cache.k_LxBxKxSxDh[:, column_M],
      v_LxBxKxSxDh=cache.v_LxBxKxSxDh[:, column_M],
      mask_BxS=cache.mask_BxS[column_M],
      end_index=cache.end_index,
      # A Qwen2.5-VL cache's rope delta goes with its rows (0 for text prompts).
      rope_delta_B=None if cache.rope_delta_B is None else cache.rope_delta_B[column_M],
  )
  hidden_MxCxD, _ = model.backbone(chunk_MxC, chunk_mask_MxC, cache=rows)
  kernel_DxV = model.unembed_kernel().astype(model.config.dtype)
  logp_MxC, _ = logprobs_lib.sequence_logprobs(
      hidden_MxCxD,
      kernel_DxV,
      chunk_MxC,
      temperature=temperature,
      with_entropy=False,
      excluded_ids=model.config.excluded_token_ids,
  )
  return jnp.sum(logp_MxC * target_mask_MxC, axis=1)


def _next_pow2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def cross_logprobs(
    model: models.Qwen2,
    reasonings: Sequence[Sequence[int]],
    prompts: Sequence[np.ndarray],
    *,
    pad_id: int,
    micro_batch: int = 64,
    temperature: float = 1.0,
    images: prompt_images.TextPrompts | prompt_images.FramePrompts = prompt_images.TextPrompts(),
) -> Tuple[np.ndarray, np.ndarray]:
  """(logp_sum_SxP, num_tokens_S): log p(z_i | x_j) summed over z_i's tokens, by teacher forcing.

  Args:
    model: the policy (its current parameters).
    reasonings: S non-empty token sequences z_i.
    prompts: P non-empty token sequences x_j (ending with the generation prefix).
    pad_id: padding token.
    micro_batch: M pairs per jitted call (memory: M cache rows of W + C slots).
    temperature: the scoring temperature (the policy's sampling temperature, as veRL scores).
    images: what the prompts show beside their tokens: TextPrompts (nothing), or FramePrompts
      (the P prompts' frames, spliced into their image blocks).
  """
  s, p = len(reasonings), len(prompts)
  if not s or not p or min(map(len, reasonings)) < 1 or min(map(len, prompts)) < 1:
    raise ValueError("cross_logprobs needs non-empty reasonings and prompts")
  # Prefill x_j[:-1] (left-padded; P padded to a power of two so shapes repeat across steps).
  pp = _next_pow2(p)
  width = sampling.bucket(max(len(x) for x in prompts) - 1)
  chunk = sampling.bucket(max(len(z) for z in reasonings) + 1)
  ids = np.full((pp, width), pad_id, np.int32)
  mask = np.zeros((pp, width), np.int32)
  for j, x in enumerate(prompts):
    n = len(x) - 1
    if n:
      ids[j, width - n :] = x[:-1]
      mask[j, width - n :] = 1
  graphdef, params = nnx.split(model)
  cache = _prefill(
      graphdef, params, jnp.asarray(ids), jnp.asarray(mask), images.rows(pp), capacity=width + chunk
  )

  # Pairs (i, j), row-major, padded to whole micro-batches with copies of pair (0, 0).
  pairs = np.stack(np.meshgrid(np.arange(s), np.arange(p), indexing="ij"), -1).reshape(-1, 2)
  m = min(micro_batch, _next_pow2(len(pairs)))
  total = -(-len(pairs) // m) * m
  pairs = np.concatenate([pairs, np.zeros((total - len(pairs), 2), pairs.dtype)])
  chunks = np.full((s, chunk), pad_id, np.int32)
  chunk_mask = np.zeros((s, chunk), np.int32)
  target = np.zeros((s, chunk), np.float32)
  for i, z in enumerate(reasonings):
    chunk_mask[i, : len(z) + 1] = 1
    chunks[i, 1 : len(z) + 1] = z
    target[i, 1 : len(z) + 1] = 1.0  # position 0 is x's last token: context, not z
  last = np.array([x[-1] for x in prompts], np.int32)
  out = np.zeros((total,), np.float32)
  for start in range(0, total, m):
    i, j = pairs[start : start + m, 0], pairs[start : start + m, 1]
    rows = chunks[i].copy()
    rows[:, 0] = last[j]
    out[start : start + m] = np.asarray(
        _score(
            graphdef,
            params,
            cache,
            jnp.asarray(j),
            jnp.asarray(rows),
            jnp.asarray(chunk_mask[i]),
            jnp.asarray(target[i]),
            jnp.float32(temperature),
        )
    )
  logp_sum_SxP = out[: s * p].reshape(s, p)
  return logp_sum_SxP, np.array([len(z) for z in reasonings], np.int32)

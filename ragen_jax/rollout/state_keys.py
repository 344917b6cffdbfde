"""Keys of the states an episode acts from, for GiGPO's anchor-state grouping.

A JAX environment's state is hashed on the device, all rows in one jitted call over every leaf
of the state pytree (`device_keys`); a text environment's state is its observation string,
hashed on the host (`text_key`). Both give 64-bit Python ints; `dense_ids` turns a batch's keys
into small int32 ids for the training batch. Two different states share a key with probability
about 2^-64 per pair: only pairs within one env group are ever compared.

Dimension legend: b episodes (rows) of this process, W 32-bit words of one row's state.
"""

import hashlib
from typing import Dict, List

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

_LANE_SEEDS = (0x9E3779B9, 0x85EBCA77)  # two independent 32-bit lanes make a 64-bit key


def _fmix32(h):
  """MurmurHash3's finaliser: a bijection on uint32 that spreads every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(path, leaf) -> jax.Array:
  """A batched leaf [b, ...] as uint32 words [b, W] holding its exact bits."""
  name = jax.tree_util.keystr(path) or "<state>"
  if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  dtype = jnp.dtype(leaf.dtype)
  if dtype == jnp.bool_:
    leaf = leaf.astype(jnp.uint32)
  elif dtype.kind in "iuf" and dtype.itemsize in (1, 2):
    unsigned = jnp.dtype(f"uint{8 * dtype.itemsize}")
    leaf = lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)
  elif dtype.kind in "iuf" and dtype.itemsize in (4, 8):
    leaf = lax.bitcast_convert_type(leaf, jnp.uint32)  # 8 bytes: a trailing axis of 2 words
  else:
    raise TypeError(
        f"GiGPO cannot hash the environment state's leaf {name} of dtype {dtype}: state keys "
        "need integer, float, bool or PRNG-key arrays"
    )
  return leaf.reshape(leaf.shape[0], -1)


def device_keys(states) -> jax.Array:
  """uint32 [b, 2]: per row, two lanes of Σ_i fmix32(w_i XOR fmix32(i + seed)) over the row's
  words; each term is a bijection of its word, so states differing in one word always differ."""
  leaves = jax.tree_util.tree_flatten_with_path(states)[0]
  if not leaves:
    raise TypeError("GiGPO cannot hash an environment state without array leaves")
  words_BxW = jnp.concatenate([_words(path, jnp.asarray(leaf)) for path, leaf in leaves], axis=1)
  position_W = jnp.arange(words_BxW.shape[1], dtype=jnp.uint32)
  lanes = [
      jnp.sum(_fmix32(words_BxW ^ _fmix32(position_W + jnp.uint32(seed))[None]), axis=1)
      for seed in _LANE_SEEDS
  ]
  return jnp.stack(lanes, axis=1).astype(jnp.uint32)


device_keys_jit = jax.jit(device_keys)


def combine(lanes_bx2: np.ndarray) -> List[int]:
  """Host 64-bit keys from `device_keys`' two lanes."""
  lanes = np.asarray(lanes_bx2, np.uint64)
  return [int(k) for k in (lanes[:, 0] << np.uint64(32)) | lanes[:, 1]]


def text_key(observation) -> int:
  """The 64-bit key of a text environment's observation (stable across processes and runs,
  unlike Python's salted `hash`)."""
  if not isinstance(observation, str):
    raise TypeError(
        f"GiGPO cannot key a text environment's state: its observation is a "
        f"{type(observation).__name__}, not a str"
    )
  digest = hashlib.blake2b(observation.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little")


def dense_ids(keys_BxK: List[List[int]]) -> Dict[int, int]:
  """Small ids (0, 1, ...) for the distinct 64-bit keys of a batch, in order of appearance."""
  ids: Dict[int, int] = {}
  for row in keys_BxK:
    for key in row:
      ids.setdefault(key, len(ids))
  return ids

"""What a checkpoint holds, and whether what was read back is what was written.

  flat = checkpoint_integrity.flat(checkpoint_integrity.savable(state))   # {path: array}
  meta[RECORD_KEY] = checkpoint_integrity.record(flat, checkpoint_integrity.checks(flat))
  ...
  problem = checkpoint_integrity.damage(meta[RECORD_KEY], checkpoint_integrity.flat(read))
  state = checkpoint_integrity.typed(like, read)    # when problem is None: read back intact

A state is saved as its state dict of plain arrays, typed PRNG keys as their raw key data
(`savable`; `typed` turns that back into the structure and types of a template). Saving stores
a record of every array (shape, dtype and two 32-bit checksums of its bits) in the step's JSON
metadata; restoring compares what it read with the record and checks that floating arrays are
finite, so bytes changed on disk after the save (a bad sector, a partial copy, a flipped bit)
are found instead of trained on.

Why the checksums are computed on the devices: the arrays of a multi-process run are sharded
across processes, so no process holds all the bytes of one to hash on its host. A sum of an
array's 32-bit words is one jitted reduction over the global array, and it is exact: integer
addition modulo 2^32 gives the same result however the sum is split over devices, so the array
may be restored into another sharding than the one it was saved from. Any single changed word
changes the plain sum. The second sum weights word i by the odd number 2i + 1 (invertible modulo
2^32, so a single changed word changes it too) and also changes when words are swapped or
moved, which leave the plain sum as it was (unless the product of the two words' difference and
their distance is a multiple of 2^31). Arrays in host memory (numpy, and one process's arrays on
CPU devices) get the same sums from numpy, with nothing to compile.
"""

from typing import Any, Dict, Optional, Tuple

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

# The key of the record in a step's JSON metadata (a name no caller's metadata uses).
RECORD_KEY = "_state_record"

Spec = Tuple[Tuple[int, ...], str]  # (shape, dtype name)
Check = Tuple[int, int, bool]  # (sum of words, weighted sum of words, all finite)

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _is_key(x) -> bool:
  return jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def savable(state):
  """The state dict of `state` with plain arrays: typed PRNG keys become their raw uint32 data."""

  def key_data(x):  # abstract states (jax.eval_shape) hold ShapeDtypeStructs
    if isinstance(x, jax.ShapeDtypeStruct):
      data = jax.eval_shape(jax.random.key_data, x)
      # Keep the key's sharding: on several processes orbax needs one for every array.
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    return jax.random.key_data(x)

  tree = flax.serialization.to_state_dict(state)
  return jax.tree.map(lambda x: key_data(x) if _is_key(x) else x, tree)


def typed(like, restored):
  """`restored` (a `savable` tree) in the structure and types of `like`, keys typed again."""
  template = flax.serialization.to_state_dict(like)
  restored = jax.tree.map(
      lambda ref, x: jax.random.wrap_key_data(x) if _is_key(ref) else x, template, restored
  )
  return flax.serialization.from_state_dict(like, restored)


def flat(tree) -> Dict[str, Any]:
  """{path: leaf}, paths as `jax.tree_util.keystr` writes them (the record's keys)."""
  return {
      jax.tree_util.keystr(path): leaf
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def spec(leaf) -> Spec:
  dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
  return tuple(int(d) for d in np.shape(leaf)), np.dtype(dtype).name


def _sums(xp, words):
  """(sum, sum of word i times 2i + 1) of uint32 `words`, modulo 2^32; xp: numpy or jnp."""
  index = xp.arange(words.size, dtype=xp.uint32).reshape(words.shape)
  return xp.sum(words, dtype=xp.uint32), xp.sum(words * (index * 2 + 1), dtype=xp.uint32)


def _device_words(x: jax.Array) -> jax.Array:
  """`x`'s bits as uint32 words: narrower types widened, 8-byte ones split into a last axis."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  width = _UNSIGNED.get(x.dtype.itemsize, np.uint32)
  return jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)


def _host_words(x: np.ndarray) -> np.ndarray:
  """The words `_device_words` gives, flattened, from a host array (low word first)."""
  x = np.ascontiguousarray(x).reshape(-1)  # 1-d: numpy scalars would warn when they wrap
  if x.dtype == np.bool_:
    return x.astype(np.uint32)
  return x.view(_UNSIGNED.get(x.dtype.itemsize, np.uint32)).astype(np.uint32)


def _floating(dtype) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.inexact))


@jax.jit
def _device_checks(leaves):
  out = []
  for x in leaves:
    finite = jnp.all(jnp.isfinite(x)) if _floating(x.dtype) else jnp.bool_(True)
    out.append((*_sums(jnp, _device_words(x)), finite))
  return out


def _on_host(scalar: jax.Array):
  # A reduction's scalar result is replicated: any local copy is the value, also when the
  # input spans processes.
  return scalar if scalar.is_fully_addressable else scalar.addressable_data(0)


def _in_host_memory(x) -> bool:
  """A host array, or a JAX array held whole by this process on CPU devices: summed by numpy,
  with no program to compile (one over a whole train state takes seconds on a CPU)."""
  if not isinstance(x, jax.Array):
    return True
  return x.is_fully_addressable and all(d.platform == "cpu" for d in x.sharding.device_set)


def checks(arrays: Dict[str, Any]) -> Dict[str, Check]:
  """(sum, weighted sum, finite) of each array of `arrays` ({path: array}).

  Arrays in host memory (numpy, and a process's own arrays on CPU devices) are summed by numpy;
  the others (accelerators, arrays spanning processes) by `device_checks`.
  """
  on_device = {p: x for p, x in arrays.items() if not _in_host_memory(x)}
  results = device_checks(on_device)
  for path, x in arrays.items():
    if path not in on_device:
      x = np.asarray(x)
      plain, weighted = _sums(np, _host_words(x))
      results[path] = (
          int(plain),
          int(weighted),
          bool(not _floating(x.dtype) or np.isfinite(x).all()),
      )
  return {p: results[p] for p in arrays}


def device_checks(arrays: Dict[str, jax.Array]) -> Dict[str, Check]:
  """`checks` of JAX arrays summed where they live: one jitted call per set of devices (every
  process of a multi-process run must make it, as for any computation on global arrays)."""
  results, by_devices = {}, {}
  for path, x in arrays.items():
    by_devices.setdefault(frozenset(x.sharding.device_set), []).append(path)
  for paths in by_devices.values():
    found = _device_checks([arrays[p] for p in paths])
    results.update(zip(paths, jax.device_get(jax.tree.map(_on_host, found))))
  return {p: (int(results[p][0]), int(results[p][1]), bool(results[p][2])) for p in arrays}


def record(arrays: Dict[str, Any], sums: Dict[str, Check]) -> Dict[str, Dict[str, Any]]:
  """The JSON record of `arrays` ({path: array}) with their `checks`."""
  return {
      path: {"shape": list(spec(x)[0]), "dtype": spec(x)[1], "sums": list(sums[path][:2])}
      for path, x in arrays.items()
  }


def record_specs(rec: Dict[str, Dict[str, Any]]) -> Dict[str, Spec]:
  return {path: (tuple(entry["shape"]), entry["dtype"]) for path, entry in rec.items()}


def _text(s: Spec) -> str:
  return f"{s[1]}{list(s[0])}"


def difference(saved: Dict[str, Spec], expected: Dict[str, Spec]) -> Optional[str]:
  """The first way `saved` differs from `expected` (entries, then shapes and dtypes), or None."""
  for path in expected:
    if path not in saved:
      return f"it has no entry {path}"
  for path in saved:
    if path not in expected:
      return f"unexpected entry {path}"
  for path, want in expected.items():
    if saved[path] != want:
      return f"{path} is {_text(saved[path])} there but {_text(want)} here"
  return None


def damage(rec: Optional[Dict[str, Dict[str, Any]]], arrays: Dict[str, Any]) -> Optional[str]:
  """Why `arrays` read back cannot be trusted, or None.

  Args:
    rec: the record saved with them; None for a checkpoint written before records existed
      (only finiteness is checked then).
    arrays: {path: array} as restored.
  """
  for path, (plain, weighted, finite) in checks(arrays).items():
    if rec is not None and [plain, weighted] != list(rec[path]["sums"]):
      return f"{path} does not match the checksum saved with it"
    if not finite:
      return f"{path} holds NaN or inf"
  return None

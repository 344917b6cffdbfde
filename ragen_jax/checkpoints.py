"""Orbax checkpoints of a training run: atomic, last-k kept, validated on restore, never NaN.

  ckpt = checkpoints.Checkpointer(workdir / "checkpoints", keep=3)
  ckpt.save(step, state, meta={"seed_counter": 40})    # state: any pytree (TrainState, dicts)
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(like=state)              # the latest step, shapes checked

Each step is one directory holding the state (Orbax's standard pytree format) and a JSON
metadata item; Orbax writes into a temporary directory and renames it when complete, so an
interrupted save never leaves a readable half checkpoint. A state with a NaN or infinite
value is refused (`NonFiniteError`) so a diverged run can never overwrite good weights, and a
checkpoint that does not fit the expected state (another model size, another optimizer)
raises a `ValueError` naming the first mismatching entry instead of restoring garbage.

Multi-process runs: every process calls save and restore (orbax writes and reads each array's
shards from the processes that hold them, and the JSON metadata from process 0 only); the
directory must be on a filesystem all processes share.
"""

import os
from typing import Any, Dict, Optional, Tuple

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


class NonFiniteError(ValueError):
  """Raised instead of saving a state that holds NaN or infinite values."""


def _flat(tree) -> Dict[str, Any]:
  return {
      jax.tree_util.keystr(path): leaf
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _to_savable(state):
  """State dict of plain arrays: typed PRNG keys become their raw uint32 data."""
  tree = flax.serialization.to_state_dict(state)

  def key_data(x):  # abstract states (jax.eval_shape) hold ShapeDtypeStructs
    if isinstance(x, jax.ShapeDtypeStruct):
      data = jax.eval_shape(jax.random.key_data, x)
      # Keep the key's sharding: on several processes orbax needs one for every array.
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    return jax.random.key_data(x)

  return jax.tree.map(
      lambda x: key_data(x)
      if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)
      else x,
      tree,
  )


def check_finite(state) -> None:
  """Raises NonFiniteError naming the first floating leaf that holds NaN or inf."""
  for path, leaf in _flat(_to_savable(state)).items():
    if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(leaf))):
      raise NonFiniteError(f"Refusing to save a non-finite state: {path} holds NaN or inf.")


class Checkpointer:
  """Saves and restores training state under `directory`, keeping the newest `keep` steps."""

  def __init__(self, directory: str, keep: int = 3):
    if keep < 1:
      raise ValueError(f"keep must be at least 1, got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    # Handlers named up front, so a new process can read metadata of steps it did not write.
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        },
    )

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self):
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: Optional[Dict[str, Any]] = None) -> None:
    """Writes `state` (checked finite) and JSON-serialisable `meta` as step `step`; blocks."""
    check_finite(state)
    self._manager.save(
        int(step),
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(_to_savable(state)),
            meta=ocp.args.JsonSave(dict(meta or {})),
        ),
        force=True,
    )
    self._manager.wait_until_finished()

  def restore(self, like: Any, step: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]:
    """Restores step `step` (default: the latest) into the structure of `like`.

    Args:
      like: a state of the expected structure, shapes and dtypes (e.g. a freshly initialised
        one); its values are not used.
      step: which step; None for the latest.

    Returns:
      (state, meta): the state rebuilt with `like`'s types, and the saved metadata.

    Raises:
      FileNotFoundError: no checkpoint (at that step).
      ValueError: the checkpoint does not fit `like`; the message names the first difference.
    """
    step = self.latest_step() if step is None else int(step)
    if step is None or step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"No checkpoint{'' if step is None else f' at step {step}'} in " f"{self.directory}."
      )
    target = _to_savable(like)
    self._check_fits(step, target)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
    )
    state = restored["state"]
    # Raw key data goes back into typed keys where `like` holds them.
    state = jax.tree.map(
        lambda ref, x: jax.random.wrap_key_data(x)
        if jnp.issubdtype(getattr(ref, "dtype", np.float32), jax.dtypes.prng_key)
        else x,
        flax.serialization.to_state_dict(like),
        state,
    )
    return flax.serialization.from_state_dict(like, state), dict(restored["meta"] or {})

  def meta(self, step: Optional[int] = None) -> Dict[str, Any]:
    """The JSON metadata saved with step `step` (default: the latest), without the state."""
    step = self.latest_step() if step is None else int(step)
    if step is None or step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"No checkpoint{'' if step is None else f' at step {step}'} in " f"{self.directory}."
      )
    restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"] or {})

  def _check_fits(self, step: int, target) -> None:
    saved = _flat(self._manager.item_metadata(step)["state"])
    expected = _flat(target)
    where = f"checkpoint step {step} in {self.directory}"
    for path in expected:
      if path not in saved:
        raise ValueError(f"The {where} does not fit this run: it has no entry {path}.")
    for path in saved:
      if path not in expected:
        raise ValueError(f"The {where} does not fit this run: unexpected entry {path}.")
    for path, ref in expected.items():
      got = saved[path]
      if tuple(got.shape) != tuple(np.shape(ref)) or np.dtype(got.dtype) != np.dtype(ref.dtype):
        raise ValueError(
            f"The {where} does not fit this run: {path} is "
            f"{np.dtype(got.dtype).name}{list(got.shape)} there but "
            f"{np.dtype(ref.dtype).name}{list(np.shape(ref))} here."
        )

  def close(self) -> None:
    self._manager.close()

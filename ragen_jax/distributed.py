"""Multi-process (multi-host) runs: start-up, and the few host-side collectives the loop needs.

    from ragen_jax import distributed
    distributed.initialize()          # before any JAX computation; no-op on a single process
    sharder = sharding.Sharder(spec, devices=distributed.mesh_devices())

Start-up (`initialize`): explicit arguments (launch.py's `--coordinator_address`,
`--num_processes`, `--process_id`, `--local_device_ids`) win; otherwise a cluster named by the
environment is joined with JAX's auto-detection: SLURM with more than one task, a GKE / multislice
TPU, Open MPI, `JAX_COORDINATOR_ADDRESS` (with `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` where
no cluster manager supplies them), or `RAGEN_JAX_INIT=1` (TPU VM pods, whose workers are found
through the metadata server, not the environment). With none of these nothing is touched and the
run is the single-process run it always was. CPU processes exchange data over gloo.

Work split: every process runs the same program. A rollout's episodes are rows of a batch
sharded over the mesh, and each process plays the rows its own devices hold (`row_range`),
tokenising, parsing and stepping only those on the host; the sampler's inputs are global arrays
assembled from every process's rows (`global_rows`) and only the local rows come back
(`local_rows`). Anything the host loop branches on (a padded width, whether any episode is still
playing) is agreed across processes first (`agree_max`), because every process must issue the
same jitted calls with the same shapes or they all wait forever. At the end of a rollout the
episodes are gathered (`allgather`) so that metrics, the training batch and the logs are the
same on every process, and the same as a single-process run would produce.
"""

import os
import pickle
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

FORCE_ENV = "RAGEN_JAX_INIT"


class LaunchError(ValueError):
  """The environment names a multi-process run that cannot start as launched."""


def _int_env(environ: Mapping[str, str], name: str) -> Optional[int]:
  value = environ.get(name)
  return int(value) if value not in (None, "") else None


def cluster_from_env(environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """The multi-process cluster the environment names, or None for a single-process run.

  A cluster manager that starts a single task (an interactive SLURM allocation, `srun -n 1`)
  is a single-process run: it is left alone.
  """
  if environ.get(FORCE_ENV, "") not in ("", "0"):
    return FORCE_ENV
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  if "SLURM_PROCID" in environ and (_int_env(environ, "SLURM_NTASKS") or 1) > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in environ and (_int_env(environ, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "openmpi"
  hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h]) > 1 or environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "tpu"
  return None


def parse_device_ids(text: Optional[str]) -> Optional[List[int]]:
  """ "0,1,2" -> [0, 1, 2]; None or "" -> None."""
  if not text:
    return None
  return [int(x) for x in str(text).split(",") if x.strip()]


def initialize(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    local_device_ids: Optional[Sequence[int]] = None,
    environ: Mapping[str, str] = os.environ,
) -> bool:
  """Joins the distributed runtime when asked to; returns whether it did.

  Args:
    coordinator_address: "host:port" of process 0's coordinator service.
    num_processes: processes in the run.
    process_id: this process's index, 0 .. num_processes - 1.
    local_device_ids: the local devices this process uses (one GPU per process: its index).
    environ: the environment (tests pass their own).

  Arguments left None are auto-detected by JAX where a cluster manager supplies them. Must run
  before anything creates a JAX backend (jax.devices(), an array, a compilation).

  Raises:
    LaunchError: a multi-task SLURM allocation outside an srun step.
  """
  explicit = any(
      v is not None for v in (coordinator_address, num_processes, process_id, local_device_ids)
  )
  cluster = "flags" if explicit else cluster_from_env(environ)
  if cluster is None:
    return False
  if cluster == "slurm" and "SLURM_STEP_NODELIST" not in environ:
    # The batch shell of a multi-task allocation: JAX would fail with "coordinator_address
    # should be defined", since only an srun step names its nodes.
    raise LaunchError(
        f"this SLURM job has {environ.get('SLURM_NTASKS')} tasks, but launch.py runs outside "
        "srun: start it with `srun python launch.py ...` (experiments/launch/slurm.sh does), "
        "or submit one task (-n 1) for a single-process run"
    )
  if num_processes is None:
    num_processes = _int_env(environ, "JAX_NUM_PROCESSES")
  if process_id is None:
    process_id = _int_env(environ, "JAX_PROCESS_ID")
  # CPU processes need cross-process collectives (gloo is JAX's built-in choice); the option is
  # read when the CPU backend is created, so it must be set first. It does not affect GPU / TPU.
  if not environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      local_device_ids=local_device_ids,
  )
  if jax.process_index() > 0:
    logging.set_verbosity(logging.WARNING)  # one console: process 0 tells the story
  logging.warning(
      "joined a %d-process run (%s) as process %d with %d local devices",
      jax.process_count(),
      cluster,
      jax.process_index(),
      jax.local_device_count(),
  )
  return True


def multiprocess() -> bool:
  return jax.process_count() > 1


def mesh_devices() -> Optional[List[jax.Device]]:
  """Devices in mesh order for a multi-process run (each process's devices consecutive, so the
  mesh's last axes stay within a host and each process holds a contiguous block of batch rows);
  None on a single process (the Sharder's default, jax.devices())."""
  if not multiprocess():
    return None
  return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


# ------------------------------------------------------------------ batch rows


def row_range(sharding: jax.sharding.Sharding, rows: int) -> Tuple[int, int]:
  """[lo, hi): the rows of a [rows, ...] array with `sharding` that this process's devices hold.

  Raises:
    ValueError: the held rows are not one contiguous block (a device order this loop cannot
      split episodes by).
  """
  spans = sorted(
      {
          idx[0].indices(rows)[:2]
          for idx in sharding.addressable_devices_indices_map((rows,)).values()
      }
  )
  lo, hi = spans[0][0], max(stop for _, stop in spans)
  covered = lo
  for start, stop in spans:
    if start > covered:
      raise ValueError(
          f"process {jax.process_index()} holds rows {spans} of a batch of {rows}: "
          "not a contiguous block; order the mesh devices by process"
      )
    covered = max(covered, stop)
  return lo, hi


def global_rows(local: np.ndarray, sharding: jax.sharding.Sharding, rows: int):
  """The [rows, ...] global array whose rows `row_range` are `local` on this process.

  On a single process `local` comes back unchanged (it already holds every row).
  """
  if not multiprocess():
    return local
  local = np.asarray(local)
  return jax.make_array_from_process_local_data(sharding, local, (rows,) + local.shape[1:])


def local_rows(tree: Any, lo: int, hi: int) -> Any:
  """Rows [lo, hi) of each global array in `tree`, as numpy, read from this process's shards.

  On a single process this is `jax.device_get(tree)` (every row is local).
  """
  if not multiprocess():
    return jax.device_get(tree)
  leaves, treedef = jax.tree.flatten(tree)
  outs, sharded = [], []
  for i, x in enumerate(leaves):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      outs.append(np.asarray(x)[lo:hi])
    elif x.is_fully_replicated:
      outs.append(np.asarray(x.addressable_data(0))[lo:hi])  # any local copy is the whole
    else:
      outs.append(_rows_from_shards(x, lo, hi))
      sharded.append(i)
  if sharded:
    # An array laid out across processes other than by rows (not what the sampler returns) is
    # fetched whole. The test is agreed first: process_allgather needs every process.
    missing = agree_max([outs[i] is None for i in sharded])
    for i, miss in zip(sharded, missing):
      if miss:
        outs[i] = np.asarray(multihost_utils.process_allgather(leaves[i], tiled=True))[lo:hi]
  return jax.tree.unflatten(treedef, outs)


def _rows_from_shards(x: jax.Array, lo: int, hi: int) -> Optional[np.ndarray]:
  """Rows [lo, hi) of `x` from its addressable shards; None if they do not hold them all."""
  out = np.empty((hi - lo,) + x.shape[1:], x.dtype)
  filled = np.zeros((hi - lo,) + x.shape[1:], bool)
  for shard in x.addressable_shards:
    rows = shard.index[0].indices(x.shape[0])
    start, stop = max(rows[0], lo), min(rows[1], hi)
    if start < stop:
      where = (slice(start - lo, stop - lo),) + tuple(shard.index[1:])
      out[where] = np.asarray(shard.data)[start - rows[0] : stop - rows[0]]
      filled[where] = True
  return out if filled.all() else None


def local_copy(x: jax.Array) -> jax.Array:
  """`x` (a value every process holds) on this process's first device, for local-only work."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)  # replicated: any local copy is the value
  return jax.device_put(x, jax.local_devices()[0])


# ------------------------------------------------------------------ host values


def agree_max(values: Sequence[int]) -> np.ndarray:
  """Elementwise maximum over processes of a small integer vector (identity on one process)."""
  values = np.asarray(values, np.int64)
  if not multiprocess():
    return values
  return np.asarray(multihost_utils.process_allgather(values)).max(axis=0)


def any_across(flag: bool) -> bool:
  """True on every process when `flag` is True on any (e.g. a Ctrl-C one process received)."""
  return bool(agree_max([int(bool(flag))])[0])


def allgather(obj: Any) -> List[Any]:
  """Every process's `obj` (any picklable value), in process order; [obj] on one process."""
  if not multiprocess():
    return [obj]
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))[:, 0]
  padded = np.zeros((int(sizes.max()),), np.uint8)
  padded[: data.size] = data
  blobs = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(blobs[p, : sizes[p]].tobytes()) for p in range(len(sizes))]


def put(tree: Any, shardings: Any) -> Any:
  """`jax.device_put(tree, shardings)` that also works when the shardings span processes.

  Host values (numpy, arrays on a local device, PRNG keys) must be equal on every process; each
  process places the slices its devices hold. Global arrays are resharded.
  """
  if not multiprocess():
    return jax.device_put(tree, shardings)

  def one(x, sharding):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(
          one(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x)
      )
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(one, tree, shardings)


def sync(name: str) -> None:
  """A barrier across processes (no-op on one)."""
  if multiprocess():
    multihost_utils.sync_global_devices(name)

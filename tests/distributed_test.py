"""ragen_jax.distributed: its helpers across 2 real processes, and what it makes of the
environment (a single process is left alone; a multi-task SLURM allocation outside srun is
refused with what to do)."""

import subprocess
import sys

import pytest

from ragen_jax import distributed
import multihost_runs as runs

ROOT = runs.ROOT


def _helpers_worker(port: int, process_id: int) -> None:
  """One of 2 processes (2 CPU devices each) checking ragen_jax.distributed's helpers."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,g-multiple-import

  assert distributed.initialize(f"localhost:{port}", 2, process_id)
  devices = distributed.mesh_devices()
  assert [d.process_index for d in devices] == [0, 0, 1, 1]
  mesh = Mesh(np.asarray(devices), ("b",))
  rows = NamedSharding(mesh, P("b", None))
  lo, hi = distributed.row_range(NamedSharding(mesh, P("b")), 8)
  assert (lo, hi) == (4 * process_id, 4 * process_id + 4)
  local_BxC = np.arange(lo * 3, hi * 3, dtype=np.int32).reshape(4, 3)
  x_BxC = distributed.global_rows(local_BxC, rows, 8)
  doubled = jax.jit(lambda x: x * 2)(x_BxC)
  np.testing.assert_array_equal(distributed.local_rows(doubled, lo, hi), local_BxC * 2)
  # Split by columns, not rows: the helper fetches the whole array and keeps its rows.
  by_cols = jax.jit(lambda x: x + 1, out_shardings=NamedSharding(mesh, P(None, "b")))(
      distributed.global_rows(np.arange(lo * 4, hi * 4).reshape(4, 4), rows, 8)
  )
  np.testing.assert_array_equal(
      distributed.local_rows({"a": by_cols}, lo, hi)["a"],
      np.arange(lo * 4, hi * 4).reshape(4, 4) + 1,
  )
  parts = distributed.allgather({"p": process_id, "text": "x" * (10 + 1000 * process_id)})
  assert [p["p"] for p in parts] == [0, 1] and len(parts[1]["text"]) == 1010
  assert list(distributed.agree_max([process_id, 5 - process_id])) == [1, 5]
  assert distributed.any_across(process_id == 1)
  state = distributed.put(
      {"key": jax.random.key(3), "w": np.ones((4, 2), np.float32)},
      {"key": NamedSharding(mesh, P()), "w": rows},
  )
  assert not state["w"].is_fully_addressable
  key = distributed.local_copy(jax.random.fold_in(state["key"], 1))
  want = jax.random.key_data(jax.random.fold_in(jax.random.key(3), 1))
  np.testing.assert_array_equal(jax.random.key_data(key), want)
  distributed.sync("done")
  print("HELPERS OK", flush=True)


def test_distributed_helpers_across_two_processes():
  port = runs.free_port()
  procs = [
      subprocess.Popen(
          [sys.executable, __file__, "helpers", str(port), str(i)],
          cwd=ROOT,
          env=runs.env(2),
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for i in range(2)
  ]
  try:
    outs = [p.communicate(timeout=120)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, out in zip(procs, outs):
    assert p.returncode == 0 and "HELPERS OK" in out, out[-3000:]


def test_a_single_process_environment_is_left_alone():
  assert distributed.cluster_from_env({}) is None
  assert distributed.cluster_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
  assert distributed.initialize(environ={}) is False
  assert distributed.cluster_from_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "8"}) == "slurm"
  assert distributed.cluster_from_env({"JAX_COORDINATOR_ADDRESS": "h:1234"}) == (
      "JAX_COORDINATOR_ADDRESS"
  )
  assert distributed.cluster_from_env({"TPU_WORKER_HOSTNAMES": "a,b"}) == "tpu"
  assert distributed.cluster_from_env({"TPU_WORKER_HOSTNAMES": "a"}) is None
  assert distributed.cluster_from_env({distributed.FORCE_ENV: "1"}) == distributed.FORCE_ENV
  assert distributed.parse_device_ids("0,2") == [0, 2] and distributed.parse_device_ids("") is None


def test_importing_the_trainer_starts_no_backend():
  """jax.distributed.initialize must come before any backend; launch.py imports first."""
  code = "import jax._src.xla_bridge as xb, launch; " "print(xb.backends_are_initialized())"
  proc = subprocess.run(
      [sys.executable, "-c", code],
      cwd=ROOT,
      env=runs.env(1),
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1] == "False"


def test_a_multi_task_slurm_allocation_outside_srun_is_refused():
  batch_shell = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
  with pytest.raises(distributed.LaunchError, match="outside srun"):
    distributed.initialize(environ=batch_shell)


if __name__ == "__main__" and sys.argv[1:2] == ["helpers"]:
  _helpers_worker(int(sys.argv[2]), int(sys.argv[3]))

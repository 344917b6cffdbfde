"""Multi-process training on localhost: 2 CPU processes equal one process on as many devices.

The run under test: `launch.py --config=configs/sokoban_ppo.py:smoke` in 2 processes of 2 CPU
devices each (a coordinator on a free local port, gloo collectives), on the mesh data=1, fsdp=2,
tensor=2, so the parameters and optimizer states are split across the processes (fsdp) and within
each (tensor), and each process plays 2 of the 4 episodes of every rollout. It stops after step
1 and a second launch resumes it from the orbax checkpoint both processes wrote, for step 2.
The reference: the same config on one process with 4 devices and the same mesh, 2 steps.

Checked: every logged metric at every step of the reference (rollout, validation, collapse
diagnostics, losses) is identical in the 2-process run, except actor/critic/collapse metrics
(float reductions whose order the cross-process collectives could change), which must agree to
1e-5 relative (they are in fact identical on this machine); the validation trajectories are the
same; only process 0 writes events and prints progress. Each launch has a timeout and a
process that dies takes its peer down, so a deadlock fails the test instead of hanging it.
About 3 minutes on 2 cores. A second, seconds-long 2-process test checks the helpers of
ragen_jax.distributed one by one (row ranges, global arrays from local rows and back, an array
not split by rows, gathering objects, agreement, keys placed across processes).
"""

import glob
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ragen_jax import distributed
from ragen_jax import logging_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Collapse diagnostics at step 1 only (compute_freq=3): one compilation fewer per launch.
SMOKE = [
    "launch.py",
    "--config=configs/sokoban_ppo.py:smoke",
    "--config.mesh.data=1",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=2",
    "--config.diagnostics.compute_freq=3",
]
# Float reductions (the probability gap is round-off itself, so only its absolute size is
# compared); everything else (counts, successes, lengths, rewards) must be identical.
_TOLERANT = ("actor/", "critic/", "collapse/", "training/rollout_probs_diff")
_RTOL, _ATOL = 1e-5, 1e-6
_TIMEOUT_S = 300


def _env(devices: int):
  # No cluster variables (they would make the processes guess a cluster), but the test
  # session's compilation cache (conftest.py) is kept.
  cluster = lambda k: (
      k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_"))
      and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
  )
  env = {k: v for k, v in os.environ.items() if not cluster(k) and k != distributed.FORCE_ENV}
  return dict(
      env, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu"
  )


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch_two(workdir: str, extra):
  """Runs launch.py as processes 0 and 1; returns their outputs (fails on error or timeout)."""
  port = _free_port()
  procs = [
      subprocess.Popen(
          [
              sys.executable,
              *SMOKE,
              f"--workdir={workdir}",
              f"--coordinator_address=localhost:{port}",
              "--num_processes=2",
              f"--process_id={i}",
              *extra,
          ],
          cwd=ROOT,
          env=_env(2),
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for i in range(2)
  ]
  logs = [[] for _ in procs]
  readers = [
      threading.Thread(target=lambda p=p, l=l: l.extend(p.stdout), daemon=True)
      for p, l in zip(procs, logs)
  ]
  for r in readers:
    r.start()
  deadline = time.time() + _TIMEOUT_S
  try:
    while any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
        break  # one failed (its peer would wait for it forever) or both hang
      time.sleep(0.5)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
    for r in readers:
      r.join(timeout=10)
  outs = ["".join(l) for l in logs]
  for i, (p, out) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{out[-4000:]}"
  return outs


def _scalars(workdir):
  return {
      (tag, step): value
      for tag, series in logging_utils.read_scalars(workdir).items()
      if not tag.startswith(("timing_s/", "perf/"))
      for step, value in series
  }


def test_two_processes_match_one_process_and_resume(tmp_path):
  ref_dir, multi_dir = str(tmp_path / "one_process"), str(tmp_path / "two_processes")
  ref = subprocess.run(
      [sys.executable, *SMOKE, f"--workdir={ref_dir}", "--config.trainer.total_steps=2"],
      cwd=ROOT,
      env=_env(4),
      capture_output=True,
      text=True,
      timeout=_TIMEOUT_S,
  )
  assert ref.returncode == 0, ref.stderr[-4000:]
  first = _launch_two(multi_dir, ["--config.trainer.total_steps=1"])
  second = _launch_two(multi_dir, ["--config.trainer.total_steps=2"])  # resumes at step 1
  assert "over 4 devices (2 processes)" in first[0]
  assert "resumed from" in second[0] and "done at step 2" in second[0]
  # Process 0 alone prints progress and writes events (one file per launch).
  assert "step 1/1 [" in first[0] and "step 1/1 [" not in first[1]
  assert "step 2/2 [" not in second[1]
  assert len(glob.glob(os.path.join(multi_dir, "events.out.tfevents.*"))) == 2

  want, got = _scalars(ref_dir), _scalars(multi_dir)
  assert {
      ("train/success", 2),
      ("val/success", 2),
      ("actor/pg_loss", 2),
      ("collapse/multi_turn/mi_estimate", 1),
      ("critic/vf_loss", 1),
  } <= set(want)
  missing = sorted(set(want) - set(got))
  assert not missing, missing
  for (tag, step), value in sorted(want.items()):
    if tag.startswith(_TOLERANT):
      assert got[tag, step] == pytest.approx(value, rel=_RTOL, abs=_ATOL), (tag, step)
    else:
      assert got[tag, step] == value, (tag, step)
  # The final validation's trajectories, written by process 0 only, are the same episodes.
  read = lambda d: [json.loads(l) for l in open(os.path.join(d, "eval", "step_2.jsonl"))]
  assert read(multi_dir) == read(ref_dir)


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
  port = _free_port()
  procs = [
      subprocess.Popen(
          [sys.executable, __file__, "helpers", str(port), str(i)],
          cwd=ROOT,
          env=_env(2),
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
      env=_env(1),
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1] == "False"


if __name__ == "__main__" and sys.argv[1:2] == ["helpers"]:
  _helpers_worker(int(sys.argv[2]), int(sys.argv[3]))

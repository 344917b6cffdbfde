"""What the multi-process tests share: the smoke run they split over 2 processes, the
environment they run it in, and comparing its logged scalars with the one-process reference."""

import os
import socket

import pytest

from ragen_jax import distributed
from ragen_jax import logging_utils
from xla_devices import cpu_devices  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The run split over 2 processes of one CPU device each: fsdp over the two, so each process holds
# half of every parameter and optimizer state (splits within a process, tensor included, are
# tests/sharding_test.py's, in one process: 2 devices per process cost a quarter more CPU here,
# mostly in collectives between the processes at every decoded token). Collapse diagnostics at
# step 1 only (compute_freq=3): one compilation fewer per launch.
DEVICES_PER_PROCESS = 1
SMOKE = [
    "launch.py",
    "--config=configs/sokoban_ppo.py:smoke",
    "--config.mesh.data=1",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=1",
    "--config.diagnostics.compute_freq=3",
]
# Float reductions (the probability gap is round-off itself, so only its absolute size is
# compared); everything else (counts, successes, lengths, rewards) must be identical.
_TOLERANT = ("actor/", "critic/", "collapse/", "training/rollout_probs_diff")
_RTOL, _ATOL = 1e-5, 1e-6
TIMEOUT_S = 300


def env(devices: int):
  # No cluster variables (they would make the processes guess a cluster), but the test
  # session's compilation cache (conftest.py) is kept.
  cluster = lambda k: (
      k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_"))
      and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
  )
  env = {k: v for k, v in os.environ.items() if not cluster(k) and k != distributed.FORCE_ENV}
  return cpu_devices(devices, env)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def scalars(workdir):
  return {
      (tag, step): value
      for tag, series in logging_utils.read_scalars(workdir).items()
      if not tag.startswith(("timing_s/", "perf/"))
      for step, value in series
  }


def assert_matches(want, got, upto: int) -> None:
  """Every scalar of the reference `want` at steps <= `upto` is in `got`: identical, or within
  the tolerance for float reductions whose order cross-process collectives may change."""
  want = {k: v for k, v in want.items() if k[1] <= upto}
  missing = sorted(set(want) - set(got))
  assert not missing, missing
  for (tag, step), value in sorted(want.items()):
    if tag.startswith(_TOLERANT):
      assert got[tag, step] == pytest.approx(value, rel=_RTOL, abs=_ATOL), (tag, step)
    else:
      assert got[tag, step] == value, (tag, step)

"""A save that runs out of disk space: one clear error naming the directory and the free space,
no temporary directory left, the earlier steps intact; leftovers of killed saves are removed by
the next run's first save and never by a reader. The full disk is a real one: a small tmpfs
mounted for the test (root only, as in CI; skipped elsewhere)."""

import logging
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ragen_jax import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def small_disk(tmp_path):
  """A 400 KiB filesystem of its own, unmounted after the test."""
  mount_point = tmp_path / "disk"
  mount_point.mkdir()
  if os.geteuid() != 0:
    pytest.skip("mounting a small tmpfs needs root")
  mounted = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount_point)],
      capture_output=True,
      text=True,
      timeout=60,
  )
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", str(mount_point)], check=True, timeout=60)


def _leftovers(directory):
  return [n for n in os.listdir(directory) if "orbax-checkpoint-tmp" in n]


def test_a_full_disk_is_one_line_naming_the_directory_and_free_space(small_disk, caplog):
  directory = str(small_disk / "ckpt")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(1, {"w": jnp.ones((8, 8))}, meta={"step": 1})
  caplog.set_level(logging.INFO)
  # 500 KB of incompressible floats do not fit in what is left.
  big = {"w": jax.random.normal(jax.random.key(0), (350, 350))}
  with pytest.raises(checkpoints.SaveError) as raised:
    ckpt.save(2, big, meta={"step": 2})
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"Could not save checkpoint step 2 in {directory}: the disk is full (")
  assert re.search(
      r"\(\d+\.\d KiB free there, the state is 478\.5 KiB before compression\);", message
  )
  # Orbax's own reports of the failure (one per writer thread, each with a traceback) are
  # held back: the exception is the one report.
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
  assert not _leftovers(directory) and sorted(os.listdir(directory)) == ["1"]
  assert ckpt.all_steps() == [1]
  state, meta = ckpt.restore({"w": jnp.zeros((8, 8))})
  np.testing.assert_array_equal(state["w"], np.ones((8, 8)))
  assert meta == {"step": 1}
  # The space the failed save took is back: a save that fits works.
  ckpt.save(2, {"w": jnp.full((8, 8), 2.0)}, meta={"step": 2})
  assert ckpt.all_steps() == [1, 2]
  ckpt.close()


# A state of 100 arrays (26 MB) saved to a full disk by a caller that reports SaveError and
# exits.
_SAVE_TO_A_FULL_DISK = """
import sys
import jax
from ragen_jax import checkpoints
ckpt = checkpoints.Checkpointer(sys.argv[1])
state = {f"w{i}": jax.random.normal(jax.random.key(i), (256, 256)) for i in range(100)}
try:
  ckpt.save(0, state)
except checkpoints.SaveError as e:
  print(f"error: {e}", file=sys.stderr)
  sys.exit(3)
finally:
  ckpt.close()
"""


def test_a_full_disk_under_a_large_state_prints_no_traceback(small_disk):
  # Orbax abandons the writes still pending when one fails; without care each reports itself
  # with a traceback, during the save and at exit (about 200 for this state).
  proc = subprocess.run(
      [sys.executable, "-c", _SAVE_TO_A_FULL_DISK, str(small_disk / "ckpt")],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  output = proc.stdout + proc.stderr
  assert proc.returncode == 3, output[-3000:]
  assert f"error: Could not save checkpoint step 0 in {small_disk}/ckpt: the disk is full" in output
  for noise in ("Traceback", "Exception ignored", "never retrieved", "Event loop is closed"):
    assert noise not in output, output[-3000:]


def test_leftovers_of_killed_saves_go_at_the_first_save_not_on_opening(tmp_path, caplog):
  directory = str(tmp_path / "ckpt")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(1, {"w": jnp.ones(4)})
  ckpt.close()
  # What a save killed mid-way leaves: orbax's temporary directory for the step, by its name.
  leftover = str(
      ocp.path.atomicity.AtomicRenameTemporaryPath.from_final(pathlib.Path(directory) / "2").get()
  )
  os.makedirs(os.path.join(leftover, "state"))
  open(os.path.join(leftover, "state", "part"), "w").write("x" * 1000)
  caplog.set_level(logging.WARNING)
  reader = checkpoints.Checkpointer(directory)  # e.g. evaluation while the run saves
  reader.restore({"w": jnp.zeros(4)})
  assert os.path.isdir(leftover) and reader.all_steps() == [1]
  reader.save(3, {"w": jnp.ones(4)})
  assert not _leftovers(directory) and reader.all_steps() == [1, 3]
  (warning,) = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
  assert f"removed 1 incomplete checkpoint saves from {directory}: 2.orbax" in warning
  reader.close()

"""Damaged checkpoints: each kind of damage to the newest step falls back to the intact step
beside it with one warning; all damaged is one error naming every step; another model's
checkpoint is refused as before; the processes of a run follow process 0's listing and skip a
step any of them found unusable; checkpoints saved before records existed still open; arrays
sharded over devices verify whatever sharding they are restored into (4 CPU devices)."""

import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ragen_jax import checkpoint_integrity
from ragen_jax import checkpoints
from ragen_jax import distributed
from xla_devices import cpu_devices  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(step: int):
  """A small state: float (float32, bfloat16) and int leaves and a typed PRNG key."""
  return {
      "params": {
          "w": jax.random.normal(jax.random.key(step), (64, 64)) * step,
          "b": jnp.full((8,), step, jnp.bfloat16),
      },
      "count": jnp.int32(10 * step),
      "rng": jax.random.key(100 + step),
  }


LIKE = jax.eval_shape(lambda: _state(0))


def _assert_is_step(state, step: int):
  want = _state(step)
  np.testing.assert_array_equal(state["params"]["w"], want["params"]["w"])
  np.testing.assert_array_equal(state["params"]["b"], want["params"]["b"])
  assert int(state["count"]) == 10 * step
  np.testing.assert_array_equal(jax.random.key_data(state["rng"]), jax.random.key_data(want["rng"]))


@pytest.fixture(scope="module")
def saved_steps(tmp_path_factory):
  """Steps 1, 2 and 3 saved by a real Checkpointer; each test damages a copy."""
  directory = tmp_path_factory.mktemp("saved") / "ckpt"
  ckpt = checkpoints.Checkpointer(directory, keep=3)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), meta={"step": step})
  ckpt.close()
  return directory


@pytest.fixture
def ckpt_dir(saved_steps, tmp_path):
  directory = tmp_path / "ckpt"
  shutil.copytree(saved_steps, directory)
  return str(directory)


def _array_files(step_dir):
  return [p for p in glob.glob(f"{step_dir}/state/**/d/*", recursive=True) if os.path.isfile(p)]


def _truncate(path, keep=0.5):
  with open(path, "r+b") as f:
    f.truncate(int(os.path.getsize(path) * keep))


def _flip_in_the_data(step_dir):
  # The largest file holds the 64 x 64 floats: one byte in its middle is inside their data.
  path = max(_array_files(step_dir), key=os.path.getsize)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x40
  open(path, "wb").write(data)


DAMAGE = {
    "array files truncated": (
        lambda d: [_truncate(p) for p in _array_files(f"{d}/3")],
        r"its array(s| metadata) do(es)? not read: ValueError: .*/3/state/",
    ),
    "array files emptied": (
        lambda d: [_truncate(p, 0) for p in _array_files(f"{d}/3")],
        r"its array(s| metadata) do(es)? not read: ValueError: .*/3/state/",
    ),
    "_METADATA missing": (
        lambda d: os.remove(f"{d}/3/state/_METADATA"),
        "state/_METADATA is missing",
    ),
    "meta JSON truncated": (
        lambda d: _truncate(f"{d}/3/meta/metadata"),
        "its metadata does not read: JSONDecodeError",
    ),
    "bytes flipped in the data": (
        lambda d: _flip_in_the_data(f"{d}/3"),
        "does not match the checksum saved with it",
    ),
}


def _unusable_warnings(caplog):
  return [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_step_falls_back_to_the_older_one(ckpt_dir, damage, caplog):
  apply, reason = DAMAGE[damage]
  apply(ckpt_dir)
  caplog.set_level(logging.WARNING)
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.latest_step() == 3  # resumed (restore decides), never started afresh
  state, meta = ckpt.restore(LIKE)
  _assert_is_step(state, 2)
  assert meta == {"step": 2}
  (warning,) = _unusable_warnings(caplog)
  assert f"checkpoint step 3 in {ckpt_dir} is unusable" in warning
  assert re.search(reason, warning) and warning.endswith("trying step 2")
  assert ckpt.latest_step() == 2 and ckpt.all_steps() == [1, 2]
  ckpt.close()


def test_an_empty_newer_step_directory_is_skipped_then_moved_aside_when_saved_again(
    ckpt_dir, caplog
):
  os.makedirs(f"{ckpt_dir}/4")  # an interrupted copy
  caplog.set_level(logging.WARNING)
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.latest_step() == 4
  state, meta = ckpt.restore(LIKE)
  _assert_is_step(state, 3)
  assert meta == {"step": 3}
  (warning,) = _unusable_warnings(caplog)
  assert "step 4" in warning and "its directory is empty" in warning
  # The run goes on from step 3 and saves step 4 again: the empty one is kept aside.
  ckpt.save(4, _state(4), meta={"step": 4})
  assert os.path.isdir(f"{ckpt_dir}/4.unusable") and ckpt.all_steps() == [2, 3, 4]
  state, meta = ckpt.restore(LIKE)
  _assert_is_step(state, 4)
  ckpt.close()


def test_every_step_damaged_is_one_error_listing_each(ckpt_dir, caplog):
  for step in (1, 2):
    os.remove(f"{ckpt_dir}/{step}/state/_METADATA")
  _flip_in_the_data(f"{ckpt_dir}/3")
  caplog.set_level(logging.WARNING)
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.latest_step() == 3
  with pytest.raises(checkpoints.NoUsableCheckpoint) as raised:
    ckpt.restore(LIKE)
  message = str(raised.value)
  assert "\n" not in message and ckpt_dir in message
  assert "step 3: ['params']['w'] does not match the checksum" in message
  assert "step 2: state/_METADATA is missing; step 1: state/_METADATA is missing" in message
  assert len(_unusable_warnings(caplog)) == 3
  ckpt.close()
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  with pytest.raises(checkpoints.NoUsableCheckpoint, match=r"step 3: [^;]*\. Move"):
    ckpt.restore(LIKE, step=3)  # the step asked for, no other
  ckpt.close()


def test_a_directory_holding_only_an_empty_step_is_not_a_fresh_start(tmp_path):
  os.makedirs(tmp_path / "ckpt" / "5")
  ckpt = checkpoints.Checkpointer(tmp_path / "ckpt")
  assert ckpt.latest_step() == 5
  with pytest.raises(checkpoints.NoUsableCheckpoint, match="step 5: its directory is empty"):
    ckpt.restore(LIKE)
  ckpt.close()


def test_meta_alone_falls_back_past_unreadable_metadata(ckpt_dir, caplog):
  _truncate(f"{ckpt_dir}/3/meta/metadata")
  caplog.set_level(logging.WARNING)
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.meta() == {"step": 2} and ckpt.meta(1) == {"step": 1}
  assert len(_unusable_warnings(caplog)) == 1
  ckpt.close()


def test_a_readable_checkpoint_of_another_shape_is_refused_without_falling_back(ckpt_dir):
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  other = dict(LIKE, params=dict(LIKE["params"], w=jax.ShapeDtypeStruct((64, 32), jnp.float32)))
  with pytest.raises(ValueError, match=r"step 3 .* \['params'\]\['w'\] is float32\[64, 64\] there"):
    ckpt.restore(other)
  assert ckpt.all_steps() == [1, 2, 3]
  ckpt.close()


def _save_without_record(directory, step, state, meta):
  """A step as saved before records existed: the same Orbax items, no record in the meta."""
  manager = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(create=True),
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
  )
  manager.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(checkpoint_integrity.savable(state)),
          meta=ocp.args.JsonSave(meta),
      ),
  )
  manager.wait_until_finished()
  manager.close()


def test_checkpoints_without_a_record_restore_quietly_and_are_still_checked_finite(
    tmp_path, caplog
):
  directory = str(tmp_path / "old")
  _save_without_record(directory, 1, _state(1), {"step": 1})
  nan = _state(2)
  nan["params"]["w"] = nan["params"]["w"].at[3, 3].set(jnp.nan)
  _save_without_record(directory, 2, nan, {"step": 2})
  caplog.set_level(logging.WARNING)
  ckpt = checkpoints.Checkpointer(directory)
  state, meta = ckpt.restore(LIKE, step=1)
  _assert_is_step(state, 1)
  assert meta == {"step": 1} and not _unusable_warnings(caplog)
  state, meta = ckpt.restore(LIKE)
  _assert_is_step(state, 1)
  (warning,) = _unusable_warnings(caplog)
  assert "step 2" in warning and "['params']['w'] holds NaN or inf" in warning
  ckpt.close()


def test_the_record_stays_out_of_the_returned_meta_and_is_reserved(ckpt_dir):
  on_disk = json.load(open(f"{ckpt_dir}/3/meta/metadata"))
  assert on_disk["step"] == 3 and "['params']['w']" in on_disk[checkpoint_integrity.RECORD_KEY]
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.meta() == {"step": 3}
  with pytest.raises(ValueError, match="must not use the key"):
    ckpt.save(4, _state(4), meta={checkpoint_integrity.RECORD_KEY: 1})
  ckpt.close()


class _PeerProcess:
  """Stands in for distributed.allgather seen from process 1 of 2: process 0 lists only
  `peer_steps`, and reports `peer_problem` for the first question about a step it is asked."""

  def __init__(self, peer_steps, peer_problem=None):
    self.peer_steps, self.peer_problem = peer_steps, peer_problem

  def __call__(self, obj):
    if isinstance(obj, list):  # the listing of steps
      return [list(self.peer_steps), obj]
    problem, self.peer_problem = self.peer_problem, None
    return [problem, obj]


def test_processes_follow_process_0s_listing_and_a_step_any_of_them_rejects(
    ckpt_dir, monkeypatch, caplog
):
  # Process 0 does not see step 3 yet: this process (1) sees it but follows process 0.
  monkeypatch.setattr(distributed, "allgather", _PeerProcess([1, 2]))
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  assert ckpt.latest_step() == 2 and ckpt.all_steps() == [1, 2]
  _assert_is_step(ckpt.restore(LIKE)[0], 2)
  ckpt.close()
  # Both see step 3, intact here, but process 0 cannot read it: every process skips it.
  caplog.set_level(logging.WARNING)
  monkeypatch.setattr(distributed, "allgather", _PeerProcess([1, 2, 3], "its metadata is gone"))
  ckpt = checkpoints.Checkpointer(ckpt_dir)
  state, _ = ckpt.restore(LIKE)
  _assert_is_step(state, 2)
  (warning,) = _unusable_warnings(caplog)
  assert "step 3" in warning and "(process 0: its metadata is gone)" in warning
  ckpt.close()


# Four CPU devices: arrays saved from one sharding and restored into others.
_SHARDED = """
import glob
import os
import sys
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ragen_jax import checkpoint_integrity, checkpoints

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
shard = lambda *spec: NamedSharding(mesh, P(*spec))
w = jax.random.normal(jax.random.key(0), (64, 32))
layouts = [shard("a", "b"), shard(("a", "b")), shard(None, "a"), shard()]
# Summed on the devices (as on accelerators and across processes) and on the host alike.
sums = [checkpoint_integrity.device_checks({"w": jax.device_put(w, s)})["w"] for s in layouts]
assert len(set(sums)) == 1 and checkpoint_integrity.checks({"w": w})["w"] == sums[0], sums
# An array on one device beside arrays on the mesh (jit refuses the two together).
mixed = {"m": jax.device_put(w, layouts[0]), "d": jax.device_put(w, jax.devices()[3])}
assert checkpoint_integrity.device_checks(mixed) == {"m": sums[0], "d": sums[0]}
ckpt = checkpoints.Checkpointer(sys.argv[1])
for step in (1, 2):
  ckpt.save(step, {"w": jax.device_put(w * step, shard("a", "b"))})
for sharding in layouts[1:]:
  state, _ = ckpt.restore({"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=sharding)})
  assert state["w"].sharding == sharding
  np.testing.assert_array_equal(state["w"], w * 2)
ckpt.close()
# One byte changed in the arrays of step 2: restored into another sharding, it is found.
path = max(glob.glob(sys.argv[1] + "/2/state/**/d/*", recursive=True), key=os.path.getsize)
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0x40
open(path, "wb").write(data)
like = {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=layouts[1])}
state, _ = checkpoints.Checkpointer(sys.argv[1]).restore(like)
np.testing.assert_array_equal(state["w"], w)
print("OK")
"""


def test_sharded_arrays_verify_whatever_the_sharding_they_are_restored_into(tmp_path):
  directory = str(tmp_path / "ckpt")
  env = cpu_devices(4)
  proc = subprocess.run(
      [sys.executable, "-c", _SHARDED, directory],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
  assert (
      "checkpoint step 2 in" in proc.stderr and "['w'] does not match the checksum" in proc.stderr
  )

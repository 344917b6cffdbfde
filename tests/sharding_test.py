"""Mesh config, rules and divisibility errors; sharded runs equal one device (8 simulated CPUs)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ragen_jax import models
from ragen_jax import sharding
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.models.vision_config import vision_table
from xla_devices import cpu_devices  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EIGHT_DEVICES = cpu_devices(8)


def test_minus_one_fills_the_remaining_devices_and_bad_products_name_the_numbers():
  assert sharding.MeshSpec(data=-1, fsdp=2, tensor=2).shape(8) == (2, 2, 2)
  assert sharding.MeshSpec(data=2, fsdp=-1, tensor=1).shape(8) == (2, 4, 1)
  assert sharding.MeshSpec().shape(1) == (1, 1, 1)
  with pytest.raises(ValueError, match=r"2 x 2 x 4 = 16 devices, but 8 are available"):
    sharding.MeshSpec(data=2, fsdp=2, tensor=4).shape(8)
  with pytest.raises(ValueError, match="do not divide"):
    sharding.MeshSpec(data=-1, fsdp=3).shape(8)
  with pytest.raises(ValueError, match="at most one"):
    sharding.MeshSpec(data=-1, fsdp=-1)
  with pytest.raises(ValueError, match="positive integers or -1"):
    sharding.MeshSpec(tensor=0)


def test_rules_parse_strings_and_reject_unknown_axes():
  rules = dict(
      sharding.parse_rules({**dict(sharding.DEFAULT_RULES), "embed": "fsdp,tensor", "mlp": ""})
  )
  assert rules["embed"] == ("fsdp", "tensor") and rules["mlp"] == ()
  with pytest.raises(ValueError, match="distinct mesh axes"):
    sharding.parse_rules({**dict(sharding.DEFAULT_RULES), "embed": "fsdp,model"})
  with pytest.raises(ValueError, match="unknown logical axes"):
    sharding.parse_rules({**dict(sharding.DEFAULT_RULES), "experts": "tensor"})
  with pytest.raises(ValueError, match="lacks logical axis 'vocab'"):
    sharding.parse_rules({k: v for k, v in sharding.DEFAULT_RULES if k != "vocab"})


def test_partition_specs_follow_the_rules_table():
  s = sharding.Sharder(sharding.MeshSpec(data=1))  # one CPU device: a 1 x 1 x 1 mesh
  assert s.pspec(("batch", None)) == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  assert s.pspec(("layers", "embed", "heads", "head_dim")) == jax.sharding.PartitionSpec(
      None, "fsdp", "tensor", None
  )
  # A mesh axis splits one dimension only: the second use is dropped, not an error from XLA.
  assert s.pspec(("embed", "embed")) == jax.sharding.PartitionSpec("fsdp", None)
  shardings = s.tree(
      {
          "decoder": {"layers": {"q_kernel": np.zeros((2, 8, 4, 2))}},
          "mu": {"decoder": {"embedding": np.zeros((16, 8))}},
          "count": np.zeros(()),
      }
  )
  assert shardings["decoder"]["layers"]["q_kernel"].spec == jax.sharding.PartitionSpec(
      None, "fsdp", "tensor", None
  )
  assert shardings["mu"]["decoder"]["embedding"].spec == jax.sharding.PartitionSpec(
      "tensor", "fsdp"
  )  # Adam moments follow their parameter's path suffix
  assert shardings["count"].spec == jax.sharding.PartitionSpec()


def test_qwen_sizes_that_do_not_divide_are_refused_naming_both_numbers():
  qwen = models.get_config("qwen2.5-0.5b")  # 14 query heads, 2 key/value heads
  s = sharding.Sharder(sharding.MeshSpec(data=1, fsdp=2, tensor=4), num_devices=8)
  with pytest.raises(ValueError, match=r"query heads = 14 cannot be split over tensor = 4"):
    s.check_model(qwen)
  kv_only = sharding.MeshSpec(
      data=1,
      fsdp=2,
      tensor=4,
      rules={**dict(sharding.DEFAULT_RULES), "heads": "", "mlp": "", "vocab": ""},
  )
  with pytest.raises(ValueError, match=r"key/value heads = 2 cannot be split over tensor = 4"):
    sharding.Sharder(kv_only, num_devices=8).check_model(qwen)
  sharding.Sharder(sharding.MeshSpec(data=2, fsdp=2, tensor=2), num_devices=8).check_model(qwen)
  with pytest.raises(ValueError, match=r"= 12 cannot be split over data = 2 x fsdp = 4"):
    sharding.Sharder(sharding.MeshSpec(data=2, fsdp=4), num_devices=8).check_batch(
        "the training batch", 12
    )


def test_vision_tower_sizes_that_do_not_divide_are_refused_naming_both_numbers():
  """Qwen2.5-VL-3B's decoder splits over tensor = 8 (its 2 key/value heads kept whole), its
  tower's SwiGLU width 3420 does not; tensor = 4 splits both."""
  vl = models.get_config("qwen2.5-vl-3b")
  rules = {**dict(sharding.DEFAULT_RULES), "kv_heads": ""}
  eight = sharding.MeshSpec(data=1, fsdp=1, tensor=8, rules=rules)
  with pytest.raises(ValueError, match=r"vision tower's MLP size = 3420 cannot be split over te"):
    sharding.Sharder(eight, num_devices=8).check_model(vl)
  sharding.Sharder(eight, num_devices=8).check_model(models.get_config("qwen2.5-3b"))
  four = sharding.MeshSpec(data=1, fsdp=2, tensor=4, rules=rules)
  sharding.Sharder(four, num_devices=8).check_model(vl)


def test_the_mesh_section_validates_into_the_experiment():
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.mesh.data, config.mesh.tensor = 2, 2
    config.mesh.rules.mlp = ""
  exp = schema.from_config(config)
  assert (exp.mesh.data, exp.mesh.fsdp, exp.mesh.tensor) == (2, 1, 2)
  assert dict(exp.mesh.rules)["mlp"] == () and dict(exp.mesh.rules)["batch"] == ("data", "fsdp")
  with config.unlocked():
    config.mesh.rules.mlp = "pipeline"
  with pytest.raises(ValueError, match="config: mesh.rules.mlp"):
    schema.from_config(config)


def test_a_run_whose_batch_does_not_divide_the_mesh_stops_before_compiling(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "launch.py",
          "--config=configs/sokoban_ppo.py:smoke",
          f"--workdir={tmp_path}",
          "--config.mesh.data=8",
      ],
      cwd=ROOT,
      env=EIGHT_DEVICES,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode != 0
  assert "the training batch (episodes per step) = 4 cannot be split over data = 8" in (
      proc.stderr + proc.stdout
  )


def test_meshes_give_the_same_rollouts_and_updates_as_one_device():
  # All three axes at once, data among them ((8,1,1), (2,4,1) and (1,4,2) would add only compile
  # time: BENCHMARKS.md, "Sharding on 8 simulated CPU devices").
  meshes = ["1,1,1", "2,2,2"]
  _check_equal_to_one_device(meshes, _result_on_eight_devices("sharding_equivalence.py", *meshes))


def _result_on_eight_devices(script, *args, timeout=900):
  """The JSON a tests/ script prints on its `RESULT ` line, run on 8 simulated CPU devices."""
  proc = subprocess.run(
      [sys.executable, os.path.join("tests", script), *args],
      cwd=ROOT,
      env=EIGHT_DEVICES,
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][0]
  return json.loads(line[len("RESULT ") :])


def _check_equal_to_one_device(meshes, results):
  ref = results["1,1,1"]
  assert ref["devices"] == 1
  for mesh in meshes[1:]:
    got = results[mesh]
    assert got["devices"] == 8, mesh  # parameters really live on 8 devices
    # Sampling is sharding-invariant (partitionable threefry) and the logits agree to float
    # rounding, so the same tokens are drawn and every rollout metric is identical.
    assert got["tokens"] == ref["tokens"], mesh
    assert got["rollout"] == ref["rollout"], mesh
    # The update on identical inputs: reductions run in another order, so equal to 1e-5.
    for name, value in ref["train"].items():
      assert got["train"][name] == pytest.approx(value, rel=1e-4, abs=1e-5), (mesh, name)
    # Actor and critic, leaf by leaf: the same start (bitwise), and the same update. Adam's step
    # is about the learning rate per weight whatever the gradient's size, so where a gradient
    # is near 0 another reduction order can flip its sign: measured, the projections differ
    # by up to 6e-4 of the update's norm, and a leaf left out of the update would move them by
    # about its norm (at least 0.5 of it for these leaves). Bounds relative to the update.
    for name in ("actor", "critic"):
      for k, (g, r) in enumerate(zip(got[name], ref[name], strict=True)):
        where = (mesh, name, k)
        assert g["start"] == r["start"] and r["norm"] > 0, where
        assert g["norm"] == pytest.approx(r["norm"], rel=1e-4), where
        np.testing.assert_allclose(
            g["proj"], r["proj"], rtol=0, atol=1e-2 * r["norm"], err_msg=where
        )


def test_the_vision_tower_is_split_and_its_logits_with_images_equal_one_device():
  """tiny-vl's train state placed as the trainer places it on data x fsdp x tensor = 2 x 2 x 2:
  the logits of rows with two frames each agree with one device's to 1e-5, and every tower
  parameter and its AdamW moment lies split by its logical axes (embed over fsdp; heads and mlp
  over tensor): each device holds a shard, not the whole array."""
  got = _result_on_eight_devices("sharding_vision.py", timeout=600)
  assert got["devices"] == 8 and got["max_abs_logit"] > 0.1
  assert got["max_abs_diff"] < 1e-5
  table = vision_table(models.get_config("tiny-vl").vision, 64)
  mesh = {"embed": 2, "heads": 2, "mlp": 2}  # fsdp = 2, tensor = 2
  for where in ("tower", "moments"):
    assert set(got[where]) == set(table), where
    for name, (shape, axes) in table.items():
      split = [n // mesh.get(a, 1) for n, a in zip(shape, axes)]
      assert got[where][name]["shape"] == list(shape), (where, name)
      assert got[where][name]["shard"] == split and split != list(shape), (where, name)

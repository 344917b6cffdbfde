"""Hugging Face checkpoint directories on disk: which weight files count, what an export over an
earlier one leaves, and damaged files named in the error.

transformers (the installed version) is the reference for which files a directory's weights are.
Every directory is written here from tiny random models. Dimension legend: B batch, T length.
"""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
import safetensors.numpy
import transformers

from ragen_jax import models
from ragen_jax.models import checkpoint as hf_checkpoint
from references import hf_logits  # pylint: disable=g-bad-import-order
from tiny import left_padded_batch
from tiny import PARITY
from tiny import randomise

CONFIG = PARITY
# Shard limits that split CONFIG's float32 weights into 4 files and into 2.
FOUR_SHARDS, TWO_SHARDS = 30_000, 50_000
IDS_BxT, MASK_BxT = left_padded_batch(np.random.default_rng(0), [6, 3], 6)


@pytest.fixture(scope="module")
def two_models():
  """Two models of one shape with different random weights: an earlier export and a later one."""
  return [randomise(models.create(CONFIG, jax.random.key(0)), seed=s) for s in (1, 2)]


def logits(model):
  return np.asarray(model(IDS_BxT, MASK_BxT))[MASK_BxT.astype(bool)]


def transformers_logits(path):
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
  return hf_logits(hf.eval(), IDS_BxT, MASK_BxT)[MASK_BxT.astype(bool)]


def files_besides_config(path):
  return sorted(n for n in os.listdir(path) if n != "config.json")


def copy_files(src, dst, names):
  os.makedirs(dst, exist_ok=True)
  for name in names:
    shutil.copy(os.path.join(src, name), os.path.join(dst, name))


class Killed(BaseException):
  """Stands for the process being killed at that point."""


@pytest.mark.parametrize("stale", ["index", "single"])
def test_both_layouts_in_one_directory_load_what_transformers_loads(tmp_path, two_models, stale):
  """A sharded set and a single file side by side (as an older export could leave them): both
  readers take model.safetensors, whichever set is the newer."""
  earlier, later = two_models
  sharded, single = str(tmp_path / "sharded"), str(tmp_path / "single")
  models.save_hf(earlier if stale == "index" else later, sharded, max_shard_bytes=FOUR_SHARDS)
  models.save_hf(later if stale == "index" else earlier, single)
  mixed = str(tmp_path / "mixed")
  copy_files(sharded, mixed, os.listdir(sharded))
  copy_files(single, mixed, ["model.safetensors"])
  assert len(files_besides_config(mixed)) == 6

  reference = transformers_logits(mixed)
  expected = logits(later if stale == "index" else earlier)  # the single file's weights
  np.testing.assert_allclose(reference, expected, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits(models.load_hf(mixed)), reference, atol=1e-4, rtol=0)
  assert hf_checkpoint.weight_files(mixed) == [os.path.join(mixed, "model.safetensors")]


def test_an_export_over_an_earlier_one_leaves_only_its_own_files(tmp_path, two_models):
  earlier, later = two_models
  out = str(tmp_path / "out")
  models.save_hf(earlier, out, max_shard_bytes=FOUR_SHARDS)
  sharded_names = files_besides_config(out)
  assert len(sharded_names) == 5 and "model.safetensors.index.json" in sharded_names
  open(os.path.join(out, "README.md"), "w").close()  # not a weight file: stays

  models.save_hf(later, out)
  assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
  np.testing.assert_allclose(transformers_logits(out), logits(later), atol=1e-4, rtol=0)
  np.testing.assert_array_equal(logits(models.load_hf(out)), logits(later))

  # Back to shards, then to fewer shards: the single file, then the surplus shards, go.
  models.save_hf(earlier, out, max_shard_bytes=FOUR_SHARDS)
  assert files_besides_config(out) == ["README.md", *sharded_names]
  models.save_hf(later, out, max_shard_bytes=TWO_SHARDS)
  assert files_besides_config(out) == [
      "README.md",
      "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors",
      "model.safetensors.index.json",
  ]
  np.testing.assert_allclose(transformers_logits(out), logits(later), atol=1e-4, rtol=0)
  np.testing.assert_array_equal(logits(models.load_hf(out)), logits(later))


def test_an_interrupted_export_leaves_a_complete_set_and_no_temporary_files(
    tmp_path, two_models, monkeypatch
):
  earlier, later = two_models
  out = str(tmp_path / "out")
  models.save_hf(earlier, out)
  real_save = safetensors.numpy.save_file
  calls = []

  def fail_on_the_third_shard(tensors, filename, metadata=None):
    calls.append(filename)
    if len(calls) == 3:
      with open(filename, "wb") as fp:
        fp.write(b"half a shard")
      raise OSError(28, "No space left on device")
    real_save(tensors, filename, metadata=metadata)

  monkeypatch.setattr(safetensors.numpy, "save_file", fail_on_the_third_shard)
  with pytest.raises(OSError, match="No space left"):
    models.save_hf(later, out, max_shard_bytes=FOUR_SHARDS)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  np.testing.assert_array_equal(logits(models.load_hf(out)), logits(earlier))

  # Killed after the new shards and index are in place, before the earlier file is removed:
  # model.safetensors still wins for both readers, so the directory still loads as one model.
  monkeypatch.setattr(safetensors.numpy, "save_file", real_save)

  def killed(path):
    raise Killed(path)

  monkeypatch.setattr(os, "remove", killed)
  with pytest.raises(Killed):
    models.save_hf(later, out, max_shard_bytes=FOUR_SHARDS)
  monkeypatch.undo()
  assert len(files_besides_config(out)) == 6
  np.testing.assert_allclose(transformers_logits(out), logits(earlier), atol=1e-4, rtol=0)
  np.testing.assert_array_equal(logits(models.load_hf(out)), logits(earlier))


@pytest.fixture(name="saved")
def saved_fixture(tmp_path, two_models):
  """A directory holding a complete export of the first model."""
  models.save_hf(two_models[0], str(tmp_path / "hf"))
  return tmp_path / "hf"


def truncate(path, keep):
  data = path.read_bytes()
  path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.5, 0.999])
def test_a_truncated_weights_file_is_named(saved, keep):
  truncate(saved / "model.safetensors", keep)
  with pytest.raises(ValueError, match=re.escape(f"{saved / 'model.safetensors'}: not a complete")):
    models.load_hf(str(saved))


def test_a_truncated_shard_is_named(tmp_path, two_models):
  models.save_hf(two_models[0], str(tmp_path), max_shard_bytes=FOUR_SHARDS)
  truncate(tmp_path / "model-00003-of-00004.safetensors", 0.5)
  with pytest.raises(ValueError, match="model-00003-of-00004.safetensors: not a complete"):
    models.load_hf(str(tmp_path))
  os.remove(tmp_path / "model-00003-of-00004.safetensors")
  with pytest.raises(
      FileNotFoundError, match=r"index\.json names model-00003-of-00004\.safetensors, which is"
  ):
    models.load_hf(str(tmp_path))


@pytest.mark.parametrize(
    "key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"]
)
def test_a_config_without_a_required_key_names_the_file_and_the_key(saved, key):
  values = json.loads((saved / "config.json").read_text())
  del values[key]
  (saved / "config.json").write_text(json.dumps(values))
  with pytest.raises(
      ValueError, match=re.escape(f"{saved / 'config.json'}: missing required key(s) '{key}'")
  ):
    models.load_hf(str(saved))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "", "not valid JSON"),
        (lambda text: "\xff\xfe" + text, "not valid JSON"),  # not UTF-8
        (lambda text: "[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_a_config_that_is_not_a_json_object_is_named(saved, damage, message):
  path = saved / "config.json"
  path.write_text(damage(path.read_text()), encoding="latin-1")
  with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
    models.load_hf(str(saved))


def test_a_directory_without_weights_names_what_it_lacks(tmp_path, saved):
  assert not hf_checkpoint.missing_files(str(saved))
  os.remove(saved / "model.safetensors")
  assert hf_checkpoint.missing_files(str(saved)) == [
      "model.safetensors or model.safetensors.index.json"
  ]
  with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index"):
    models.load_hf(str(saved))
  assert hf_checkpoint.missing_files(str(tmp_path / "empty")) == [
      "config.json",
      "model.safetensors or model.safetensors.index.json",
  ]

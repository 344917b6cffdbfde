"""A LoRA training run (the :smoke Sokoban config with model.lora.rank > 0, from a checkpoint
directory, with a supervised warm start): checkpoints hold the adapters, the base stays as loaded
through SFT and RL, a resumed run equals the uninterrupted one, and the export is the merged plain
model."""

import os
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import logging_utils
from ragen_jax import models
from ragen_jax.models import lora
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import policy
from ragen_jax.train import restore
from ragen_jax.train import trainer
from references import run_cut_at  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Timings differ between runs; the warm start's fine-tuning (logged at its own steps) ran once,
# before the checkpoint the resumed run starts from.
_NOT_COMPARED = ("timing_s/", "perf/", "timing_per_token_ms/", "sft/")


def lora_config():
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py:smoke"))
  with config.unlocked():
    config.model.lora.rank = 4
    config.model.lora.alpha = 8.0
    config.trainer.total_steps, config.trainer.save_every = 2, 1
    # A Hugging Face checkpoint directory as the start, with RAGEN's LoRA SFT before RL: the
    # warm start fine-tunes the adapters only.
    config.model.checkpoint = policy.WARM_START_DIR
    config.sft.steps, config.sft.batch_size = 2, 4
  return config


def comparable(scalars, step):
  return {
      (tag, s): v
      for tag, series in scalars.items()
      if not tag.startswith(_NOT_COMPARED)
      for s, v in series
      if s == step
  }


def test_lora_run_resumes_exactly_and_keeps_the_base(tmp_path):
  ref_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
  assert trainer.train(lora_config(), ref_dir)["step"] == 2
  # The run as it was when it saved step 1: the same call resumes it.
  assert trainer.train(lora_config(), run_cut_at(ref_dir, resumed_dir, 1))["step"] == 2
  assert [s for s, _ in logging_utils.read_scalars(resumed_dir)["train/success"]] == [2]
  expected = comparable(logging_utils.read_scalars(ref_dir), 2)
  assert ("actor/pg_loss", 2) in expected and ("val/success", 2) in expected
  assert comparable(logging_utils.read_scalars(resumed_dir), 2) == expected

  a, _, _, step = restore.load_actor(ref_dir)
  b = restore.load_actor(resumed_dir)[0]
  assert step == 2 and a.config.lora.rank == 4
  trained = nnx.to_pure_dict(nnx.state(a, lora.LoraParam))["decoder"]["layers"]
  assert np.abs(np.asarray(trained["q_lora_b"])).max() > 0  # trained adapters were saved
  ids = jnp.arange(12, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(np.asarray(a(ids)), np.asarray(b(ids)))
  # The base weights are those the run started from.
  start, _ = policy.build(schema.from_config(lora_config()))
  base = lambda m: jax.tree.leaves(nnx.state(m, nnx.Not(lora.LoraParam)))
  for x, y in zip(base(a), base(start)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The export: a plain checkpoint (adapters merged) with the trained actor's logits.
  # Through the command: ragen_jax.export's flags would clash with ragen_jax.evaluate's in one
  # process (absl flags are global).
  out = str(tmp_path / "exported")
  subprocess.run(
      [sys.executable, "-m", "ragen_jax.export", f"--checkpoint={ref_dir}", f"--out={out}"],
      check=True,
      cwd=ROOT,
      timeout=300,
  )
  exported = models.load_hf(out)
  assert exported.config.lora is None
  # float32 W + (alpha/r)·A·B, merged once, against the adapters applied beside W: the same sums
  # rounded in another order, so equal to a few float32 ulps of the logits' scale (2-4 here),
  # not to a fixed absolute bound (1.1e-5 differences were seen on another CPU).
  want = np.asarray(a(ids))
  scale = np.abs(want).max()
  np.testing.assert_allclose(np.asarray(exported(ids)), want, rtol=1e-5, atol=1e-5 * scale)

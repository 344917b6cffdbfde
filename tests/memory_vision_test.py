"""The memory estimate of a Qwen2.5-VL run: the frames a batch carries and the vision tower's
activations against XLA's own count, and the 3B variant on one H100, built from shapes only."""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

from ragen_jax import models
from ragen_jax import sharding
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import memory
from ragen_jax.train import policy as policy_lib

ONE_DEVICE = sharding.Sharder(sharding.MeshSpec(data=1), num_devices=1)


@pytest.fixture(scope="module", name="tiny_vl")
def _tiny_vl():
  """(graphdef, abstract parameters) of tiny-vl: shapes only, nothing initialised."""
  return nnx.split(nnx.eval_shape(lambda: models.create("tiny-vl", jax.random.key(0))))


@pytest.mark.parametrize("frames, side", [(16, 84), (32, 56)])
def test_tower_activations_match_what_xla_allocates(tiny_vl, frames, side):
  """`tower_activations` against the temporary buffers XLA's buffer assignment gives the tiny-vl
  tower (float32, CPU) over uint8 frames: forward only within 30%, and the gradient's pass (every
  block kept for the backward) within 10%. Measured: 0.92-1.27x and 0.93-1.02x over 8-32 frames
  of 84 and 56 pixels; without the [P, P] scores the kept estimate would be 0.2x at 32 frames."""
  graphdef, params = tiny_vl
  frames_NxHxWx3 = jax.ShapeDtypeStruct((frames, side, side, 3), jnp.uint8)

  def features(p, f):
    return nnx.merge(graphdef, p).frame_features(f)

  def loss(p, f):
    return jnp.sum(features(p, f) ** 2)

  xla = {}
  for kept, fn in ((False, features), (True, jax.grad(loss))):
    compiled = jax.jit(fn).lower(params, frames_NxHxWx3).compile()
    xla[kept] = compiled.memory_analysis().temp_size_in_bytes
  v, patches = models.get_config("tiny-vl").vision, (side // 14) ** 2
  forward = memory.tower_activations(v, frames, patches, False, 4, ONE_DEVICE)
  kept = memory.tower_activations(v, frames, patches, True, 4, ONE_DEVICE)
  assert forward == pytest.approx(xla[False], rel=0.3)
  assert kept == pytest.approx(xla[True], rel=0.1)


def test_frames_and_tower_terms_by_hand_for_the_smoke_config():
  """visual_sokoban's :smoke: 2 groups x 2 episodes, 2 turns, 84x84 frames (36 patches, 9
  image tokens); validation plays 4 groups x 1. Hand-worked terms, and the train_vision_tower
  switch adding the update's kept blocks over a micro-batch of 2 rows x 2 frames."""
  exp = schema.from_config(cli.load_config_file("configs/visual_sokoban_ppo.py:smoke"))
  c = models.get_config("tiny-vl")  # D 64; tower Lv 4, Dv 32, Hv 2, Fv 64; float32
  est = memory.estimate(exp, c, ONE_DEVICE)
  assert est["frames"] == 4 * 2 * 84 * 84 * 3  # 4 rows x 2 turns' frames, uint8
  p = 4 * 36  # the rollout's call: a turn's frames of 4 episodes (validation: 4 x 1)
  forward = p * 1176 * 4 + p * ((4 * 32 + 2 * 64) * 4 + p * (2 * 4 + 2))
  kept_features = 2 * 4 * 9 * 64 * 4  # max_turns x 4 episodes x 9 tokens x D, float32
  assert est["tower"] == forward + kept_features
  config = cli.load_config_file("configs/visual_sokoban_ppo.py:smoke")
  config.ppo.train_vision_tower = True
  exp = schema.from_config(config)
  q = 2 * 2 * 36  # a micro-batch: 4 rows / 2 minibatches x 2 frames each
  kept = q * 1176 * 4 + 4 * q * ((10 * 32 + 4 * 64) * 4 + q * (2 * 12 + 1))
  assert memory.estimate(exp, c, ONE_DEVICE)["tower"] == est["tower"] + kept


def test_the_vision_tower_is_counted_once(tiny_vl):
  """tiny-vl's tower, as many elements as the model's arrays, in the actor's params and moments
  (float32 weights, two float32 moments and the gradient sum) and nowhere else: the separate
  critic is the text decoder alone, and a text environment shows no frames."""
  _, abstract = tiny_vl
  n = sum(x.size for x in jax.tree.leaves(abstract))
  tower = sum(x.size for x in jax.tree.leaves(abstract["visual"]))
  assert tower > 0
  exp = schema.from_config(cli.load_config_file("configs/sokoban_ppo.py:smoke"))  # separate GAE
  est = memory.estimate(exp, models.get_config("tiny-vl"), ONE_DEVICE)
  assert est["params"] == 4 * n and est["optimizer"] == 12 * n
  assert est["critic"] == 16 * (n - tower) and est["frames"] == est["tower"] == 0
  others = ("params", "optimizer", "critic", "kv_cache", "activations")
  assert est["total"] == sum(est[k] for k in others)


@pytest.fixture(scope="module", name="vl_3b_params")
def _vl_3b_params():
  """The 3B's parameter count from its module's abstract arrays (eval_shape: none allocated)."""
  c = models.get_config("qwen2.5-vl-3b")
  abstract = nnx.eval_shape(lambda: models.Qwen2_5_VL(c, rngs=nnx.Rngs(0)))
  return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize(
    "config_file, variant, episodes, total_gib",
    [
        ("visual_sokoban_ppo", "qwen2.5-vl-3b-h100-bf16", 64, 67.07),
        ("visual_frozenlake_ppo", "qwen2.5-vl-3b-h100-bf16", 64, 66.77),
        ("visual_sokoban_ppo", "qwen2.5-vl-3b-h100-lora", 64, 26.89),
        # float32 weights and moments: 32 episodes (variants.FP32_H100_EPISODES)
        ("visual_sokoban_ppo", "model=qwen2.5-vl-3b,hw=h100", 32, 69.56),
    ],
)
def test_the_vl_3b_variant_resolves_and_fits_one_h100(
    config_file, variant, episodes, total_gib, vl_3b_params, tmp_path
):
  """The variant of a visual config with a checkpoint directory holding only config.json (no
  weights anywhere): RAGEN's real-model values, the qwen2.5 tokenizer with the preset's vision
  token ids, and an estimate below `describe`'s 90% of 80 GB with the tower frozen (default)."""
  c = models.get_config("qwen2.5-vl-3b")
  (tmp_path / "config.json").write_text(json.dumps(models.hf_config.to_hf_dict(c)))
  config = cli.load_config_file(f"configs/{config_file}.py:{variant}")
  config.model.checkpoint = str(tmp_path)
  exp = schema.from_config(config)
  assert policy_lib.model_config(exp) == c
  schema.check_images(exp, c)  # a visual config: the pairing passes
  assert exp.model.preset == "qwen2.5-vl-3b" and exp.model.tokenizer == "qwen2.5"
  assert exp.model.dtype == "bfloat16" and exp.model.remat and exp.train_episodes == episodes
  assert exp.rollout.max_context == 3600 and exp.rollout.max_new_tokens == 400
  assert not exp.ppo.train_vision_tower and exp.ppo.micro_batches == episodes // 2 // 8
  lora = exp.model.lora.config()
  assert (lora is not None) == variant.endswith("lora")
  tok = tokenizers.load(exp.model.tokenizer)
  v = c.vision
  assert [tok.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")] == [
      v.vision_start_token_id,
      v.vision_end_token_id,
      v.image_token_id,
  ]
  run = c.replace(remat=True, dtype="bfloat16", param_dtype=exp.model.param_dtype)
  est = memory.estimate(exp, run, ONE_DEVICE, platform="gpu")
  n_lora = memory.lora_elements(run, lora, ONE_DEVICE)
  assert est["params"] == jnp.dtype(run.param_dtype).itemsize * vl_3b_params + 4 * n_lora
  side = 84 if "sokoban" in config_file else 56
  assert est["frames"] == episodes * exp.rollout.max_turns * side * side * 3
  assert est["tower"] > 0
  assert est["total"] / memory.GIB == pytest.approx(total_gib, abs=0.01)
  assert est["total"] / memory.GIB < 0.9 * 80

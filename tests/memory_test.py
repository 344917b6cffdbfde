"""The memory estimate against the models' own parameter arrays and hand-worked terms."""

import json
import math

from flax import nnx
import pytest

import jax
import jax.numpy as jnp

from ragen_jax import algos
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sharding
from ragen_jax import tokenizers
from ragen_jax.batch import RolloutBatch
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.config import variants
from ragen_jax.models import qwen2
from ragen_jax.train import memory


def _layout(data=1, fsdp=1, tensor=1):
  return sharding.Sharder(
      sharding.MeshSpec(data=data, fsdp=fsdp, tensor=tensor), num_devices=data * fsdp * tensor
  )


def _shard_elements(config, sharder):
  """Second implementation: walk the model's real parameter arrays and their logical names."""
  abstract = nnx.eval_shape(lambda: models.Qwen2(config, rngs=nnx.Rngs(0)))
  total = 0
  for _, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    axes = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
    total += math.prod(-(-n // sharder.size(a)) for n, a in zip(var.shape, axes))
  return total


@pytest.mark.parametrize(
    "name", ["tiny", "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "llama-3.2-1b"]
)
@pytest.mark.parametrize("mesh", [(1, 1, 1), (1, 4, 2), (2, 2, 2)])
def test_parameter_share_matches_the_model_arrays(name, mesh):
  config = models.get_config(name)
  layout = _layout(*mesh)
  assert memory.param_elements(config, layout) == _shard_elements(config, layout)
  if mesh == (1, 1, 1):
    assert memory.param_elements(config, layout) == models.num_params(config)


def test_terms_by_hand_for_the_smoke_config():
  exp = schema.from_config(cli.load_config_file("configs/sokoban_ppo.py:smoke"))
  c = models.get_config("tiny")
  est = memory.estimate(exp, c, _layout())
  n = models.num_params(c)
  assert est["params"] == 4 * n and est["optimizer"] == 12 * n
  assert est["critic"] == 16 * n  # GAE with a separate critic: params + moments + grad
  assert est["reference"] == 0  # no KL loss
  # Cache: L=4 layers x B=4 episodes x (512 + 256) slots x K=2 x Dh=32, k and v, float32.
  assert est["kv_cache"] == 4 * 4 * 768 * 2 * 32 * 2 * 4
  assert est["total"] == pytest.approx(sum(v for k, v in est.items() if k != "total"))
  # Activations: 2 rows (4 episodes, 2 minibatches) x 512 tokens; actor and critic each keep
  # every layer's internals, 4 x (4D + 6F + 2·H·Dh + 2·K·Dh) = 4 x 3,200 float32 per token, and
  # their attention scores, 2 x 4 layers x 4 heads x 320 keys per token (512 queries in blocks of
  # 128, each block against its key prefix: (512 + 128) / 2 on average) at 9.5 bytes; plus two
  # [2, 512, 2048] float32 logits chunks and two float32 copies of the [128, 2048] unembedding.
  tokens = 2 * 512
  assert memory.causal_keys(512) == 320 and memory.causal_keys(768) == 448
  assert memory.causal_keys(100) == 100
  assert est["activations"] == (
      tokens * 4 * 3200 * 4 * 2
      + tokens * 2 * 4 * 4 * 320 * memory.SCORE_BYTES
      + tokens * 2 * 2048 * 4
      + 2 * 128 * 2048 * 4
  )
  # The smoke variant's one block as long as the rows (model.attention_block) scores every key.
  assert exp.model.attention_block == exp.rollout.max_context == 512
  one_block = memory.estimate(exp, c.replace(attention_block=512), _layout())
  assert one_block["activations"] - est["activations"] == (
      tokens * 2 * 4 * 4 * (512 - 320) * memory.SCORE_BYTES
  )
  # Remat keeps one residual per layer instead of every layer's internals, and one layer's
  # scores, where the layers are scanned (deeper than UNROLLED_LAYERS); the tiny model's 4
  # layers run unrolled, where it saves nothing.
  assert memory.estimate(exp, c.replace(remat=True), _layout()) == est
  deep = c.replace(num_layers=qwen2.UNROLLED_LAYERS + 4)
  remat = memory.estimate(exp, deep.replace(remat=True), _layout())
  assert remat["activations"] < memory.estimate(exp, deep, _layout())["activations"] / 10
  line = memory.describe(est, device_bytes=est["total"] / 0.95)
  assert "likely out of memory" in line and "(95%)" in line


def _xla_temp_bytes(exp, c):
  """XLA's own count, a second implementation: the temporary buffers its buffer assignment gives
  the compiled train step for the estimate's batch (one device)."""
  separate = exp.ppo.uses_critic and exp.ppo.critic == "separate"

  def modules():  # abstract under eval_shape: a 135M model's initialisation alone takes ~20 s
    actor = models.Qwen2(c, rngs=nnx.Rngs(0))
    return actor, models.Qwen2Critic(c, rngs=nnx.Rngs(1)) if separate else None

  actor, critic = nnx.eval_shape(modules)
  state = jax.eval_shape(lambda: algos.init_train_state(*modules(), exp.ppo, jax.random.key(1)))
  b, t = exp.train_episodes, exp.rollout.max_context
  ints, floats = jax.ShapeDtypeStruct((b, t), jnp.int32), jax.ShapeDtypeStruct((b, t), jnp.float32)
  batch = RolloutBatch(
      tokens_BxT=ints,
      attention_mask_BxT=ints,
      loss_mask_BxT=ints,
      logprobs_BxT=floats,
      token_rewards_BxT=floats,
      group_ids_B=jax.ShapeDtypeStruct((b,), jnp.int32),
      scores_B=jax.ShapeDtypeStruct((b,), jnp.float32),
  )
  step = algos.make_train_step(actor, critic, exp.ppo).lower(state, batch, jax.random.key(2))
  return step.compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize(
    "preset, tokens, estimator, layers, remat, rank",
    [
        ("tiny", 2048, "grpo", 4, False, 0),  # the actor alone; every layer's scores, most of it
        # Actor and critic, scanned, one layer's scores.
        ("tiny", 1024, "gae", qwen2.UNROLLED_LAYERS + 2, True, 0),
        # SmolLM2-135M whole (30 scanned layers, D 576, 9 query and 3 kv heads of 64, F 1536,
        # V 49,152) with RAGEN's LoRA, its default: what every scanned layer keeps, the stacked
        # attention kernels, the unembedding's chunked copies (a sixth of the total here).
        ("smollm2-135m", 256, "grpo", 30, False, 64),
    ],
)
def test_activations_match_what_xla_allocates(preset, tokens, estimator, layers, remat, rank):
  """The activation term against the compiled train step's temporary buffers on CPU (XLA's
  attention kernel): within 25%. Without the attention scores the tiny model's estimate was
  0.21x; with them as a full [T, T] square, SmolLM2's was 0.69x at 256 tokens and its 30 layers'
  internals came out short (the scores' excess made up for them at 1,024)."""
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.rollout.max_context = tokens
    config.ppo.num_minibatches, config.ppo.micro_batches = 1, 1
    config.ppo.adv_estimator = estimator
    config.model.lora.rank, config.model.lora.alpha = rank, 64.0
  exp = schema.from_config(config)
  c = models.get_config(preset).replace(
      num_layers=layers, remat=remat, lora=exp.model.lora.config()
  )
  est = memory.estimate(exp, c, _layout(), platform="cpu")["activations"]
  assert est == pytest.approx(_xla_temp_bytes(exp, c), rel=0.25)


@pytest.mark.parametrize(
    "spec, tokenizer",
    [("sokoban_ppo.py:smoke", "sentencepiece"), ("text_mix_ppo.py", "sentencepiece")],
)
def test_the_estimate_counts_the_cache_the_engine_allocates(spec, tokenizer):
  """The estimate's kv_cache term equals the bytes of the cache the rollout engine allocates
  for its largest tag (one slot formula, `rollout.episodes.cache_slots`)."""
  exp = schema.from_config(cli.load_config_file(f"configs/{spec}"))
  c = models.get_config("tiny")
  allocated = 0
  for tag in exp.envs:
    engine = rollout.Rollout(
        tag.make(), tokenizers.load(tokenizer), tag.rollout_config(exp.rollout, validation=False)
    )
    cache = jax.eval_shape(lambda e=engine: models.init_cache(c, e.batch_size, e.capacity))
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    nbytes -= cache.mask_BxS.size + cache.end_index.size * 4  # the slot mask and write offset
    allocated = max(allocated, nbytes)
    engine.close()
  assert memory.estimate(exp, c, _layout())["kv_cache"] == allocated


@pytest.mark.parametrize(
    "param_dtype, moment_dtype, params, optimizer",
    [
        ("float32", "float32", 4, 12),  # moments 2 x 4 bytes + the float32 gradient sum
        ("bfloat16", "float32", 2, 12),
        ("bfloat16", "bfloat16", 2, 8),  # the gradient sum stays float32
        ("float32", "bfloat16", 4, 8),
    ],
)
def test_param_and_moment_dtypes_by_hand(param_dtype, moment_dtype, params, optimizer):
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.model.param_dtype, config.ppo.moment_dtype = param_dtype, moment_dtype
    config.ppo.use_kl_loss, config.ppo.kl_coef = True, 0.001
  exp = schema.from_config(config)
  c = models.get_config("tiny").replace(param_dtype=param_dtype)
  n = models.num_params(c)
  est = memory.estimate(exp, c, _layout())
  assert est["params"] == params * n and est["optimizer"] == optimizer * n
  assert est["critic"] == (params + optimizer) * n  # separate critic: the same again
  assert est["reference"] == params * n  # the KL loss's reference, in the parameters' dtype


# Qwen2.5-3B: L=36, D=2048, H=16, K=2, Dh=128, F=11008, V=151936, tied head; per layer q and o
# 2 x 2048 x 2048, k and v 2 x 2048 x 256, MLP 3 x 2048 x 11008, biases 2048 + 2 x 256, norms
# 2 x 2048 = 77,076,992; x 36 + embedding 151936 x 2048 + final norm 2048.
N_3B = 36 * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 11008 + 2048 + 512 + 2 * 2048) + (
    151936 * 2048 + 2048
)
# Qwen2.5-7B: L=28, D=3584, H=28, K=4, Dh=128, F=18944, V=152064, untied head.
N_7B = 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944 + 3584 + 1024 + 2 * 3584) + (
    2 * 152064 * 3584 + 3584
)


@pytest.mark.parametrize(
    "variant, n, kv_cache, activations",
    [
        # KV cache: L x 128 episodes x (3840 + 256) slots x K x Dh, k and v, bfloat16.
        # Activations (remat): 8 sequences x 3600 tokens x (L·D + 4D + 2F + 2·H·Dh) x 2 bytes,
        # plus two [8, 3600, 8192] float32 logits chunks and two bfloat16 copies of the [D, V]
        # unembedding.
        (
            "qwen2.5-3b-h100-bf16",
            N_3B,
            36 * 128 * 4096 * 2 * 128 * 2 * 2,
            8 * 3600 * (36 * 2048 + 4 * 2048 + 2 * 11008 + 2 * 2048) * 2
            + 8 * 3600 * 2 * 8192 * 4
            + 2 * 2048 * 151936 * 2,
        ),
        (
            "qwen2.5-7b-h100-bf16",
            N_7B,
            28 * 128 * 4096 * 4 * 128 * 2 * 2,
            8 * 3600 * (28 * 3584 + 4 * 3584 + 2 * 18944 + 2 * 3584) * 2
            + 8 * 3600 * 2 * 8192 * 4
            + 2 * 3584 * 152064 * 2,
        ),
    ],
)
def test_bf16_variants_at_ragens_batch_on_one_h100(variant, n, kv_cache, activations, tmp_path):
  """The README's numbers: bfloat16 weights with float32 moments, RAGEN's 8 x 16 episodes."""
  preset = variant.split("-h100")[0]
  model_config = models.get_config(preset)
  assert models.num_params(model_config) == n
  with open(tmp_path / "config.json", "w", encoding="utf-8") as fp:
    json.dump(models.hf_config.to_hf_dict(model_config), fp)
  config = cli.load_config_file(f"configs/sokoban_ppo.py:{variant}")
  with config.unlocked():
    config.model.checkpoint = str(tmp_path)
  exp = schema.from_config(config)
  assert exp.model.param_dtype == "bfloat16" and exp.ppo.moment_dtype == "float32"
  assert exp.train_episodes == 128 and exp.ppo.micro_batches == 4  # 8 sequences each
  est = memory.estimate(
      exp,
      model_config.replace(remat=True, dtype="bfloat16", param_dtype="bfloat16"),
      _layout(),
      platform="gpu",  # cuDNN's attention: no scores kept
  )
  assert est["params"] == 2 * n and est["optimizer"] == 12 * n
  assert est["critic"] == 0 and est["reference"] == 0  # shared value head, no KL loss
  assert est["kv_cache"] == kv_cache and est["activations"] == activations
  total_gib = est["total"] / memory.GIB
  if preset == "qwen2.5-3b":  # fits one 80 GB card, at 84% below `describe`'s 90% warning
    assert total_gib == pytest.approx(66.95, abs=0.01) and total_gib < 0.9 * 80
  else:  # full fine-tuning of 7B does not fit one card
    assert total_gib == pytest.approx(139.65, abs=0.01)


@pytest.mark.parametrize(
    "variant", [v for v in variants.VARIANTS if v.endswith(tuple(variants.HARDWARE))]
)
@pytest.mark.parametrize("config_file", ["sokoban_ppo", "frozenlake_ppo", "bandit_grpo"])
def test_accelerator_variants_fit_their_card(variant, config_file, tmp_path):
  preset, hardware = variant.rsplit("-", 1)
  card = variants.HARDWARE[hardware]
  model_config = models.get_config(preset)
  with open(
      tmp_path / "config.json", "w", encoding="utf-8"
  ) as fp:  # a checkpoint directory's config only
    json.dump(models.hf_config.to_hf_dict(model_config), fp)
  config = cli.load_config_file(f"configs/{config_file}.py:{variant}")
  with config.unlocked():
    config.model.checkpoint = str(tmp_path)
  exp = schema.from_config(config)
  assert exp.model.remat and exp.model.dtype == "bfloat16" and exp.model.preset == preset
  layout = sharding.Sharder(exp.mesh, num_devices=card["devices"])
  layout.check_model(model_config)
  layout.check_batch("the training batch", exp.train_episodes)
  est = memory.estimate(
      exp,
      model_config.replace(remat=True, dtype="bfloat16", param_dtype=exp.model.param_dtype),
      layout,
      platform=card["platform"],
  )
  assert est["total"] < 0.8 * card["memory_gib"] * memory.GIB, memory.describe(est, None)


def test_lora_trains_only_the_adapters_by_hand():
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.model.lora.rank = 8
    config.ppo.use_kl_loss = True
  exp = schema.from_config(config)
  c = models.get_config("tiny")  # L=4, D=128, H=4, K=2, Dh=32, F=384
  # A [L, in, r] + B [L, r, out] per kernel, r=8: L*r*(in + out) summed over q, k, v, o, gate,
  # up, down = 32 * ((128+128) + 2*(128+64) + (128+128) + 3*(128+384)) = 32 * 2432.
  n_lora = 32 * 2432
  assert memory.lora_elements(c, exp.model.lora.config(), _layout()) == n_lora == 77824
  n = models.num_params(c)
  est = memory.estimate(exp, c, _layout())
  assert est["params"] == 4 * (n + n_lora)
  assert est["optimizer"] == 12 * n_lora  # moments and gradient of the adapters only
  assert est["reference"] == 0  # the reference is the actor's own base weights
  assert est["critic"] == 16 * (n + n_lora)  # the separate critic trains all its weights
  full = memory.estimate(
      schema.from_config(cli.load_config_file("configs/sokoban_ppo.py:smoke")),
      c,
      _layout(),
  )
  assert full["optimizer"] == 12 * n and full["optimizer"] > 13 * est["optimizer"]
  # The model's own adapters, counted by the test's second implementation.
  adapted = c.replace(lora=exp.model.lora.config())
  abstract = nnx.eval_shape(lambda: models.Qwen2(adapted, rngs=nnx.Rngs(0)))
  assert sum(v.size for _, v in nnx.to_flat_state(nnx.state(abstract, models.lora.LoraParam))) == (
      n_lora
  )


@pytest.mark.parametrize(
    "variant, episodes, total_gib",
    [
        ("qwen2.5-3b-h100-lora", 128, 34.2),
        ("qwen2.5-7b-h100-lora", 128, 56.9),
        ("qwen3-4b-h100-lora", 64, 55.6),  # 8 kv heads: the KV cache halves the groups
        ("qwen3-8b-h100-lora", 64, 68.5),
    ],
)
def test_lora_variants_fit_one_h100(variant, episodes, total_gib, tmp_path):
  """RAGEN's LoRA (rank 64, all linear layers) on frozen bfloat16 weights: the optimizer holds
  the adapters' moments only, and every model up to 8B fits 80 GB below `describe`'s 90% warning
  (8B: 68.5 GiB, 86%, with the 36 GiB cache of 64 episodes at 4,096 slots; the sum counts the
  rollout's cache and the update's activations, which are never live together)."""
  preset = variant.split("-h100")[0]
  model_config = models.get_config(preset)
  with open(tmp_path / "config.json", "w", encoding="utf-8") as fp:
    json.dump(models.hf_config.to_hf_dict(model_config), fp)
  config = cli.load_config_file(f"configs/sokoban_ppo.py:{variant}")
  with config.unlocked():
    config.model.checkpoint = str(tmp_path)
  exp = schema.from_config(config)
  lora_config = exp.model.lora.config()
  assert lora_config.rank == 64 and lora_config.alpha == 64 and len(lora_config.targets) == 7
  assert exp.ppo.actor_lr == pytest.approx(1e-5)  # RAGEN's LoRA learning rate: 10 x 1e-6
  assert exp.train_episodes == episodes and exp.ppo.critic == "shared"
  c = model_config.replace(remat=True, dtype="bfloat16", param_dtype="bfloat16")
  est = memory.estimate(exp, c, _layout(), platform="gpu")  # cuDNN's attention: no scores kept
  n, n_lora = models.num_params(c), memory.lora_elements(c, lora_config, _layout())
  # Per layer and target, r x (in + out): q 64 x (D + H·Dh), k and v 64 x (D + K·Dh), ...
  d, f, q, kv = (
      c.hidden_size,
      c.intermediate_size,
      c.num_heads * c.head_dim,
      c.num_kv_heads * c.head_dim,
  )
  assert n_lora == c.num_layers * 64 * ((d + q) * 2 + (d + kv) * 2 + (d + f) * 3)
  assert est["params"] == 2 * n + 4 * n_lora and est["optimizer"] == 12 * n_lora
  assert est["reference"] == 0 and est["critic"] == 0
  assert est["total"] / memory.GIB == pytest.approx(total_gib, abs=0.05)
  assert est["total"] / memory.GIB < 0.9 * 80

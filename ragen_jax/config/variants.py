"""Variants of a config file, `configs/x.py:<arg>`: a real model, its precision, the card it
runs on, and the seconds-scale sizes of tests (`apply_variant`).

    configs/sokoban_ppo.py:smoke
    configs/sokoban_ppo.py:model=qwen2.5-3b,hw=h100     (or the shorthand :qwen2.5-3b-h100)

`sections.experiment` applies the variant after the file's own values; the hardware sizing asks
the rollout for its cache size (`rollout.episodes.cache_slots`) rather than restating it.
"""

from typing import Dict, Optional

import ml_collections

from ragen_jax import envs as envs_lib
from ragen_jax import models
from ragen_jax import rollout as rollout_lib

MODELS = (
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen2.5-vl-3b",  # Qwen2.5-VL: the visual configs only (config.schema checks the envs)
)
# Real models whose weights `python -m ragen_jax.models.fetch NAME` puts in the cache (no
# --config.model.checkpoint needed): variant -> (fetch name, preset of its shapes).
FETCHED = {"smollm2": ("smollm2-135m-instruct", "smollm2-135m")}
REPLY_TOKENS = 100  # a fetched model's reply cap
# Accelerators (`hw=`): the mesh, and what makes the update fit the card's memory (model.remat,
# ppo.micro_batches, a critic sharing the actor's trunk for 3B); the run prints its memory
# estimate at start (ragen_jax/train/memory.py).
HARDWARE = {
    "h100": dict(devices=1, memory_gib=80, platform="gpu"),  # one H100 80 GB
    # TPU v5e-8: 8 chips x 16 GB, fsdp over all 8
    "v5e8": dict(devices=8, memory_gib=16, platform="tpu"),
}
# Episodes a step on one H100 with float32 weights and moments (no params=): 80 GB hold the 3B's
# ~46 GiB of them plus the KV cache of 64 episodes x 3600 tokens (8.5 GiB), Qwen2.5-VL-3B's ~56
# GiB (its tower's 0.67B parameters) that of 32; more groups (sokoban_ppo samples 8) take smaller
# ones. bfloat16 weights (params=bf16) leave room for RAGEN's 128 (65 GiB in all).
FP32_H100_EPISODES = {"qwen2.5-3b": 64, "qwen2.5-vl-3b": 32}
# Scales of the tiny model (no model=): smoke and debug, seconds on a CPU; gpu, one accelerator.
SCALES = ("smoke", "debug", "gpu")
# What is stored and trained (`params=`): bf16, bfloat16 weights updated from float32 AdamW
# moments (ragen_jax/algos/optim.py says what bfloat16 weights lose); lora, RAGEN's LoRA (rank
# 64, alpha 64, all seven linear layers) on frozen bfloat16 weights, float32 adapters.
ALL_MODELS = (*MODELS, *FETCHED)
# full, every weight trained (no adapters): the default of the qwen models, the switch for the
# fetched ones, which train with LoRA by default.
PRECISIONS = ("bf16", "lora", "full")
# Variant names in use, each also a shorthand: `qwen2.5-3b-h100` = `model=qwen2.5-3b,hw=h100`,
# `qwen2.5-7b-h100-bf16` = `model=qwen2.5-7b,hw=h100,params=bf16`.
VARIANTS = (
    *SCALES,
    *MODELS,
    *FETCHED,
    *(f"{m}-full" for m in FETCHED),
    *(f"{q}-{h}" for q in ("qwen2.5-0.5b", "qwen2.5-3b") for h in HARDWARE),
    *(f"{q}-h100-bf16" for q in ("qwen2.5-3b", "qwen2.5-7b")),
    *(f"{q}-h100-lora" for q in ("qwen2.5-3b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b")),
    *(f"qwen2.5-vl-3b-h100-{p}" for p in ("bf16", "lora")),
)


def _shorthand(item: str) -> Optional[Dict[str, str]]:
  """`<model>[-<hw>][-<precision>]` as {"model", "hw", "params"}; None for anything else."""
  out = {}
  rest, _, last = item.rpartition("-")
  if last in PRECISIONS:
    item, out["params"] = rest, last
  rest, _, last = item.rpartition("-")
  if rest in ALL_MODELS and last in HARDWARE:
    item, out["hw"] = rest, last
  if item not in ALL_MODELS:
    return None
  return {"model": item, **out}


def parse_variant(arg: Optional[str]) -> Dict[str, str]:
  """`configs/x.py:<arg>` as {"model", "hw", "params", "scale"}: comma-separated `model=M`,
  `hw=H`, `params=P`, a scale (smoke | debug), or a name `<model>[-<hw>][-<precision>]`
  (`qwen2.5-3b`, `qwen2.5-3b-h100`, `qwen2.5-3b-h100-bf16`), in any order."""
  out = {}
  valid = {"model": ALL_MODELS, "hw": tuple(HARDWARE), "params": PRECISIONS, "scale": SCALES}
  for item in filter(None, (arg or "").split(",")):
    key, eq, value = item.partition("=")
    if eq:
      pairs = {key: value}
    elif item in SCALES:
      pairs = {"scale": item}
    else:
      pairs = _shorthand(item) or {None: item}
    for key, value in pairs.items():
      if key not in valid or value not in valid[key] or key in out:
        raise ValueError(
            f"unknown or repeated config variant {item!r} in {arg!r}; valid: "
            f"{', '.join(SCALES)}, model=({'|'.join(ALL_MODELS)}), hw=({'|'.join(HARDWARE)}), "
            f"params=({'|'.join(PRECISIONS)}), or a name in use "
            f"({', '.join(VARIANTS[len(SCALES):])}), joined by commas"
        )
      out[key] = value
  for key in ("hw", "params"):
    if key in out and "model" not in out:
      raise ValueError(f"config variant {arg!r}: {key}= sizes a real model; add model=...")
  if out.get("scale") == "gpu" and "model" in out:
    raise ValueError(f"config variant {arg!r}: gpu sizes the tiny model; a real one takes hw=")
  return out


def apply_variant(config: ml_collections.ConfigDict, arg) -> ml_collections.ConfigDict:
  """Applies `configs/x.py:<arg>` (`parse_variant`): the model, then the hardware, then the scale.

  model=qwen2.5-*: a real checkpoint (`--config.model.checkpoint=DIR`, required) with its own
    tokenizer, no warm start, RAGEN's learning rates and lengths; qwen2.5-vl-3b (Qwen2.5-VL-3B,
    whose weights no machine of this project reaches: never run here) for the visual configs.
  model=smollm2 (`FETCHED`): the fetched SmolLM2-135M-Instruct GGUF, sized for a 2-core CPU,
    with LoRA; params=full trains every weight instead.
  params=bf16: bfloat16 weights (actor, critic, reference) with float32 AdamW moments.
  params=lora: RAGEN's LoRA (rank 64, alpha 64, all linear layers, the actor's learning rate x10)
    on frozen bfloat16 weights.
  hw=h100 | v5e8: remat, the mesh and micro-batches for that card (`HARDWARE`), knowing the
    weights' dtype.
  smoke: seconds-scale sizes for tests and CI (the whole run well under 2 minutes on 2 cores);
    debug: the same, for quick manual runs of evaluation.
  gpu: the tiny model on one accelerator: 512 episodes a step (`_gpu_variant`).
  """
  variant = parse_variant(arg)
  if variant.get("model") in FETCHED:
    _fetched_variant(config, variant["model"], variant.get("params") == "full")
  elif "model" in variant:
    _model_variant(config, variant["model"])
  if variant.get("params") in ("bf16", "lora"):
    config.model.param_dtype = "bfloat16"
    config.ppo.moment_dtype = "float32"
    if variant["params"] == "lora":  # RAGEN's LoRA recipe: rank 64, alpha 64, LR x10
      config.model.lora.rank, config.model.lora.alpha = 64, 64.0
      config.ppo.actor_lr *= 10
  if "hw" in variant:
    _hardware_variant(config, variant["model"], variant["hw"])
  if variant.get("scale") == "gpu":
    _gpu_variant(config)
  elif "scale" in variant:
    _smoke_variant(config)
  return config


def _model_variant(config, preset: str) -> None:
  config.model.preset = preset
  config.model.tokenizer = "qwen2.5"
  config.model.dtype = "bfloat16"
  config.diagnostics.multi_turn_samples = 64
  config.sft.steps = 0
  config.ppo.actor_lr = 1e-6
  config.ppo.critic_lr = 1e-5
  config.rollout.max_new_tokens = 400
  config.rollout.max_context = 3600
  config.rollout.group_size = 16
  config.trainer.pad_multiple = 512


def _fetched_variant(config, name: str, full: bool) -> None:
  """A fetched real model (`FETCHED`) on a 2-core CPU: its weights from the cache, its own
  tokenizer and chat template, RAGEN's prompts, format and format penalty; LoRA (RAGEN's rank 64,
  alpha 64) unless `full`. Lengths fit its tokenizer: RAGEN's longest user turn (Sokoban's, with
  the output rule) is ~150 tokens here and a reply is held to 100. Batches are the config's groups
  of 4 episodes: a step of 16-32 episodes, a validation of at most 32 levels."""
  fetch_name, preset = FETCHED[name]
  config.model.preset = preset
  config.model.checkpoint = models.fetch.path(fetch_name)
  config.model.warm_start = False
  config.model.dtype = "float32"  # XLA's CPU matmuls are fastest in float32
  config.sft.steps = 0  # RAGEN's start: the instruct model itself
  if not full:
    config.model.lora.rank, config.model.lora.alpha = 64, 64.0
  config.rollout.group_size = 4
  # RAGEN's "Max response length: 100 words (tokens)"; the context grows by the longer replies
  # (its tokenizer spells RAGEN's prompts in about as many tokens as the tiny model's).
  r = config.rollout
  longer = r.max_turns * max(REPLY_TOKENS - r.max_new_tokens, 0)
  r.max_context = -(-(r.max_context + longer) // 256) * 256
  r.max_new_tokens = REPLY_TOKENS
  r.max_turn_tokens = 512
  config.rollout.val_batch_groups = 32
  for env_section in config.envs.values():
    env_section.val_groups = min(env_section.val_groups, 32)
  config.trainer.pad_multiple = 256
  # RAGEN's collapse diagnostics score every sampled reply under every prompt: at this size on
  # two cores they took longer than the step they measure (96 s of 800). On with compute_freq.
  config.diagnostics.compute_freq = 0


def _hardware_variant(config, preset: str, hardware: str) -> None:
  """Sizes for one H100 or a TPU v5e-8 (`HARDWARE`); chosen with the memory estimate."""
  config.model.remat = True  # a [U, 3600, D] residual per layer instead of all internals
  if hardware == "v5e8":
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 8, 1
  groups = sum(e.train_groups for e in config.envs.values())
  full_fp32 = config.model.param_dtype == "float32" and not config.model.lora.rank
  if preset in FP32_H100_EPISODES and hardware == "h100" and full_fp32:
    while (
        groups * config.rollout.group_size > FP32_H100_EPISODES[preset]
        and config.rollout.group_size > 1
    ):
      config.rollout.group_size //= 2
  if hardware == "h100":
    # The rollout's bfloat16 KV cache within 36 GiB of the 80: Qwen3's 8 kv heads take 0.56 GiB
    # an episode at 4096 slots, so 4B and 8B sample 64 episodes (smaller groups).
    c = models.get_config(preset)
    slots = rollout_lib.episodes.cache_slots(
        config.rollout.max_context, config.rollout.max_turn_tokens
    )
    per_episode = 2 * 2 * c.num_layers * c.num_kv_heads * c.head_dim * slots
    while groups * config.rollout.group_size * per_episode > 36 * 2**30:
      if config.rollout.group_size == 1:
        break
      config.rollout.group_size //= 2
  episodes = groups * config.rollout.group_size
  per_minibatch = episodes // config.ppo.num_minibatches
  config.ppo.micro_batches = max(1, per_minibatch // 8)  # 8 sequences per micro-batch
  if models.num_params(models.get_config(preset)) > 2e9:
    # Weights, AdamW moments and gradient sum of a 3B actor take 40-46 GiB (7B: 99-113); a
    # second, separate critic of that size would not fit 80 GB (or 8 x 16 GB): the value head
    # shares the actor's trunk instead (with LoRA its gradient reaches the adapters only).
    config.ppo.critic = "shared"
    config.ppo.vf_coef = 0.1


def _gpu_variant(config) -> None:
  """The tiny model where a rollout of 512 episodes costs about what 64 do on a CPU: 32 groups
  x RAGEN's 16 per environment tag, minibatches of 64 episodes (StarPO-S's kept half gives 4
  optimizer steps a step), one compiled train-step shape. The run is long (1,000 steps): stop it
  with SIGTERM when its time is up (it saves and exits), as `experiments/gpu_learn.py` does."""
  for env_section in config.envs.values():
    env_section.train_groups = 32
  config.rollout.group_size = 16
  episodes = sum(e.train_groups for e in config.envs.values()) * config.rollout.group_size
  config.ppo.num_minibatches = episodes // 64
  # 16 sequences per micro-batch: XLA's attention (the float32 tiny model's) keeps each layer's
  # [U, H, T, T] scores, ~20 GB for U = 64 at T = 1024 with the critic.
  config.ppo.micro_batches = 4
  config.trainer.pad_multiple = config.rollout.max_context
  config.trainer.total_steps = 1000
  config.trainer.eval_every = 10
  config.trainer.save_every = 25
  config.diagnostics.compute_freq = 10


# Smoke contexts (tokens) of the grid environments: two turns of a 6x6 Sokoban come to about
# 450 (a visual one's image tokens included), 2048's and FrozenLake's to fewer. Bandit's long
# rules and the text tasks' answers take the 768 of any other environment.
SMOKE_CONTEXT = {
    name: 512 for name in ("sokoban", "frozenlake", "visual_sokoban", "visual_frozenlake", "2048")
}


def _smoke_variant(config) -> None:
  for env_section in config.envs.values():
    env_section.train_groups = 2
    env_section.val_groups = 4
  config.rollout.group_size = 2
  # Text environments' answers (an expression, a placement) and their experts' demonstrations
  # need longer replies than a grid move.
  text = any(
      not envs_lib.is_jax(envs_lib.registry.resolve(e.name, e.entry)) for e in config.envs.values()
  )
  config.rollout.max_new_tokens = min(config.rollout.max_new_tokens, 64 if text else 24)
  # Each program's cost grows with the context (a cold Sokoban smoke launch takes 14% less CPU
  # at 512 tokens than at 768), so each environment gets the least its two smoke turns fit in.
  context = max(SMOKE_CONTEXT.get(e.name, 768) for e in config.envs.values())
  config.rollout.max_context = context
  config.model.attention_block = context  # one block: 8% less CPU a cold Sokoban launch
  config.rollout.max_turn_tokens = 256
  config.rollout.max_turns = min(config.rollout.max_turns, 2)
  config.ppo.num_minibatches = 2
  config.ppo.micro_batches = 1
  config.sft.steps = min(config.sft.steps, 2)
  config.sft.batch_size = 4
  config.trainer.total_steps = min(config.trainer.total_steps, 4)
  config.trainer.eval_every = 2
  config.trainer.save_every = 2
  config.trainer.sample_trajectories = 1
  config.trainer.pad_multiple = context  # one compiled train-step shape
  config.diagnostics.compute_freq = 2
  config.diagnostics.num_samples = 4
  config.diagnostics.multi_turn_samples = 4

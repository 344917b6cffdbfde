"""Config sections every experiment in `configs/` is built from, each knob defined and commented.

A `configs/<experiment>.py` picks its environments (the `*_env()` sections below, RAGEN's tags),
then the algorithm knobs that make the experiment, and ends with `apply_variant(config, arg)`
for `configs/x.py:<variant>`. `ragen_jax.train.experiment.from_config` validates the result
into typed objects. Defaults follow RAGEN's config/base.yaml (shared/reference/ragen.md §3.4),
except where a 1M-parameter model trained from scratch on a 2-core CPU needs otherwise (each
such value says so).
"""
import ml_collections
from ml_collections import config_dict


def env_section(name: str, *, options: dict, render_format: str, max_actions_per_traj: int,
                max_tokens_hint: int, train_groups: int, val_groups: int,
                val_options: dict | None = None) -> ml_collections.ConfigDict:
  """One environment tag (RAGEN's custom_envs entry plus its es_manager group counts)."""
  env = ml_collections.ConfigDict()
  env.name = name                                  # ragen_jax.envs registry name
  env.options = ml_collections.ConfigDict(options)  # keyword arguments of envs.make
  env.val_options = ml_collections.ConfigDict(val_options or {})  # overrides for validation
  env.render_format = render_format                # grid | coord | grid_coord
  env.max_actions_per_traj = max_actions_per_traj  # action budget of an episode
  env.max_tokens_hint = max_tokens_hint            # "Max response length: N words" in the prompt
  env.train_groups = train_groups                  # env groups of this tag per training step
  env.val_groups = val_groups                      # validation groups (seeds seed.val + g)
  env.sft_batches = 1                              # demonstration batches of this tag in each
                                                   # round of the SFT warm start's mix
  return env


def sokoban_env(**overrides) -> ml_collections.ConfigDict:
  """RAGEN's CoordSokoban: 6x6, one box, grid + coordinates, 10 actions."""
  env = env_section("sokoban", options=dict(
      dim_room=(6, 6),          # room rows, cols
      num_boxes=1,              # boxes (= targets)
      max_steps=100,            # env step limit (the action budget binds first)
      search_depth=40,          # steps of each reverse walk in level generation
      step_reward=-0.1,         # every step (gym-sokoban's rewards, as RAGEN keeps them)
      box_on_target_reward=1.0,  # a box onto a target (minus this for one taken off)
      solved_reward=10.0,       # every box on a target
  ), render_format="grid_coord", max_actions_per_traj=10, max_tokens_hint=120,
      train_groups=8, val_groups=64)
  env.update(overrides)
  return env


def frozenlake_env(**overrides) -> ml_collections.ConfigDict:
  """RAGEN's CoordFrozenLake: random 4x4 maps, slippery moves, 10 actions."""
  env = env_section("frozenlake", options=dict(
      size=4,                   # board side
      p=0.9,                    # probability that a tile is frozen
      success_rate=0.8,         # intended-move probability (RAGEN tags 0.8; _3_frozen_lake 1.0)
      is_slippery=True,
      max_steps=100,
  ), render_format="grid_coord", max_actions_per_traj=10, max_tokens_hint=100,
      train_groups=8, val_groups=64)
  env.update(overrides)
  return env


def bandit_env(**overrides) -> ml_collections.ConfigDict:
  """RAGEN's Bandit: two named arms, one pull. Validation uses the training names: a model
  trained from scratch knows nothing of unseen names (RAGEN validates on BanditTest)."""
  env = env_section("bandit", options=dict(
      split="train",            # arm-name pairs: train | test
      lo_arm_score=0.1,         # safe arm payout
      hi_arm_hiscore=1.0,       # risky arm payout when it pays
      hi_arm_loscore=0.0,       # risky arm payout otherwise
      hi_arm_hiscore_prob=0.25,  # probability that the risky arm pays
  ), render_format="grid", max_actions_per_traj=1, max_tokens_hint=100,
      train_groups=8, val_groups=64)
  env.update(overrides)
  return env


def model_section() -> ml_collections.ConfigDict:
  model = ml_collections.ConfigDict()
  model.preset = "tiny"                # ragen_jax.models.PRESETS name (used without checkpoint)
  model.checkpoint = config_dict.placeholder(str)  # Hugging Face directory; replaces the preset
  model.warm_start = True              # tiny preset: start from the shipped fine-tuned weights
                                       # (ragen_jax/assets/tiny_warm_start, configs/warm_start_sft.py)
  model.tokenizer = "sentencepiece"    # without a checkpoint (or one lacking tokenizer.json)
  model.dtype = "float32"              # activation dtype (parameters stay float32)
  model.remat = False                  # recompute each layer in the backward pass (memory)
  return model


def rollout_section(*, max_turns: int, max_actions_per_turn: int,
                    max_new_tokens: int) -> ml_collections.ConfigDict:
  """RAGEN's agent-loop defaults; the keyword arguments are the per-experiment ones."""
  rollout = ml_collections.ConfigDict()
  rollout.group_size = 16              # episodes per group (sharing a start state)
  rollout.max_turns = max_turns        # agent turns per episode
  rollout.max_actions_per_turn = max_actions_per_turn  # answer words kept per turn
  rollout.action_sep = "||"            # separator between actions in <answer>
  rollout.format_penalty = -0.1        # per turn with a missing tag / bad or no action
  rollout.unchanged_penalty = 0.0      # per training turn that leaves the state as it was
                                       # (not RAGEN; validation rewards never carry it)
  rollout.enable_think = True          # <think>..</think><answer>..</answer> format
  rollout.max_new_tokens = max_new_tokens  # sampled tokens per turn (RAGEN response_length)
  rollout.max_context = 3600           # tokens per conversation (RAGEN max_model_len)
  rollout.max_turn_tokens = 512        # longest appended user turn (KV cache slack)
  rollout.temperature = 1.0            # training rollout temperature
  rollout.top_p = 1.0                  # nucleus mass (1 = off)
  rollout.top_k = 0                    # top-k (0 = off)
  rollout.use_turn_scores = False      # also place each turn's reward on its last token
  rollout.val_group_size = 1           # validation episodes per group (pass@k, k = this)
  rollout.val_temperature = 0.5        # RAGEN's evaluation temperature
  rollout.val_batch_groups = 64        # validation groups played per batch (memory bound)
  return rollout


def cpu_rollout_section(*, max_turns: int = 5, max_actions_per_turn: int = 2,
                        max_new_tokens: int = 48, group_size: int = 8,
                        max_context: int = 1024) -> ml_collections.ConfigDict:
  """rollout_section at the tiny model's CPU scale (RAGEN's turn limits by default)."""
  rollout = rollout_section(max_turns=max_turns, max_actions_per_turn=max_actions_per_turn,
                            max_new_tokens=max_new_tokens)
  rollout.group_size = group_size      # CPU: RAGEN 16
  rollout.max_context = max_context    # CPU: the tiny model's replies are short
  rollout.max_turn_tokens = 256        # CPU: a user turn is ~120 tokens here
  return rollout


def ppo_section(**overrides) -> ml_collections.ConfigDict:
  """The StarPO update (ragen_jax.algos.PPOConfig, whose docstring defines each field)."""
  ppo = ml_collections.ConfigDict()
  ppo.adv_estimator = "gae"            # gae (critic) | grpo | drgrpo | brpo | arpo
  ppo.gamma = 1.0                      # GAE discount
  ppo.lam = 1.0                        # GAE lambda
  ppo.clip_low = 0.2                   # ratio clip 1 - low
  ppo.clip_high = 0.28                 # ratio clip 1 + high (clip-higher)
  ppo.clip_c = 3.0                     # dual-clip constant
  ppo.agg_mode = "token-mean"          # loss aggregation (algos.losses.AGG_MODES)
  ppo.loss_scale_factor = config_dict.placeholder(float)  # Dr.GRPO divisor (None: length T)
  ppo.entropy_coeff = 0.001            # entropy bonus weight
  ppo.use_kl_loss = False              # KL-to-reference loss
  ppo.kl_coef = 0.0                    # its weight
  ppo.kl_type = "k1"                   # k1 | k2 | k3 | abs ... (algos.losses.KL_KINDS)
  ppo.ppo_epochs = 1                   # passes over the batch per step
  ppo.num_minibatches = 4              # optimizer steps per epoch (RAGEN: 128 / 32)
  ppo.micro_batches = 1                # gradient-accumulation chunks per minibatch
  ppo.shuffle = True                   # reshuffle minibatches every epoch
  ppo.actor_lr = 1e-6                  # AdamW learning rates (RAGEN's, for 0.5B-7B models)
  ppo.critic_lr = 1e-5
  ppo.weight_decay = 0.01              # AdamW decoupled weight decay
  ppo.grad_clip = 1.0                  # global-norm clip
  ppo.value_clip = 0.5                 # critic value clip
  ppo.critic = "separate"              # separate (RAGEN) | shared (value head on the actor)
  ppo.vf_coef = 1.0                    # value-loss weight of the shared critic
  ppo.recompute_old_logprobs = True    # old log-probs from the actor (veRL) vs the sampler
  ppo.positive_advantages_only = False  # zero negative advantages: nothing pushed down (not RAGEN)
  ppo.filter_strategy = "top_p"        # StarPO-S rollout filter (algos.filtering.STRATEGIES)
  ppo.filter_value = 1.0               # 1.0 with top_p keeps everything (RAGEN default)
  ppo.filter_metric = "reward_variance"  # reward_variance | reward | reward_sum
  ppo.filter_type = "largest"          # keep the largest | smallest groups
  ppo.filter_include_zero = True       # groups of zero variance may be kept
  ppo.filter_prob_mode = "linear"      # linear | softmax (top_p mass)
  ppo.filter_eps = 0.01                # SNR-adaptive threshold epsilon
  ppo.vocab_chunk = 8192               # vocabulary chunk of the log-prob pass
  ppo.update(overrides)
  return ppo


def sft_section(**overrides) -> ml_collections.ConfigDict:
  """Warm start by supervised fine-tuning on expert demonstrations (ragen_jax.train.sft)."""
  sft = ml_collections.ConfigDict()
  sft.steps = 0                        # optimizer steps (0 = no warm start)
  sft.batch_size = 16                  # demonstrations per step
  sft.lr = 1e-3                        # AdamW peak learning rate (warm-up, cosine decay)
  sft.warmup_steps = 20
  sft.weight_decay = 0.0
  sft.grad_clip = 1.0
  sft.random_prob = 0.25               # share of demonstrated actions replaced by random ones
  sft.undo_prob = 0.0                  # share of two-action replies taking back their first move
  sft.seed = 1000000                   # first level seed of the demonstrations
  sft.pad_multiple = 128               # sequence padding multiple (fewer compiled shapes)
  sft.update(overrides)
  return sft


def trainer_section(**overrides) -> ml_collections.ConfigDict:
  trainer = ml_collections.ConfigDict()
  trainer.total_steps = 200            # training steps (RAGEN total_training_steps)
  trainer.eval_every = 10              # validation every N steps, and at step 0 (RAGEN test_freq)
  trainer.save_every = 10              # checkpoint every N steps (and at the end)
  trainer.keep_checkpoints = 3         # newest checkpoints kept
  trainer.sample_trajectories = 3      # validation trajectories logged as text per evaluation
  trainer.pad_multiple = 256           # training sequences padded to a multiple of this, so
                                       # the train step compiles once per length bucket
  trainer.update(overrides)
  return trainer


def diagnostics_section(**overrides) -> ml_collections.ConfigDict:
  """RAGEN-2's collapse diagnostics (ragen_jax.diagnostics): the MI family of proxies."""
  diag = ml_collections.ConfigDict()
  diag.compute_freq = 5                # MI family at step 1 and every N steps (0 = off)
  diag.num_samples = 64                # first-turn (prompt, reasoning) pairs per computation
  diag.multi_turn_samples = 32         # multi-turn draws, each its own column (cost ~ N^2);
                                       # CPU: RAGEN 64 (tiny model: 7 s vs ~30 s per computation)
  diag.micro_batch = 64                # pairs scored per jitted call (memory knob)
  diag.update(overrides)
  return diag


def early_stop_section(**overrides) -> ml_collections.ConfigDict:
  """RAGEN's stopping rules (ragen_jax.train.early_stop); each mode: stop | warn | off."""
  stop = ml_collections.ConfigDict()
  stop.reward_std_collapse = "stop"    # in-group reward std collapses against its baseline
  stop.reward_std_baseline_steps = 10  # baseline = mean std over the first N updating steps
  stop.reward_std_patience = 10        # fires after N consecutive steps below the ratio
  stop.reward_std_ratio = 0.1          # "collapsed" = below this share of the baseline
  stop.low_val_success = "stop"        # a tag's validation success stays near zero
  stop.low_val_threshold = 0.01        # "near zero"
  stop.low_val_patience = 5            # consecutive validations (step 0's included)
  stop.empty_filter = "stop"           # rollout filtering keeps nothing, step after step
  stop.empty_filter_patience = 5       # consecutive skipped steps (RAGEN: 5)
  stop.update(overrides)
  return stop


def mesh_section(**overrides) -> ml_collections.ConfigDict:
  """The device mesh (ragen_jax.sharding): sizes of its three axes and the logical-axis rules."""
  mesh = ml_collections.ConfigDict()
  mesh.data = -1                       # pure data parallelism (-1: every device fsdp x tensor
                                       # leave; one CPU gives a 1 x 1 x 1 mesh)
  mesh.fsdp = 1                        # data parallelism that also splits parameters and
                                       # optimizer states
  mesh.tensor = 1                      # query/key-value heads, MLP and vocabulary split
  # Logical axis -> mesh axes ("a,b"; "" = replicated). Parameters, optimizer states, the KV
  # cache and batches carry these names.
  mesh.rules = ml_collections.ConfigDict({
      "batch": "data,fsdp",            # episodes of a batch
      "length": "",                    # sequence / cache positions
      "layers": "",                    # the stacked-layer axis
      "embed": "fsdp",                 # hidden size (FSDP splits parameters along it)
      "heads": "tensor",               # query heads
      "kv_heads": "tensor",            # key/value heads (and the KV cache)
      "head_dim": "",
      "mlp": "tensor",                 # MLP hidden size
      "vocab": "tensor",               # vocabulary rows of embedding and head
  })
  mesh.update(overrides)
  return mesh


def seed_section() -> ml_collections.ConfigDict:
  seed = ml_collections.ConfigDict()
  seed.train = 10000                   # first training level seed (advances by groups per step)
  seed.val = 123                       # first validation level seed
  seed.init = 0                        # model init, sampling and shuffling keys
  return seed


_QWEN = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")
# Accelerator variants (`:qwen2.5-3b-h100`): the mesh, and what makes the update fit the card's
# memory (model.remat, ppo.micro_batches, a critic sharing the actor's trunk for 3B); the run
# prints its memory estimate at start (ragen_jax/train/memory.py).
HARDWARE = {
    "h100": dict(devices=1, memory_gib=80),    # one H100 80 GB
    "v5e8": dict(devices=8, memory_gib=16),    # TPU v5e-8: 8 chips x 16 GB, fsdp over all 8
}
VARIANTS = ("smoke", "debug", *_QWEN,
            *(f"{q}-{h}" for q in ("qwen2.5-0.5b", "qwen2.5-3b") for h in HARDWARE))


def apply_variant(config: ml_collections.ConfigDict, arg) -> ml_collections.ConfigDict:
  """Applies `configs/x.py:<arg>` (VARIANTS).

  smoke: seconds-scale sizes for tests and CI (the whole run well under 2 minutes on 2 cores).
  debug: like smoke, for quick manual runs of evaluation.
  qwen2.5-*: a real checkpoint (`--config.model.checkpoint=DIR`, required) with its own
    tokenizer, no warm start, RAGEN's learning rates and lengths.
  """
  if arg in ("smoke", "debug"):
    for env in config.envs.values():
      env.train_groups = 2
      env.val_groups = 4
    config.rollout.group_size = 2
    config.rollout.max_new_tokens = 24
    config.rollout.max_context = 768
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
    config.trainer.pad_multiple = 768    # one compiled train-step shape
    config.diagnostics.compute_freq = 2
    config.diagnostics.num_samples = 4
    config.diagnostics.multi_turn_samples = 4
  elif arg in VARIANTS and arg.startswith("qwen2.5-"):
    preset, _, hardware = arg.partition("b-")
    preset = preset + "b" if hardware else arg
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
    if hardware:
      _hardware_variant(config, preset, hardware)
  elif arg:
    raise ValueError(f"unknown config variant {arg!r}; valid: {', '.join(VARIANTS)}")
  return config


def _hardware_variant(config, preset: str, hardware: str) -> None:
  """Sizes for one H100 or a TPU v5e-8 (`HARDWARE`); chosen with the memory estimate."""
  config.model.remat = True            # a [U, 3600, D] residual per layer instead of all internals
  if hardware == "v5e8":
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 8, 1
  groups = sum(e.train_groups for e in config.envs.values())
  if preset == "qwen2.5-3b" and hardware == "h100":
    # 80 GB hold the 3B's ~46 GiB of fp32 weights and AdamW moments plus the KV cache of at most
    # 64 episodes x 3600 tokens (8.5 GiB): more groups (sokoban_ppo samples 8) take smaller ones.
    while groups * config.rollout.group_size > 64 and config.rollout.group_size > 1:
      config.rollout.group_size //= 2
  episodes = groups * config.rollout.group_size
  per_minibatch = episodes // config.ppo.num_minibatches
  config.ppo.micro_batches = max(1, per_minibatch // 8)   # 8 sequences per micro-batch
  if preset == "qwen2.5-3b":
    # fp32 parameters + AdamW moments of a 3B actor take ~50 GB; a second, separate 3B critic
    # would not fit 80 GB (or 8 x 16 GB): the value head shares the actor's trunk instead.
    config.ppo.critic = "shared"
    config.ppo.vf_coef = 0.1


def check_overrides(config: ml_collections.ConfigDict, argv) -> None:
  """Raises ValueError for a `--config.a.b=...` flag naming no key, listing the valid keys.

  Run before absl parses the flags, whose own error for a typo is a traceback.
  """
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config."):].split("=", 1)[0].split(".")
    node, seen = config, []
    for part in path:
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        where = ".".join(seen) or "the config"
        valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ValueError(f"unknown config key {'.'.join(path)!r}: {where} has no {part!r}; "
                         f"valid keys there: {', '.join(valid) or '(none: a value)'}")
      node, seen = node[part], seen + [part]

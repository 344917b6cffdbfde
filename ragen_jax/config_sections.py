"""Config sections every experiment in `configs/` shares: model, rollout, seed, variants.

Each `configs/<env>_*.py` defines its own `env` section and the few rollout values that differ
per environment, then builds the rest here, so a default lives in one place and every knob is
still defined (and commented) before `--config.section.key=value` overrides are applied.
"""
import ml_collections


def model_section() -> ml_collections.ConfigDict:
  model = ml_collections.ConfigDict()
  model.preset = "tiny"                # ragen_jax.models.PRESETS name (no checkpoint)
  model.tokenizer = "sentencepiece"    # used without a checkpoint or its tokenizer.json
  model.dtype = "float32"              # activation / parameter dtype
  return model


def rollout_section(*, max_turns: int, max_actions_per_turn: int, max_new_tokens: int,
                    val_env_groups: int, val_group_size: int) -> ml_collections.ConfigDict:
  """RAGEN's agent-loop defaults; the keyword arguments are the per-environment ones."""
  rollout = ml_collections.ConfigDict()
  rollout.env_groups = 8               # groups per batch; a group shares a start state
  rollout.group_size = 16              # episodes per group
  rollout.max_turns = max_turns        # agent turns per episode
  rollout.max_actions_per_turn = max_actions_per_turn  # answer words kept per turn
  rollout.action_sep = "||"            # separator between actions in <answer>
  rollout.format_penalty = -0.1        # per turn with a missing tag / bad or no action
  rollout.enable_think = True          # <think>..</think><answer>..</answer> format
  rollout.max_new_tokens = max_new_tokens  # sampled tokens per turn (RAGEN response_length)
  rollout.max_context = 3600           # tokens per conversation (RAGEN max_model_len)
  rollout.max_turn_tokens = 512        # longest appended user turn (KV cache slack)
  rollout.temperature = 1.0            # training rollout temperature
  rollout.top_p = 1.0                  # nucleus mass (1 = off)
  rollout.top_k = 0                    # top-k (0 = off)
  rollout.use_turn_scores = False      # also place each turn's reward on its last token
  rollout.val_env_groups = val_env_groups  # validation groups (seeds seed.val + g)
  rollout.val_group_size = val_group_size  # validation episodes per group (pass@k, k = this)
  rollout.val_temperature = 0.5        # RAGEN's evaluation temperature
  return rollout


def seed_section() -> ml_collections.ConfigDict:
  seed = ml_collections.ConfigDict()
  seed.train = 10000                   # first training level seed
  seed.val = 123                       # first validation level seed
  seed.init = 0                        # model init and sampling key
  return seed


def apply_variant(config: ml_collections.ConfigDict, arg) -> ml_collections.ConfigDict:
  """Applies `configs/x.py:<arg>`; "debug" shrinks every size for a quick local run."""
  if arg == "debug":
    config.rollout.env_groups = 2
    config.rollout.group_size = 2
    config.rollout.max_new_tokens = 16
    config.rollout.max_context = 1024
    config.rollout.max_turns = min(config.rollout.max_turns, 3)
    config.rollout.val_env_groups = 4
    config.rollout.val_group_size = 2
  elif arg:
    raise ValueError(f"unknown config arg {arg!r}; valid: debug")
  return config

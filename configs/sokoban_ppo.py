r"""Sokoban (RAGEN's CoordSokoban tag): 6x6 rooms, one box, grid + coordinates rendering.

Evaluate (no trainer needed; no --checkpoint = random tiny model):
  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py --checkpoint=DIR
  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py:debug   # seconds on a CPU
Override any knob: --config.rollout.val_env_groups=8.

Sections: env (what is played), model (policy preset and tokenizer), rollout (the agent loop
and sampling), seed. Other engineers extend this file with the PPO sections.
"""
import ml_collections


def get_config(arg=None):
  """Returns the config; arg "debug" shrinks every size for a quick local run."""
  config = ml_collections.ConfigDict()

  config.env = ml_collections.ConfigDict()
  config.env.name = "sokoban"                 # ragen_jax.envs registry name
  config.env.options = ml_collections.ConfigDict(dict(
      dim_room=(6, 6),                        # room rows, cols
      num_boxes=1,                            # boxes (= targets)
      max_steps=100,                          # env step limit (the action budget binds first)
      search_depth=40,                        # steps of each reverse walk in level generation
  ))
  config.env.render_format = "grid_coord"     # grid | coord | grid_coord (CoordSokoban)
  config.env.max_actions_per_traj = 10        # action budget of an episode
  config.env.max_tokens_hint = 120            # "Max response length: N words" in the prompt

  config.model = ml_collections.ConfigDict()
  config.model.preset = "tiny"                # ragen_jax.models.PRESETS name (no checkpoint)
  config.model.tokenizer = "sentencepiece"    # used without a checkpoint or its tokenizer.json
  config.model.dtype = "float32"              # activation / parameter dtype

  config.rollout = ml_collections.ConfigDict()
  config.rollout.env_groups = 8               # groups per batch; a group shares a start state
  config.rollout.group_size = 16              # episodes per group
  config.rollout.max_turns = 5                # agent turns per episode
  config.rollout.max_actions_per_turn = 2     # answer words kept per turn
  config.rollout.action_sep = "||"            # separator between actions in <answer>
  config.rollout.format_penalty = -0.1        # per turn with a missing tag / bad or no action
  config.rollout.enable_think = True          # <think>..</think><answer>..</answer> format
  config.rollout.max_new_tokens = 400         # sampled tokens per turn (RAGEN response_length)
  config.rollout.max_context = 3600           # tokens per conversation (RAGEN max_model_len)
  config.rollout.max_turn_tokens = 512        # longest appended user turn (KV cache slack)
  config.rollout.temperature = 1.0            # training rollout temperature
  config.rollout.top_p = 1.0                  # nucleus mass (1 = off)
  config.rollout.top_k = 0                    # top-k (0 = off)
  config.rollout.use_turn_scores = False      # also place each turn's reward on its last token
  config.rollout.val_env_groups = 32          # validation groups (seeds seed.val + g)
  config.rollout.val_group_size = 16          # validation episodes per group (pass@k, k = this)
  config.rollout.val_temperature = 0.5        # RAGEN's evaluation temperature

  config.seed = ml_collections.ConfigDict()
  config.seed.train = 10000                   # first training level seed
  config.seed.val = 123                       # first validation level seed
  config.seed.init = 0                        # model init and sampling key

  if arg == "debug":
    config.rollout.env_groups = 2
    config.rollout.group_size = 2
    config.rollout.max_new_tokens = 16
    config.rollout.max_context = 1024
    config.rollout.max_turns = 3
    config.rollout.val_env_groups = 4
    config.rollout.val_group_size = 2
  elif arg:
    raise ValueError(f"unknown config arg {arg!r}; valid: debug")
  return config

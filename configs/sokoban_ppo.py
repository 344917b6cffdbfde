r"""Sokoban (RAGEN's CoordSokoban tag): 6x6 rooms, one box, grid + coordinates rendering.

Evaluate (no trainer needed; no --checkpoint = random tiny model):
  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py --checkpoint=DIR
  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py:debug   # seconds on a CPU
Override any knob: --config.rollout.val_env_groups=8.

Sections: env (what is played), model (policy preset and tokenizer), rollout (the agent loop
and sampling), seed; the last three come from ragen_jax.config_sections.
"""
import ml_collections

from ragen_jax import config_sections


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

  config.model = config_sections.model_section()
  config.rollout = config_sections.rollout_section(
      max_turns=5, max_actions_per_turn=2, max_new_tokens=400,
      val_env_groups=32, val_group_size=16)
  config.seed = config_sections.seed_section()
  return config_sections.apply_variant(config, arg)

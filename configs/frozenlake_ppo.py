r"""FrozenLake (RAGEN's CoordFrozenLake as _3_frozen_lake.yaml runs it): 4x4, non-slippery.

Evaluate (no trainer needed; no --checkpoint = random tiny model):
  python -m ragen_jax.evaluate --config=configs/frozenlake_ppo.py --checkpoint=DIR
  python -m ragen_jax.evaluate --config=configs/frozenlake_ppo.py:debug   # seconds on a CPU
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
  config.env.name = "frozenlake"              # ragen_jax.envs registry name
  config.env.options = ml_collections.ConfigDict(dict(
      size=4,                                 # board side
      p=0.9,                                  # probability that a tile is frozen (not a hole)
      is_slippery=True,                       # slippery moves ...
      success_rate=1.0,                       # ... that go the intended way with this prob.
      max_steps=100,                          # env step limit (the action budget binds first)
  ))
  config.env.render_format = "grid_coord"     # grid | coord | grid_coord (CoordFrozenLake)
  config.env.max_actions_per_traj = 10        # action budget of an episode
  config.env.max_tokens_hint = 120            # "Max response length: N words" in the prompt

  config.model = config_sections.model_section()
  config.rollout = config_sections.rollout_section(
      max_turns=5, max_actions_per_turn=2, max_new_tokens=400,
      val_env_groups=32, val_group_size=16)
  config.seed = config_sections.seed_section()
  return config_sections.apply_variant(config, arg)

r"""Bandit (RAGEN's _1_bandit.yaml): one turn, one pull of two named arms.

Evaluate (no trainer needed; no --checkpoint = random tiny model):
  python -m ragen_jax.evaluate --config=configs/bandit_ppo.py --checkpoint=DIR
  python -m ragen_jax.evaluate --config=configs/bandit_ppo.py:debug   # seconds on a CPU
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
  config.env.name = "bandit"                  # ragen_jax.envs registry name
  config.env.options = ml_collections.ConfigDict(dict(
      split="train",                          # arm-name pairs: train (Bandit) | test (BanditTest)
      lo_arm_score=0.1,                       # the low-risk arm always pays this
      hi_arm_hiscore=1.0,                     # the high-risk arm pays this ...
      hi_arm_hiscore_prob=0.25,               # ... with this probability
      hi_arm_loscore=0.0,                     # ... else this
  ))
  config.env.render_format = "grid"           # text observation (no grid to render)
  config.env.max_actions_per_traj = 1         # one pull per episode
  config.env.max_tokens_hint = 100            # "Max response length: N words" in the prompt

  config.model = config_sections.model_section()
  config.rollout = config_sections.rollout_section(
      max_turns=1, max_actions_per_turn=1, max_new_tokens=500,
      val_env_groups=256, val_group_size=1)
  config.seed = config_sections.seed_section()
  return config_sections.apply_variant(config, arg)

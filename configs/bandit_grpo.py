"""Bandit (two named arms, one pull; RAGEN's `_1_bandit`) with GRPO (critic-free, group-normalised).

  python launch.py --config=configs/bandit_grpo.py[:smoke|:qwen2.5-0.5b]

Tiny model warm-started on demonstrations that pick the high-risk arm 75% of the time (25%
random); RL should push the high-risk share (`val/success`) above 90%. Values marked "CPU:"
differ from RAGEN's for a 1M-parameter model on 2 cores.
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  config.envs.bandit = cs.bandit_env(train_groups=4, val_groups=64)  # CPU: RAGEN 8 / 256+256
  config.model = cs.model_section()
  config.rollout = cs.cpu_rollout_section(max_turns=1, max_actions_per_turn=1, max_new_tokens=32,
                                          max_context=512)  # CPU: one short turn
  config.ppo = cs.ppo_section(adv_estimator="grpo", actor_lr=1e-4,  # CPU: RAGEN 1e-6
                              num_minibatches=2)
  config.sft = cs.sft_section()          # steps=0: the shipped warm start is the SFT
  config.trainer = cs.trainer_section(total_steps=30, eval_every=5, save_every=10,
                                      pad_multiple=512)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

"""Mixed environments in one run (RAGEN's env tags with n_groups each): FrozenLake and Bandit
groups in every batch, PPO with a separate critic; metrics per tag (`train/<tag>/success`).

  python launch.py --config=configs/mixed_ppo.py[:smoke]
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  config.envs.frozenlake = cs.frozenlake_env(train_groups=2, val_groups=32)
  config.envs.bandit = cs.bandit_env(train_groups=2, val_groups=32)
  config.model = cs.model_section()
  config.rollout = cs.cpu_rollout_section()
  config.ppo = cs.ppo_section(adv_estimator="gae", actor_lr=1e-4, critic_lr=1e-4,
                              num_minibatches=2)
  config.sft = cs.sft_section()          # steps=0: the shipped warm start is the SFT
  config.trainer = cs.trainer_section(total_steps=40, eval_every=10, save_every=10)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

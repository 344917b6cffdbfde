"""FrozenLake (RAGEN's CoordFrozenLake: random 4x4 maps, slippery) with GRPO (critic-free, group-normalised).

  python launch.py --config=configs/frozenlake_grpo.py[:smoke|:qwen2.5-0.5b]

Tiny model warm-started on shortest-path demonstrations (25% random actions); values marked
"CPU:" differ from RAGEN's (shared/reference/ragen.md §3.4) for a 1M-parameter model on 2 cores.
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  config.envs.frozenlake = cs.frozenlake_env(train_groups=4, val_groups=64)  # CPU: RAGEN 8 / 512
  config.model = cs.model_section()
  config.rollout = cs.cpu_rollout_section()
  config.ppo = cs.ppo_section(adv_estimator="grpo", actor_lr=1e-4,  # CPU: RAGEN 1e-6
                              num_minibatches=2)
  config.sft = cs.sft_section()          # steps=0: the shipped warm start is the SFT
  config.trainer = cs.trainer_section(total_steps=40, eval_every=10, save_every=10)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

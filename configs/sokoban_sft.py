"""Only the fine-tuning, for Sokoban alone: supervised fine-tuning of the tiny model from scratch
on breadth-first-solver demonstrations (25% random actions), then one validation (step 0) and a
checkpoint. (configs/warm_start_sft.py does the same on all three environments; its result is
the shipped warm start the RL configs begin from.)

  python launch.py --config=configs/sokoban_sft.py [--config.sft.steps=200]
  python -m ragen_jax.export --checkpoint=runs/sokoban_sft --out=/tmp/sokoban_sft_hf
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  config.envs.sokoban = cs.sokoban_env(train_groups=4, val_groups=64)
  config.model = cs.model_section()
  config.model.warm_start = False        # from scratch
  config.rollout = cs.cpu_rollout_section()
  config.ppo = cs.ppo_section(adv_estimator="grpo", num_minibatches=2)  # unused: no RL steps
  config.sft = cs.sft_section(steps=300, lr=2e-3, warmup_steps=30)
  config.trainer = cs.trainer_section(total_steps=0)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

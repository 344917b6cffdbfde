"""The shipped warm start: supervised fine-tuning of the tiny model on expert demonstrations of
all three environments (Sokoban breadth-first solver, FrozenLake shortest paths, the Bandit's
high-risk arm), 25% of the demonstrated actions replaced by random ones. Each round of the mix
has 4 Sokoban, 2 FrozenLake and 2 Bandit batches: Sokoban needs the most steps to rise above
chance (BENCHMARKS.md, "Does the policy plan?").

  python launch.py --config=configs/warm_start_sft.py --workdir=runs/warm_start
  python -m ragen_jax.export --checkpoint=runs/warm_start --out=ragen_jax/assets/tiny_warm_start

This is how `ragen_jax/assets/tiny_warm_start` (the starting point of every tiny RL config) was
made; BENCHMARKS.md records the run. Step 0's validation is the fine-tuned policy's success.
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  # SFT plays train_groups x group_size levels per demonstration batch, one episode each.
  config.envs.sokoban = cs.sokoban_env(train_groups=4, val_groups=64, sft_batches=4)
  config.envs.frozenlake = cs.frozenlake_env(train_groups=4, val_groups=64, sft_batches=2)
  config.envs.bandit = cs.bandit_env(train_groups=4, val_groups=64, sft_batches=2)
  config.model = cs.model_section()
  config.model.warm_start = False        # from scratch: this run makes the warm start
  config.rollout = cs.cpu_rollout_section()
  config.ppo = cs.ppo_section(adv_estimator="grpo", num_minibatches=2)  # unused: no RL steps
  # 1200 steps: 600 Sokoban, 300 FrozenLake, 300 Bandit batches (54 min on 2 CPU cores).
  config.sft = cs.sft_section(steps=1200, batch_size=16, lr=2e-3, warmup_steps=30)
  config.trainer = cs.trainer_section(total_steps=0)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

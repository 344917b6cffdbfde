"""Sokoban with GRPO (critic-free, group-normalised outcome advantages); else as sokoban_ppo.

python launch.py --config=configs/sokoban_grpo.py[:smoke|:qwen2.5-0.5b]
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(sokoban=cs.env("sokoban", train_groups=4, val_groups=64)),  # CPU: RAGEN 8 / 512
      ppo=dict(adv_estimator="grpo", actor_lr=1e-4, num_minibatches=2),  # CPU: RAGEN 1e-6
      trainer=dict(total_steps=40, eval_every=10, save_every=10),
  )

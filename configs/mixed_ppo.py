"""Mixed environments in one run (RAGEN's env tags with n_groups each): FrozenLake and Bandit
groups in every batch, PPO with a separate critic; metrics per tag (`train/<tag>/success`).

  python launch.py --config=configs/mixed_ppo.py[:smoke]
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(
          frozenlake=cs.env("frozenlake", train_groups=2, val_groups=32),
          bandit=cs.env("bandit", train_groups=2, val_groups=32),
      ),
      ppo=dict(adv_estimator="gae", actor_lr=1e-4, critic_lr=1e-4, num_minibatches=2),
      trainer=dict(total_steps=40, eval_every=10, save_every=10),
  )

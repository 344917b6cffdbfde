"""FrozenLake (RAGEN's CoordFrozenLake: random 4x4 maps, slippery) with PPO
(GAE + a separate critic).

  python launch.py --config=configs/frozenlake_ppo.py[:smoke|:qwen2.5-0.5b]

Tiny model warm-started on shortest-path demonstrations (25% random actions); values marked
"CPU:" differ from RAGEN's (shared/reference/ragen.md §3.4) for a 1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: RAGEN 8 / 512 groups
      envs=dict(frozenlake=cs.env("frozenlake", train_groups=4, val_groups=64)),
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=1e-4,  # CPU: RAGEN 1e-6 / 1e-5
          num_minibatches=2,
      ),
      trainer=dict(total_steps=40, eval_every=10, save_every=10),
  )

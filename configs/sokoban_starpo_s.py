"""StarPO-S on Sokoban: rollout filtering (keep the 25% of groups with the highest reward
variance, RAGEN v1's top-p 0.25), no KL, clip-higher 0.2 / 0.28, PPO with critic.

  python launch.py --config=configs/sokoban_starpo_s.py[:smoke|:qwen2.5-0.5b]
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(sokoban=cs.env("sokoban", train_groups=8, val_groups=64)),  # CPU: RAGEN 8 / 512
      rollout=dict(group_size=4),  # CPU: 8 groups of 4 to filter
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=1e-4,  # CPU: RAGEN 1e-6 / 1e-5
          num_minibatches=2,
          filter_strategy="top_k",  # keep a fixed share of groups ...
          filter_value=0.25,  # ... the top 25% by in-group reward variance
          filter_metric="reward_variance",
          filter_include_zero=False,
          use_kl_loss=False,
          kl_coef=0.0,
          clip_low=0.2,
          clip_high=0.28,
      ),
      trainer=dict(total_steps=40, eval_every=10, save_every=10),
  )

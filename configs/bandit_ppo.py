"""Bandit (two named arms, one pull; RAGEN's `_1_bandit`) with PPO (GAE + a separate critic).

  python launch.py --config=configs/bandit_ppo.py[:smoke|:qwen2.5-0.5b]

Tiny model warm-started on demonstrations that pick the high-risk arm 75% of the time (25%
random); RL should push the high-risk share (`val/success`) above 90%. Values marked "CPU:"
differ from RAGEN's for a 1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(bandit=cs.env("bandit", train_groups=4, val_groups=64)),  # CPU: RAGEN 8 / 256+256
      rollout=dict(
          max_turns=1, max_actions_per_turn=1, max_new_tokens=32, max_context=512
      ),  # CPU: one short turn
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=1e-4,  # CPU: RAGEN 1e-6 / 1e-5
          num_minibatches=2,
      ),
      trainer=dict(total_steps=30, eval_every=5, save_every=10, pad_multiple=512),
  )

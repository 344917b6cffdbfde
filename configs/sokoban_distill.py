r"""Sokoban with on-policy distillation: a format-only student, the shipped warm start as teacher.

  python launch.py --config=configs/sokoban_distill.py --workdir=runs/distill     # RL + distill
  python launch.py --config=configs/sokoban_distill.py --workdir=runs/rl_alone \
      --config.ppo.distill_coef=0            # RL alone (the teacher only measures the KL)
  python launch.py --config=configs/sokoban_distill.py --workdir=runs/distill_only \
      --config.ppo.adv_estimator=grpo --config.rollout.format_penalty=0 \
      --config.envs.sokoban.options.step_reward=0 \
      --config.envs.sokoban.options.box_on_target_reward=0 \
      --config.envs.sokoban.options.solved_reward=0          # distillation alone
  python launch.py --config=configs/sokoban_distill.py:smoke   # seconds-scale, for tests

The student starts from random weights fine-tuned on format-correct replies whose actions are
uniformly random (it answers in RAGEN's format and knows nothing of Sokoban); the teacher is the
shipped warm start (ragen_jax/assets/tiny_warm_start: the same tiny architecture and tokenizer,
fine-tuned on solver demonstrations: configs/warm_start_sft.py). Each token the student samples
gets the dense advantage −coef·(log π_student − log π_teacher) beside GAE's (algos/distill.py).
"Distillation alone" zeroes every environment reward, so GRPO's group-normalised advantage is 0
and the teacher's term is all that trains (validation still counts solved levels).
The prompt, levels and PPO settings are the default run's (configs/sokoban_ppo.py) with no
rollout filter (the filter ranks groups by reward spread, which says nothing of the teacher's
signal). Study and results: docs/experiments/distillation.md.
"""

import os

from ragen_jax.config import sections as cs

TEACHER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "ragen_jax",
    "assets",
    "tiny_warm_start",
)


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: 8 groups x 8 episodes per step, 64 validation levels (RAGEN 8 x 16, 512).
      envs=dict(sokoban=cs.env("sokoban", train_groups=8, val_groups=64)),
      model=dict(warm_start=False),  # random weights, then the format-only fine-tuning below
      sft=dict(steps=60, lr=2e-3, random_prob=1.0),  # uniformly random actions: format only
      # CPU: learning rates for a 1M-parameter model (RAGEN's are for 0.5B-7B).
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=5e-4,
          num_minibatches=4,
          filter_value=1.0,
          distill_teacher=TEACHER,
          distill_coef=1.0,
      ),
      trainer=dict(total_steps=12, eval_every=4, save_every=4),
  )

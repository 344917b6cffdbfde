"""Countdown (TinyZero's numbers game, RAGEN's `_4_countdown`: reach the target with each number
once; reward 1 right, 0.1 for the right numbers with a wrong value, else 0; one turn) with GRPO.

  python launch.py --config=configs/countdown_grpo.py[:smoke]
  python launch.py --config=configs/countdown_grpo.py --config.envs.countdown.options.num_numbers=4

Levels come from the seed (no data download; ragen_jax/envs/text/countdown.py). The tiny model
starts from the shipped warm start, then fine-tunes on the environment's expert (an exhaustive
search of expressions) before RL. Values marked "CPU:" differ from RAGEN's for a 1M-parameter model
on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: RAGEN 8 / 256 groups
      envs=dict(countdown=cs.env("countdown", train_groups=8, val_groups=64)),
      rollout=dict(max_turns=1, max_actions_per_turn=1, max_new_tokens=64),  # one expression
      ppo=dict(adv_estimator="grpo", actor_lr=1e-4, num_minibatches=2),  # CPU: RAGEN 1e-6
      sft=dict(steps=200, batch_size=16, lr=1e-3, warmup_steps=20),  # CPU: the expert's answers
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

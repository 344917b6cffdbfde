"""RAGEN's text environments in one run: Countdown, math with retries and 4x4 Sudoku as three
tags of one batch (each tag's metrics under train/<tag>/ and val/<tag>/), with PPO.

  python launch.py --config=configs/text_mix_ppo.py[:smoke]

Each tag keeps its own action budget; the rollout allows the most turns any of them needs
(math's three attempts, Sudoku's placements), and a single-turn game simply ends after its
first. The tiny model starts from the shipped warm start and fine-tunes on the three experts
before RL. Values marked "CPU:" differ from RAGEN's for a 1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(  # CPU: RAGEN 8 / 256 groups each
          countdown=cs.env("countdown", train_groups=4, val_groups=32),
          math=cs.env("math", train_groups=4, val_groups=32),
          # Two placements a turn: the solver's replies then fit 64 tokens. RAGEN's rewards: 1.0
          # for completing the board, 0.0 otherwise (ragen_jax/envs/text/sudoku.py).
          sudoku=cs.env(
              "sudoku",
              train_groups=4,
              val_groups=32,
              options=dict(max_actions_per_turn=2, reward_scheme="ragen"),
          ),
      ),
      # CPU: RAGEN 3600 tokens; a 4x4 board with its hints is ~200 tokens a turn here.
      rollout=dict(
          max_turns=5,
          max_actions_per_turn=3,
          max_new_tokens=64,
          max_context=2048,
          max_turn_tokens=384,
      ),
      # CPU: RAGEN 1e-6 / 1e-5; micro-batches of 12 episodes keep Sudoku's long conversations
      # within a 24 GB machine.
      ppo=dict(actor_lr=1e-4, critic_lr=1e-4, num_minibatches=2, micro_batches=4),
      sft=dict(steps=300, batch_size=16, lr=1e-3, warmup_steps=20),  # CPU: the experts' answers
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

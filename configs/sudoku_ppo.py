"""Sudoku (RAGEN's `_8_sudoku`: place numbers by free-text actions) with PPO, on 4x4 boards,
under RAGEN's rewards: 1.0 for the placement that completes the board, 0.0 for every other step
(`reward_scheme="ragen"`). `--config.envs.sudoku.options.reward_scheme=dense` plays this
repository's shaping instead: +1 per correct placement, -0.1 for any other answer, +10 on
completion (ragen_jax/envs/text/sudoku.py).

  python launch.py --config=configs/sudoku_ppo.py[:smoke]
  python launch.py --config=configs/sudoku_ppo.py --config.envs.sudoku.options.size=9

Boards come from the seed with a unique solution (ragen_jax/envs/text/sudoku.py). The tiny model
starts from the shipped warm start, then fine-tunes on the environment's expert (a constraint
solver's placements) before RL. Values marked "CPU:" differ from RAGEN's for a 1M-parameter
model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(
          sudoku=cs.env(
              "sudoku",
              train_groups=8,
              val_groups=64,
              options=dict(max_actions_per_turn=2, reward_scheme="ragen"),
          )
      ),  # CPU: RAGEN 8 / 256
      # CPU: RAGEN 3600 tokens; a 4x4 board with its hints is ~200 tokens a turn here.
      rollout=dict(
          max_turns=5,
          max_actions_per_turn=3,
          max_new_tokens=64,
          max_context=2048,
          max_turn_tokens=384,
      ),
      # CPU: RAGEN 1e-6 / 1e-5; 8 episodes per micro-batch keep five turns of boards (sequences
      # of ~2,000 tokens) within a 24 GB machine (one micro-batch of 32 needed over 32 GB).
      ppo=dict(actor_lr=1e-4, critic_lr=1e-4, num_minibatches=2, micro_batches=4),
      sft=dict(steps=200, batch_size=16, lr=1e-3, warmup_steps=20),  # CPU: the solver's moves
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

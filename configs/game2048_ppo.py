"""2048 (RAGEN's `_9_2048`: a 4x4 board, one move a turn, the merged tiles' log reward) with PPO
(GAE + a separate critic).

  python launch.py --config=configs/game2048_ppo.py[:smoke]

RAGEN plays up to 700 moves an episode in an 8192-token context, showing the model only the last
5 turns (`max_context_window: 5`). This config has no such window: every turn stays in the
context, so on a CPU an episode is 8 moves (one a turn, about 200 tokens each) in 2048 tokens.
RAGEN's success (the game over with a tile of 2048) is then out of reach; the return and the
largest tile (`train/game2048/max_tile`, `val/game2048/max_tile`) show progress. An unchanging
move costs `invalid_penalty` (-0.1), which RAGEN's log reward turns into 0
(ragen_jax/envs/device/game2048.py). The tiny model starts from the shipped warm start, then
fine-tunes on the environment's expert (one move and new tile of lookahead, keeping the tiles
ordered from a corner) before RL. Values marked "CPU:" differ from RAGEN's for a 1M-parameter
model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: 4 groups / 32 validation games; 8 moves an episode (RAGEN 700).
      envs=dict(game2048=cs.env("2048", train_groups=4, val_groups=32, max_actions_per_traj=8)),
      # RAGEN: one action a turn. CPU: 8 turns in 2048 tokens (RAGEN 700-800 turns, a window
      # of 5, 8192 tokens).
      rollout=dict(max_turns=8, max_actions_per_turn=1, max_context=2048, max_turn_tokens=256),
      # CPU: RAGEN 1e-6 / 1e-5.
      ppo=dict(adv_estimator="gae", actor_lr=1e-4, critic_lr=1e-4, num_minibatches=2),
      sft=dict(steps=100, batch_size=16, lr=1e-3, warmup_steps=10),  # CPU: the expert's moves
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

"""2048 (RAGEN's `_9_2048`: a 4x4 board, one move a turn, the merged tiles' log reward) with PPO
(GAE + a separate critic) under RAGEN's context window of 5 turns.

  python launch.py --config=configs/game2048_ppo.py[:smoke]      # last 5 turns, 16 moves
  python launch.py --config=configs/game2048_ppo.py:full          # whole history, 8 moves

RAGEN plays up to 700 moves an episode in an 8192-token context, showing the model only the last
5 turns (`max_context_window: 5`). Here each turn's prompt holds the system message, the last 5
turns and the board (`rollout.context_window=last_k`, about 1,300 tokens), each turn trains as
its own row, and the KV cache is that of 6 turns however long the game: CPU: 16 moves an episode
(RAGEN 700), as the update's rows, not the context, are what the CPU pays for (16 rows of up to
1,536 tokens an episode). `:full` keeps every turn in one sequence instead, which fits 8 moves in
2048 tokens: the comparison at the same budget.
RAGEN's success (the game over with a tile of 2048) is out of reach in so few moves; the return
and the largest tile (`train/game2048/max_tile`, `val/game2048/max_tile`) show progress. An
unchanging move costs `invalid_penalty` (-0.1), which RAGEN's log reward turns into 0
(ragen_jax/envs/device/game2048.py). The tiny model starts from the shipped warm start, then
fine-tunes on the environment's expert (one move and new tile of lookahead, keeping the tiles
ordered from a corner) before RL. Values marked "CPU:" differ from RAGEN's for a 1M-parameter
model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  items = [x for x in (arg or "").split(",") if x]
  full = "full" in items  # the whole history in one sequence, as RAGEN's "full" mode
  arg = ",".join(x for x in items if x != "full") or None
  moves = 8 if full else 16  # CPU: RAGEN 700
  # RAGEN's window: the last 5 turns (~190 tokens each), the system message and the board.
  window = dict(max_context=1536, context_window="last_k", window_turns=5)
  micro_batches = 8  # a row per turn: 8x the rows of full context in micro-batches as small
  if full:
    window, micro_batches = dict(max_context=2048, context_window="full"), 1
  return cs.experiment(
      arg,
      # CPU: 4 groups / 32 validation games.
      envs=dict(game2048=cs.env("2048", train_groups=4, val_groups=32, max_actions_per_traj=moves)),
      # RAGEN: one action a turn.
      rollout=dict(max_turns=moves, max_actions_per_turn=1, max_turn_tokens=256, **window),
      # CPU: RAGEN 1e-6 / 1e-5.
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=1e-4,
          num_minibatches=2,
          micro_batches=micro_batches,
      ),
      sft=dict(steps=100, batch_size=16, lr=1e-3, warmup_steps=10),  # CPU: the expert's moves
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

"""Memory and time per turn against the number of turns: full context against a window, one run.

    python -m experiments.bench.context_window [--turns 4,8,16,32] [--window 5] [--episodes 8]
        [--new_tokens 24]

2048 (about 190 tokens a turn) played by the tiny model with random weights, which never stops
early: every turn samples `--new_tokens` tokens and no game ends, so each episode plays exactly
the number of turns asked. For each number of turns n, full context (`max_context` sized to hold
n turns) and `last_k` with k = `--window` (sized to hold k + 1) each play one rollout to compile,
then one on new levels that is timed. Printed per n and mode:
  * seconds a turn of the timed rollout (prefill, decode, environment and host work);
  * the KV cache the engine allocates (MiB; `RolloutConfig.cache_slots` slots a row);
  * the training batch it yields (rows x columns) and its tokens;
and the window's ratios to full context at the same n. Full context needs a cache and a row
that grow with n; a window's stay those of k + 1 turns, while its training tokens grow with n
(each turn is a row holding its window).
"""

import argparse
import time

import jax
import numpy as np

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers

SYSTEM, PER_TURN = 400, 200  # tokens: 2048's system prompt and one turn (observation + reply)


def play(model, tok, n, window, args):
  """(seconds a turn, cache MiB, rows x columns, training tokens) of one timed rollout."""
  shown = n if window is None else window + 1
  context = -(-(SYSTEM + shown * PER_TURN + args.new_tokens) // 256) * 256
  cfg = rollout.RolloutConfig(
      env_groups=args.episodes // 2,
      group_size=2,
      max_turns=n,
      max_actions_per_turn=1,
      max_actions_per_traj=n,
      max_new_tokens=args.new_tokens,
      max_context=context,
      max_turn_tokens=256,
      context_window="full" if window is None else "last_k",
      window_turns=window,
  )
  engine = rollout.Rollout(envs.make("2048"), tok, cfg)
  engine.run(rollout.ModelPolicy(model), jax.random.key(0), seed=1)  # compiles
  tic = time.perf_counter()
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(1), seed=1000)
  seconds = time.perf_counter() - tic
  turns = result.metrics["num_turns"]
  if not np.all(turns == n):
    raise RuntimeError(f"episodes played {sorted(set(turns.tolist()))} turns, not {n}")
  c = model.config
  cache = c.num_layers * args.episodes * engine.capacity * c.num_kv_heads * c.head_dim * 2
  cache_mib = cache * np.dtype(c.dtype).itemsize / 2**20
  rows, cols = result.batch.tokens_BxT.shape
  tokens = int(np.asarray(result.batch.attention_mask_BxT).sum())
  return seconds / n, cache_mib, (rows, cols), tokens


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--turns", default="4,8,16,32")
  parser.add_argument("--window", type=int, default=5)
  parser.add_argument("--episodes", type=int, default=8)
  parser.add_argument("--new_tokens", type=int, default=24)
  args = parser.parse_args()
  tok = tokenizers.load("sentencepiece")
  model = models.create("tiny", jax.random.key(0))
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; 2048, {args.episodes} episodes, "
      f"{args.new_tokens} tokens a reply, window k={args.window}"
  )
  print("turns | mode   | s/turn | cache MiB | batch rows x cols | batch tokens")
  for n in [int(x) for x in args.turns.split(",")]:
    full = play(model, tok, n, None, args)
    win = play(model, tok, n, args.window, args)
    for name, (per_turn, mib, shape, tokens) in (("full", full), (f"last_{args.window}", win)):
      print(
          f"{n:5d} | {name:6s} | {per_turn:6.3f} | {mib:9.1f} | {shape[0]:5d} x {shape[1]:5d}"
          f"     | {tokens}"
      )
    print(
        f"      window/full: time a turn {win[0] / full[0]:.2f}x, cache {win[1] / full[1]:.2f}x, "
        f"row width {win[2][1] / full[2][1]:.2f}x, batch tokens {win[3] / full[3]:.2f}x"
    )


if __name__ == "__main__":
  main()

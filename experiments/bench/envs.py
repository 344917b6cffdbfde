"""Environment throughput: ragen_jax's jitted, vmapped Sokoban against gym-sokoban, one run.

Measures, for batch sizes 1..4096:
  * level generation (levels/s): `jit(env.reset_batch)` against gym-sokoban's
    `room_utils.generate_room` (the generator RAGEN copies), 6x6 with 1 box;
  * steps (steps/s): one `jit(vmap(env.step))` call per batch step (how the rollout engine steps
    every episode of a turn), and a `lax.scan` of 100 batched steps in one call, against
    gym-sokoban's step logic with image rendering left out (`_push`, `_calc_reward`,
    `_check_if_done`, which is all its `step` does besides drawing a frame).

The peer lives in the benchmark's own environment:
  python -m venv /tmp/benchenv && /tmp/benchenv/bin/pip install -e . gym-sokoban==0.0.6
  /tmp/benchenv/bin/python experiments/bench/envs.py
FrozenLake and Bandit are timed too (ours only: their peers are trivial Python).

With --render: host rendering instead, renders/s of freshly reset host states in each format,
one `env.render` call per row against one `env.render_batch` call for the whole batch (what the
rollout makes each turn).
"""

import argparse
import random
import time

import jax
import numpy as np

from ragen_jax import envs


def _best_rate(fn, work, repeats=3, min_seconds=0.5):
  """Work items per second: best of `repeats` timings, each looping for >= min_seconds."""
  fn()  # Compile / warm up.
  best = 0.0
  for _ in range(repeats):
    count, start = 0, time.perf_counter()
    while True:
      fn()
      count += 1
      elapsed = time.perf_counter() - start
      if elapsed >= min_seconds:
        break
    best = max(best, work * count / elapsed)
  return best


def ours(env, batch, scan_steps=100):
  keys = jax.random.split(jax.random.PRNGKey(0), batch)
  reset = jax.jit(env.reset_batch)
  gen_rate = _best_rate(lambda: jax.block_until_ready(reset(keys)), batch)
  states = reset(keys)
  actions = jax.random.randint(jax.random.PRNGKey(1), (scan_steps, batch), 0, env.num_actions)
  step = jax.jit(jax.vmap(env.step))

  def one_call():
    jax.block_until_ready(step(keys, states, actions[0]))

  def rollout(states, actions):
    def body(s, a):
      s, r, _, _ = jax.vmap(env.step)(keys, s, a)
      return s, r

    return jax.lax.scan(body, states, actions)

  scanned = jax.jit(rollout)
  call_rate = _best_rate(one_call, batch)
  scan_rate = _best_rate(
      lambda: jax.block_until_ready(scanned(states, actions)), batch * scan_steps
  )
  return gen_rate, call_rate, scan_rate


def render_rates(env, batch, fmt):
  """Renders/s of `batch` reset host states: per row, and in one batched call."""
  states = jax.device_get(jax.jit(env.reset_batch)(jax.random.split(jax.random.key(0), batch)))
  rows = [jax.tree.map(lambda x, i=i: x[i], states) for i in range(batch)]
  per_row = _best_rate(lambda: [env.render(state, fmt) for state in rows], batch)
  batched = _best_rate(lambda: env.render_batch(states, range(batch), fmt), batch)
  return per_row, batched


def render_table(batch):
  print("| env | format | batch | renders/s (per row) | renders/s (batched) |")
  print("|---|---|---|---|---|")
  for name in ("sokoban", "frozenlake", "bandit", "2048"):
    env = envs.make(name)
    formats = ("grid", "coord", "grid_coord") if name in ("sokoban", "frozenlake") else ("grid",)
    for fmt in formats:
      per_row, batched = render_rates(env, batch, fmt)
      print(f"| {name} | {fmt} | {batch} | {per_row:,.0f} | {batched:,.0f} |", flush=True)


def gym_sokoban_rates(num_levels=1000, num_steps=50000):
  """gym-sokoban's generator and its step without rendering, or None if not installed."""
  try:
    from gym_sokoban.envs import room_utils  # pylint: disable=g-import-not-at-top
    from gym_sokoban.envs.sokoban_env import SokobanEnv  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  random.seed(0)
  np.random.seed(0)
  start, made = time.perf_counter(), 0
  while made < num_levels:
    try:
      room_utils.generate_room(dim=(6, 6), num_steps=20, num_boxes=1)
      made += 1
    except (RuntimeError, RuntimeWarning):
      pass  # gym-sokoban's reset retries the same way; failed tries cost time too.
  gen_rate = num_levels / (time.perf_counter() - start)

  env = SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=100)
  env.reset()
  rng = np.random.default_rng(0)
  actions = rng.integers(1, 5, size=num_steps)
  start = time.perf_counter()
  for a in actions:
    # gym-sokoban's step minus its frame rendering.
    env.num_env_steps += 1
    env._push(int(a))  # pylint: disable=protected-access
    env._calc_reward()  # pylint: disable=protected-access
    if env._check_if_done():  # pylint: disable=protected-access
      env.num_env_steps = 0  # Keep stepping the same room; resets are timed separately.
  step_rate = num_steps / (time.perf_counter() - start)
  return gen_rate, step_rate


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batches", default="1,16,256,4096")
  parser.add_argument("--render", action="store_true", help="time host rendering instead")
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}, " f"{len(jax.devices())} device(s)"
  )
  if args.render:
    for batch in batches:
      render_table(batch)
    return
  peer = gym_sokoban_rates()
  if peer:
    print(
        f"gym-sokoban 6x6/1 box: {peer[0]:,.0f} levels/s, {peer[1]:,.0f} steps/s "
        f"(step without rendering)"
    )
  else:
    print("gym-sokoban not installed: ratios omitted (see the module docstring).")
  print(
      "| env | batch | levels/s | steps/s (one call per step) | steps/s (scan of 100) "
      "| gen ratio | step ratio (call) | step ratio (scan) |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for name in ("sokoban", "frozenlake", "bandit"):
    env = envs.make(name)
    for batch in batches:
      gen, call, scan = ours(env, batch)
      ratios = ("-", "-", "-")
      if peer and name == "sokoban":
        ratios = (f"{gen / peer[0]:,.1f}x", f"{call / peer[1]:,.1f}x", f"{scan / peer[1]:,.1f}x")
      print(
          f"| {name} | {batch} | {gen:,.0f} | {call:,.0f} | {scan:,.0f} | "
          + " | ".join(ratios)
          + " |",
          flush=True,
      )


if __name__ == "__main__":
  main()

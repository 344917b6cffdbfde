"""A short batched environment demo: random play, throughput and rendered levels.

  python -m ragen_jax.demo [--batch 1024] [--steps 10]

Generates a batch of Sokoban levels on the device, plays random actions in every episode of the
batch with one jitted, vmapped step per turn, and prints throughput, outcomes and a few levels
as RAGEN renders them; then does the same for FrozenLake, Bandit and 2048.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import envs


def play(env, batch: int, steps: int, seed: int = 0):
  """Random play in `batch` episodes for `steps` steps; returns (first state, totals, timings)."""
  key_reset, key_play = jax.random.split(jax.random.PRNGKey(seed))
  keys = jax.random.split(key_reset, batch)
  reset = jax.jit(env.reset_batch)
  step = jax.jit(jax.vmap(env.step))
  jax.block_until_ready(reset(keys))  # Compile outside the timings.
  start = time.perf_counter()
  states = jax.block_until_ready(reset(keys))
  gen_seconds = time.perf_counter() - start
  first = jax.tree.map(lambda x: x[0], states)
  returns = jnp.zeros((batch,), jnp.float32)
  success = jnp.zeros((batch,), jnp.bool_)
  step_seconds = 0.0
  for t in range(steps):
    k_act, k_env = jax.random.split(jax.random.fold_in(key_play, t))
    actions = jax.random.randint(k_act, (batch,), 0, env.num_actions)
    if t == 0:
      jax.block_until_ready(step(jax.random.split(k_env, batch), states, actions))
    start = time.perf_counter()
    states, reward, _, info = jax.block_until_ready(
        step(jax.random.split(k_env, batch), states, actions)
    )
    step_seconds += time.perf_counter() - start
    returns += reward
    success |= info["success"]
  return first, np.asarray(returns), np.asarray(success), gen_seconds, step_seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, devices: {jax.devices()}")
  for name in ("sokoban", "frozenlake", "bandit", "2048"):
    env = envs.make(name)
    first, returns, success, gen_s, step_s = play(env, args.batch, args.steps)
    print(f"\n== {name}: {args.batch} episodes, {args.steps} random steps each")
    print(
        f"reset {args.batch / gen_s:,.0f} episodes/s; "
        f"step {args.batch * args.steps / step_s:,.0f} steps/s"
    )
    print(f"random policy: success {success.mean():.1%}, mean return {returns.mean():+.3f}")
    print(f"first start state (actions {env.action_names_for(first)}):")
    print(env.render(first, "grid_coord" if name != "bandit" else "grid"))


if __name__ == "__main__":
  main()

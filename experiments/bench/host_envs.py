"""Host text environments in the rollout: what stepping them costs a turn, against pure JAX.

    python experiments/bench/host_envs.py [--episodes-groups 16] [--group-size 8]
        [--sleep-ms 10] [--repeats 3] [--workers 2]
        [--variants jax,thread,process,thread-nosleep]

One model (the tiny preset's shipped warm start, as the trainer starts from), one key and one
seed for every run, 16 groups x 8 = 128 episodes of non-slippery FrozenLake (grid_coord, 5
turns, CPU_SCALE's max_new_tokens 48, max_context 1024, max_turn_tokens 256), played as:
  jax             the pure-JAX environment (envs.FrozenLake): the whole batch reset and stepped
                  in one jitted, vmapped call per turn (rollout.env_batch.JaxBatch);
  thread          `HostFrozenLake` below, a TextEnv around the same game that sleeps --sleep-ms
                  in every reset and step call (an env waiting on I/O, a simulator, a server),
                  one instance per episode on envs.host.pool threads (rollout.env_batch.HostBatch);
  process         the same in `--workers` spawned processes (pool="process");
  thread-nosleep  / process-nosleep: the host path's own cost, without the sleep.
The host environment plays exactly the episodes of the JAX path (checked: every run's
conversations equal the JAX run's), so the decode work is identical and the difference is the
environment. Warm-up: the first variant plays once with the model (compiling the sampler), each
host variant once with a scripted policy (starting its pool); then the variants run in turn,
`--repeats` rounds, and each figure is the median over the rounds. Last, one `HostPool` step of
no-op episodes times the pool's own cost.

Prints the machine, then a markdown table per variant: rollout seconds (total, decode, env,
host), the turns played, seconds per turn, the environment's seconds per turn and share of the
rollout, the total against the JAX run of the same round, and the time the environment adds
over the JAX one as a share of the JAX rollout (the "at most 10% of a turn" figure).
"""

import argparse
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.envs.host import records
from ragen_jax.envs.host.pool import HostPool
from ragen_jax.train import policy

_GAME = envs.make("frozenlake", is_slippery=False)
# Jitted once per process (the workers of pool="process" build their own): called eagerly, each
# episode's reset would retrace its while_loop and each step would dispatch op by op, and the
# benchmark would time JAX dispatch instead of the environment. The step's key is a constant:
# the game is not slippery.
_RESET = jax.jit(lambda seed: _GAME.reset(jax.random.key(seed)))
_STEP = jax.jit(lambda state, action: _GAME.step(jax.random.key(0), state, action))

# name -> (pool, sleeps); "jax" plays the pure-JAX environment.
VARIANTS = {
    "jax": (None, False),
    "thread": ("thread", True),
    "process": ("process", True),
    "thread-nosleep": ("thread", False),
    "process-nosleep": ("process", False),
}


class HostFrozenLake(envs.TextEnv):
  """Non-slippery FrozenLake on the host, one episode per instance, `sleep_s` per call.

  The JAX environment's own reset, step and render behind the text interface, so the rollout
  sees the same text as through the JAX batch (the symbol legend, which JaxBatch adds to the
  system prompt, is part of the instruction here).
  """

  def __init__(self, render_format="grid_coord", sleep_s=0.010, sleep_on_reset=True):
    self.fmt, self.sleep_s, self.sleep_on_reset = render_format, sleep_s, sleep_on_reset
    self.instruction = _GAME.instruction(render_format)
    if render_format != "coord":
      legend = ", ".join(f"{k}: {v}" for k, v in _GAME.grid_vocab.items())
      self.instruction += "\nThe meaning of each symbol in the state is:\n" + legend
    self.action_names = _GAME.action_names
    self.state = None

  def reset(self, seed):
    if self.sleep_on_reset:
      time.sleep(self.sleep_s)
    self.state = jax.device_get(_RESET(seed))  # the state lives on the host, as numpy
    return _GAME.render(self.state, self.fmt)

  def step(self, action):
    time.sleep(self.sleep_s)
    # One call and one transfer per step: the scalars read one by one would each wait on JAX.
    self.state, reward, done, info = jax.device_get(
        _STEP(self.state, self.action_names.index(action))
    )
    info = {k: bool(info[k]) for k in ("success", "action_is_effective")}
    return _GAME.render(self.state, self.fmt), float(reward), bool(done), info


class NoopEnv(envs.TextEnv):
  """Does nothing: stepping it in a pool times the pool itself."""

  def reset(self, seed):
    return str(seed)

  def step(self, action):
    return action, 0.0, False, None


def pool_overhead(mode, episodes, workers, steps=20):
  """Median seconds of one `HostPool.step` of `episodes` no-op episodes, one action each."""
  pool = HostPool(NoopEnv, mode=mode, workers=workers)
  pool.reset(range(episodes))
  times = []
  for _ in range(steps + 1):  # the first step warms up
    start = time.perf_counter()
    pool.step({i: ["a"] for i in range(episodes)})
    times.append(time.perf_counter() - start)
  pool.close()
  return statistics.median(times[1:])


def _always_right(state, episode):
  del state, episode
  return "warm-up</think><answer>Right</answer>"


def make_env(variant, sleep_s, workers):
  pool, sleeps = VARIANTS[variant]
  if pool is None:
    return _GAME
  options = (("sleep_s", sleep_s if sleeps else 0.0),)
  return envs.HostEnv(f"host_frozenlake_{variant}", HostFrozenLake, options, pool, workers)


def clock_resets(engine):
  """Times the engine's environment resets: the summary's env_s holds them and every step."""
  reset, seconds = engine.envs.reset, [0.0]

  def timed(*args):
    start = time.perf_counter()
    try:
      return reset(*args)
    finally:
      seconds[0] += time.perf_counter() - start

  engine.envs.reset = timed
  return seconds


def timed_run(engine, reset_clock, model, seed):
  """One rollout: its summary's seconds, the turns the loop played, the conversations."""
  before = reset_clock[0]
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(0), seed=seed)
  s = result.summary
  row = {k: s[k] for k in ("total_s", "decode_s", "env_s", "host_s", "generated_tokens")}
  row["reset_s"] = reset_clock[0] - before
  # The turn loop runs while any episode plays: as many turns as the longest episode.
  row["turns"] = int(result.metrics["num_turns"].max())
  row["success"] = s["success"]
  row["actions"] = s["num_actions"]
  return row, [e.messages for e in result.episodes]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--episodes-groups", type=int, default=16, help="env groups")
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--sleep-ms", type=float, default=10.0, help="per reset and step call")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workers", type=int, default=2, help="processes of pool=process")
  parser.add_argument("--seed", type=int, default=10000)
  parser.add_argument("--variants", default="jax,thread,process,thread-nosleep")
  args = parser.parse_args()
  names = args.variants.split(",")
  unknown = sorted(set(names) - set(VARIANTS))
  if unknown:
    parser.error(f"unknown variants {unknown}; valid: {sorted(VARIANTS)}")
  names.sort(key=lambda name: name != "jax")  # JAX first: the reference the others must match

  model = models.load_hf(policy.WARM_START_DIR, dtype=jnp.float32, param_dtype=jnp.float32)
  tok = tokenizers.load("sentencepiece")
  config = rollout.RolloutConfig(
      env_groups=args.episodes_groups,
      group_size=args.group_size,
      max_turns=5,
      max_actions_per_traj=10,
      max_new_tokens=48,
      max_context=1024,
      max_turn_tokens=256,
      render_format="grid_coord",
      max_tokens_hint=100,
  )
  episodes = args.episodes_groups * args.group_size
  print(
      f"python {platform.python_version()}, jax {jax.__version__} on "
      f"{jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, load average "
      f"{os.getloadavg()[0]:.1f}; {episodes} episodes ({args.episodes_groups} x "
      f"{args.group_size}), sleep {args.sleep_ms:g} ms per env call, {args.workers} workers "
      f"(process), {args.repeats} rounds",
      flush=True,
  )
  engines = {
      name: rollout.Rollout(make_env(name, args.sleep_ms / 1000, args.workers), tok, config)
      for name in names
  }
  clocks = {name: clock_resets(engine) for name, engine in engines.items()}
  # Warm-up: one rollout with the model compiles the sampler and the JAX environment (the
  # variants play the same episodes, hence the same shapes); a scripted rollout of each host
  # variant starts its pool (the workers, which compile their own reset and step).
  reference = None  # the first run's conversations: every run must play the same episodes
  for name, engine in engines.items():
    start = time.perf_counter()
    if reference is None:
      _, reference = timed_run(engine, clocks[name], model, args.seed)
    elif VARIANTS[name][0] is not None:
      engine.run_scripted(_always_right, jax.random.key(0), args.seed)
    print(f"warm-up {name}: {time.perf_counter() - start:.1f} s", flush=True)

  rows = {name: [] for name in names}
  for r in range(args.repeats):  # rounds alternate the variants: load spikes hit all alike
    for name, engine in engines.items():
      row, messages = timed_run(engine, clocks[name], model, args.seed)
      assert messages == reference, f"{name} played different episodes in round {r}"
      rows[name].append(row)
    print(
        f"round {r}: "
        + ", ".join(f"{n} {rows[n][-1]['total_s']:.2f} s" for n in names)
        + f" (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
  for engine in engines.values():
    engine.close()

  first = rows[names[0]][0]
  actions = first["actions"] * episodes
  print(
      f"every run played the same episodes: {first['turns']} turns, "
      f"{first['generated_tokens']:.0f} sampled tokens, {actions:.0f} env steps "
      f"({actions / first['turns']:.0f} per turn: {actions / first['turns'] * args.sleep_ms:,.0f}"
      f" ms of sleep per turn in the sleeping variants), success {first['success']:.2f}"
  )
  print(
      "| variant | total s | decode s | env s | reset s | host s | turns | s / turn "
      "| env step s / turn | env share | total / jax | env added / jax total |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  base = rows.get("jax")
  for name in names:
    runs = rows[name]
    med = lambda fn, runs=runs: statistics.median(fn(row) for row in runs)
    turns = runs[0]["turns"]
    ratio = added = "-"
    if base:  # each run against the JAX run of its round, then the median over the rounds
      pairs = list(zip(runs, base))
      ratio = f"{statistics.median(a['total_s'] / j['total_s'] for a, j in pairs):.3f}x"
      added = statistics.median((a["env_s"] - j["env_s"]) / j["total_s"] for a, j in pairs)
      added = f"{100 * added:+.1f}%"
    print(
        f"| {name} | {med(lambda r: r['total_s']):.2f} | {med(lambda r: r['decode_s']):.2f} "
        f"| {med(lambda r: r['env_s']):.3f} | {med(lambda r: r['reset_s']):.3f} "
        f"| {med(lambda r: r['host_s']):.2f} | {turns} | {med(lambda r: r['total_s']) / turns:.2f} "
        f"| {med(lambda r: (r['env_s'] - r['reset_s']) / r['turns']):.3f} "
        f"| {100 * med(lambda r: r['env_s'] / r['total_s']):.1f}% | {ratio} | {added} |"
    )
  print(
      f"the pool's own cost, a no-op env, one step of {episodes} episodes: "
      + ", ".join(
          f"{mode} {1e3 * pool_overhead(mode, episodes, args.workers):.1f} ms"
          for mode in records.MODES
      )
  )
  sys.stdout.flush()


if __name__ == "__main__":
  main()

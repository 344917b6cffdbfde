"""The default run's rollout against the decode loop alone, in one run.

    python -m experiments.bench.rollout [--config configs/sokoban_ppo.py] [--iters 3]
        [--prompt 640]

Builds the config's policy (the default's: the tiny model's shipped warm start), tokenizer and
training rollout exactly as the trainer does, plays one rollout to compile, then `--iters`
rollouts of new levels, and prints for each the policy's time (`decode_s`: every turn's prefill
and decode loop), the sampled tokens, their rate, and the share of decode row-steps that sample
a token. The bound beside it is `sampling.py`'s decode loop alone at the rollout's batch after
a `--prompt`-token prompt (the default's conversations are 600-700 tokens by their last turn),
measured in the same process; the rollout's rate over it is the figure BENCHMARKS.md records.
"""

import argparse
import statistics

import jax

from experiments.bench import sampling as sampling_bench
from ragen_jax import rollout as rollout_lib
from ragen_jax.train import batching
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import policy as policy_lib


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/sokoban_ppo.py")
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--prompt", type=int, default=640)
  args = parser.parse_args()

  exp = schema.from_config(cli.load_config_file(args.config))
  model, tok = policy_lib.build(exp)
  env = exp.envs[0]
  engine = rollout_lib.Rollout(env.make(), tok, env.rollout_config(exp.rollout, validation=False))
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {args.config}: "
      f"{engine.batch_size} episodes of {env.tag}, cache capacity {engine.capacity}"
  )
  engine.run(rollout_lib.ModelPolicy(model), jax.random.key(0), seed=1_000_000)  # compiles
  rates, row_use, decode_s = [], [], []
  for i in range(args.iters):
    result = engine.run(
        rollout_lib.ModelPolicy(model), jax.random.key(i + 1), seed=1_000_000 + 100 * (i + 1)
    )
    s = result.summary
    decode_s.append(s["decode_s"])
    rates.append(s["generated_tokens"] / s["decode_s"])
    row_use.append(batching.rollout_cost({env.tag: result})["perf/decode_row_use"])
    print(
        f"rollout {i}: decode {s['decode_s']:.2f} s, env {s['env_s']:.2f} s, host "
        f"{s['host_s']:.2f} s; {s['generated_tokens']:.0f} sampled tokens "
        f"({rates[-1]:,.0f} tok/s), decode row use {row_use[-1]:.2f}",
        flush=True,
    )
  engine.close()
  ms = sampling_bench.decode_step_ms(model, engine.batch_size, args.prompt)
  bound = engine.batch_size * 1e3 / ms
  rate = statistics.median(rates)
  print(
      f"| {engine.batch_size} | {statistics.median(decode_s):.2f} | {rate:,.0f} | "
      f"{statistics.median(row_use):.2f} | {bound:,.0f} ({ms:.1f} ms/step after {args.prompt}) "
      f"| {rate / bound:.2f} |"
  )


if __name__ == "__main__":
  main()

"""The accelerator's two ceilings, measured: matmul FLOP/s and device-memory bandwidth.

    python experiments/bench/ceilings.py [--n 8192] [--gib 2]

MFU and bandwidth figures in BENCHMARKS.md are read against these (and the datasheet). Matmul: a
jitted n x n x n product of random (not zero) operands in bfloat16 and float32, best of 10
after warm-up. Bandwidth: a jitted elementwise `x * 2 + 1` over `--gib` GiB of bfloat16,
counting bytes read plus bytes written, best of 10.
"""

import argparse
import time

import jax
import jax.numpy as jnp


def best_seconds(fn, *args, reps=10):
  jax.block_until_ready(fn(*args))  # compile and warm up
  best = float("inf")
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def matmul_flops(n, dtype):
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  return 2.0 * n**3 / best_seconds(jax.jit(jnp.matmul), a, b)


def copy_bandwidth(gib):
  x = jax.random.normal(jax.random.key(2), (int(gib * 2**30) // 2,), jnp.bfloat16)
  return 2 * x.nbytes / best_seconds(jax.jit(lambda x: x * 2 + 1), x)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=8192)
  p.add_argument("--gib", type=float, default=2.0)
  args = p.parse_args()
  print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
  for dtype in (jnp.bfloat16, jnp.float32):
    print(
        f"matmul {args.n}^3 {jnp.dtype(dtype).name}: "
        f"{matmul_flops(args.n, dtype) / 1e12:.1f} TFLOP/s"
    )
  print(
      f"memory bandwidth (read + write, {args.gib:g} GiB bf16): "
      f"{copy_bandwidth(args.gib) / 1e12:.2f} TB/s"
  )


if __name__ == "__main__":
  main()

"""Forward throughput of ragen_jax's Qwen2 against transformers (PyTorch CPU).

    python -m experiments.bench.model [--batch 8] [--length 256] [--iters 7]

For each config, a random Qwen2ForCausalLM is built with transformers, saved,
and loaded with `models.load_hf`, so both sides run identical float32 weights
on the same int32 tokens_BxT. Ours is `jax.jit` of the functional model
(nnx.split -> merge inside the jitted function); transformers runs under
`torch.inference_mode()` with its default (sdpa) attention. Each side is warmed
up, then timed over `--iters` alternating calls (median). Prints tokens/s, the
ratio, and the max |logit difference| as a check that both compute the same
thing.
"""

import argparse
import os
import statistics
import tempfile
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from ragen_jax import models

# Mid-size: 8 layers of width 512 with a 32k vocabulary (~41M params).
CONFIGS = {
    "tiny": models.get_config("tiny"),
    "mid": models.ModelConfig(
        vocab_size=32768,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
}


def _time_interleaved(fn_a, fn_b, iters: int) -> tuple[float, float]:
  """Median seconds per call of fn_a and fn_b, calls alternated.

  Alternating keeps both sides under the same background load (the CPUs here
  are shared), so the ratio is steadier than either absolute number.
  """
  for _ in range(2):  # warm-up (compilation for JAX)
    fn_a()
    fn_b()
  times_a, times_b = [], []
  for _ in range(iters):
    for fn, times in ((fn_a, times_a), (fn_b, times_b)):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(times_a), statistics.median(times_b)


def bench(name: str, config: models.ModelConfig, batch: int, length: int, iters: int) -> dict:
  """Returns tokens/s of both implementations on one config."""
  torch.manual_seed(0)
  hf_config = transformers.Qwen2Config(**models.hf_config.to_hf_dict(config))
  hf = transformers.Qwen2ForCausalLM(hf_config).eval()
  with tempfile.TemporaryDirectory() as tmp:
    hf.save_pretrained(tmp)
    ours = models.load_hf(tmp)
  graphdef, state = nnx.split(ours)

  @jax.jit
  def forward(state, ids_BxT):
    return nnx.merge(graphdef, state)(ids_BxT)

  ids_BxT = (
      np.random.default_rng(0).integers(0, config.vocab_size, (batch, length)).astype(np.int32)
  )
  ids_jax, ids_torch = jnp.asarray(ids_BxT), torch.from_numpy(ids_BxT).long()

  def run_ours():
    return forward(state, ids_jax).block_until_ready()

  def run_hf():
    with torch.inference_mode():
      return hf(input_ids=ids_torch).logits

  diff = float(np.max(np.abs(np.asarray(run_ours()) - run_hf().numpy())))
  t_ours, t_hf = _time_interleaved(run_ours, run_hf, iters)
  tokens = batch * length
  return dict(
      name=name,
      params=models.num_params(config),
      batch=batch,
      length=length,
      ours=tokens / t_ours,
      hf=tokens / t_hf,
      ratio=t_hf / t_ours,
      max_diff=diff,
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=256)
  parser.add_argument("--iters", type=int, default=7)
  parser.add_argument("--configs", default="tiny,mid")
  args = parser.parse_args()
  print(
      f"jax {jax.__version__} ({jax.default_backend()}, "
      f"{os.cpu_count()} cpus), torch {torch.__version__} "
      f"({torch.get_num_threads()} threads), transformers "
      f"{transformers.__version__}"
  )
  print(
      "| config | params | batch x length | ragen_jax tok/s | "
      "transformers tok/s | ratio | max abs logit diff |"
  )
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for name in args.configs.split(","):
    r = bench(name, CONFIGS[name], args.batch, args.length, args.iters)
    print(
        f"| {r['name']} | {r['params'] / 1e6:.1f}M | {r['batch']} x "
        f"{r['length']} | {r['ours']:,.0f} | {r['hf']:,.0f} | "
        f"{r['ratio']:.2f}x | {r['max_diff']:.1e} |",
        flush=True,
    )


if __name__ == "__main__":
  main()

"""Throughput of the compiled StarPO train step versus matmul peak and a PyTorch baseline.

    python experiments/bench/train_step.py [--hidden 512 --layers 4 --seq 256 ...]
    python experiments/bench/train_step.py --preset qwen2.5-0.5b --dtype bfloat16 --remat \
        --batch 16 --seq 1024 --micro_batches 2 --matmul_n 8192      # one GPU

Measures, in one run on this machine:
  1. matmul peak: a jitted float32 [n, n] x [n, n] matmul, FLOP/s;
  2. the jitted, donated `algos.make_train_step` step: "actor" (GRPO: no-grad log-prob pass plus
     one forward+backward update) and "ppo" (GAE with RAGEN's separate critic, which adds the
     critic's forward and forward+backward);
  3. a JAX forward+backward of the same model alone (no optimizer, no extra passes), and
  4. a PyTorch forward+backward of `transformers.Qwen2ForCausalLM` with the same config and batch
     (on CUDA when there is a GPU; with --dtype bfloat16 under bf16 autocast, float32 weights,
     as our bf16 compute over float32 parameters).
FLOPs are counted analytically (MFU style, useful model FLOPs only; rematerialisation is not
counted): forward = tokens · (2·P_matmul + 4·L·T·H·Dh) with P_matmul the non-embedding matmul
parameters plus the D·V unembedding; backward = 2 x forward. Prints a markdown table.

Dimensions: B episodes, T tokens, D hidden, V vocabulary, L layers.
"""

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.batch import RolloutBatch


def matmul_peak(n, reps, dtype=jnp.float32):
  """Best-of-reps FLOP/s of a jitted n x n matmul in `dtype` (random operands, not zeros)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  best = np.inf
  for _ in range(reps):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


def forward_flops(cfg, batch, seq):
  """Analytic forward FLOPs of the causal LM on batch x seq tokens (logits included)."""
  d, f, h, k, dh = (
      cfg.hidden_size,
      cfg.intermediate_size,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.head_dim,
  )
  per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
  matmul_params = cfg.num_layers * per_layer + d * cfg.vocab_size
  attention = 4 * cfg.num_layers * seq * h * dh  # QKᵀ and AV over the full square
  return batch * seq * (2 * matmul_params + attention)


def make_batch(b, t, vocab, group, response=0):
  """`response` > 0: that many trained tokens per row in five replies spread over the second
  half (a multi-turn conversation's shape); 0: the last three quarters, one observation block."""
  rng = np.random.RandomState(0)
  loss = np.zeros((b, t), np.int32)
  if response:
    for turn in range(5):
      end = t // 2 + (turn + 1) * (t // 10)
      loss[:, end - response // 5 : end] = 1
  else:
    loss[:, t // 4 :] = 1
    loss[:, t // 2 : t // 2 + 8] = 0  # an observation block inside the response
  scores = rng.randint(0, 3, b).astype(np.float32)
  rewards = np.zeros((b, t), np.float32)
  rewards[:, -1] = scores
  return RolloutBatch(
      tokens_BxT=jnp.asarray(rng.randint(0, vocab, (b, t)), jnp.int32),
      attention_mask_BxT=jnp.ones((b, t), jnp.int32),
      loss_mask_BxT=jnp.asarray(loss),
      logprobs_BxT=jnp.zeros((b, t)),
      token_rewards_BxT=jnp.asarray(rewards),
      group_ids_B=jnp.asarray(np.arange(b) // group, jnp.int32),
      scores_B=jnp.asarray(scores),
  )


def interleaved(run_once, steps, matmul_n, dtype=jnp.float32):
  """Times run_once `steps` times, measuring the matmul peak right before each timing.

  Other processes share this machine's cores, so the available FLOP/s drifts; pairing each
  step with an adjacent peak measurement keeps the ratio meaningful.

  Returns:
    (median seconds per step, median of per-step peaks, list of (seconds, peak) pairs).
  """
  pairs = []
  for i in range(steps):
    peak = matmul_peak(matmul_n, 3, dtype)
    t0 = time.perf_counter()
    run_once(i)
    pairs.append((time.perf_counter() - t0, peak))
  secs, peaks = zip(*pairs)
  return float(np.median(secs)), float(np.median(peaks)), pairs


def time_jax_step(model_cfg, ppo_cfg, batch, steps, matmul_n, width=None):
  actor = models.create(model_cfg, jax.random.key(0))
  holder = {"state": algos.init_train_state(actor, None, ppo_cfg, jax.random.key(1))}
  step = algos.make_train_step(actor, None, ppo_cfg)

  def run_once(i):
    holder["state"], metrics = step(holder["state"], batch, jax.random.key(i), response_width=width)
    jax.block_until_ready(metrics)

  t0 = time.perf_counter()
  run_once(-1)
  compile_s = time.perf_counter() - t0
  return interleaved(run_once, steps, matmul_n, model_cfg.dtype) + (compile_s,)


def time_jax_fwd_bwd(model_cfg, batch, steps, matmul_n, vocab_chunk):
  """Gradient of the summed token log-probs alone: the same work as the PyTorch baseline."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  actor = models.create(model_cfg, jax.random.key(0))
  graphdef, params, rest = nnx.split(actor, nnx.Param, ...)

  def loss(params, tokens):
    model = nnx.merge(graphdef, params, rest)
    hidden_BxTxD, _ = model.backbone(tokens)
    logp, _ = algos.sequence_logprobs(
        hidden_BxTxD, model.unembed_kernel(), tokens, vocab_chunk, with_entropy=False
    )
    return -jnp.mean(logp)

  grad_fn = jax.jit(jax.value_and_grad(loss))

  def run_once(_):
    jax.block_until_ready(grad_fn(params, batch.tokens_BxT))

  run_once(-1)
  return interleaved(run_once, steps, matmul_n, model_cfg.dtype)


def time_torch(model_cfg, batch, steps, matmul_n):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(os.cpu_count())
  hf = transformers.Qwen2Config(
      vocab_size=model_cfg.vocab_size,
      hidden_size=model_cfg.hidden_size,
      intermediate_size=model_cfg.intermediate_size,
      num_hidden_layers=model_cfg.num_layers,
      num_attention_heads=model_cfg.num_heads,
      num_key_value_heads=model_cfg.num_kv_heads,
      rope_theta=model_cfg.rope_theta,
      tie_word_embeddings=model_cfg.tie_word_embeddings,
      max_position_embeddings=model_cfg.max_position_embeddings,
  )
  hf._attn_implementation = "sdpa"  # pylint: disable=protected-access
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  with torch.device(dev):  # built on the device: a 3B model's CPU initialisation takes minutes
    model = transformers.Qwen2ForCausalLM(hf).float().train()
  if model_cfg.remat:
    model.gradient_checkpointing_enable()
  ids = torch.from_numpy(np.array(batch.tokens_BxT)).long().to(dev)
  bf16 = model_cfg.dtype == jnp.bfloat16

  def run_once(_):
    model.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
      loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if dev == "cuda":
      torch.cuda.synchronize()

  run_once(-1)  # warm-up
  return interleaved(run_once, steps, matmul_n, model_cfg.dtype)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--intermediate", type=int, default=1536)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--group", type=int, default=4)
  p.add_argument("--vocab_chunk", type=int, default=1024)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--matmul_n", type=int, default=2048)
  p.add_argument("--preset", default=None, help="a models.PRESETS name; replaces the sizes above")
  p.add_argument(
      "--dtype",
      default="float32",
      choices=("float32", "bfloat16"),
      help="compute dtype (parameters and optimizer states stay float32)",
  )
  p.add_argument("--remat", action="store_true", help="recompute each layer in the backward")
  p.add_argument("--micro_batches", type=int, default=1)
  p.add_argument("--attention", default="auto", help="model.attention: auto, xla, cudnn, splash")
  p.add_argument("--response", type=int, default=0, help="trained tokens per row (make_batch)")
  p.add_argument(
      "--response_width",
      action="store_true",
      help="the step computes log-probs at trained tokens alone, as the trainer does",
  )
  p.add_argument(
      "--parts",
      default="actor,ppo,fwdbwd,torch",
      help="which rows to time; run torch in a process of its own with "
      "XLA_PYTHON_CLIENT_PREALLOCATE=false when both sides would not fit the GPU together",
  )
  args = p.parse_args()
  parts = set(args.parts.split(","))

  numerics = dict(dtype=jnp.dtype(args.dtype), remat=args.remat, attention=args.attention)
  if args.preset:
    model_cfg = models.get_config(args.preset, **numerics)
  else:
    model_cfg = models.ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        rope_theta=1e4,
        **numerics,
    )
  batch = make_batch(args.batch, args.seq, model_cfg.vocab_size, args.group, args.response)
  width = algos.response_width(np.asarray(batch.loss_mask_BxT)) if args.response_width else None
  tokens = args.batch * args.seq
  fwd = forward_flops(model_cfg, args.batch, args.seq)
  print(
      f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, {os.cpu_count()} cpus; "
      f"params {models.num_params(model_cfg) / 1e6:.1f}M; B={args.batch} T={args.seq} "
      f"D={model_cfg.hidden_size} L={model_cfg.num_layers} V={model_cfg.vocab_size}; "
      f"{args.dtype}{' remat' if args.remat else ''}; attention {args.attention}; "
      f"tokens/step {tokens}"
  )

  header = (
      f"| run | s/step | tokens/s | GFLOP/step | GFLOP/s | matmul peak GFLOP/s "
      f"({args.dtype} {args.matmul_n}^2) | % of peak | note |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  )
  print(header, flush=True)

  def report(name, sec, peak, pairs, flops, note):
    frac = np.median([flops / s / p for s, p in pairs])  # per-step ratio to its adjacent peak
    line = (
        f"| {name} | {sec:.3f} | {tokens / sec:,.0f} | {flops / 1e9:.1f} | "
        f"{flops / sec / 1e9:.1f} | {peak / 1e9:.1f} | {100 * frac:.0f}% | {note} |"
    )
    print(line, flush=True)  # as soon as measured: a later row may fail (memory)
    rows.append(line)

  common = {
      "num_minibatches": 1,
      "micro_batches": args.micro_batches,
      "vocab_chunk": args.vocab_chunk,
      "entropy_coeff": 0.001,
  }
  rows = []
  runs = []
  if "actor" in parts:
    runs.append(
        (
            "jax step, actor only (grpo)",
            algos.PPOConfig(adv_estimator="grpo", **common),
            fwd + 3 * fwd,
        )
    )
  if "ppo" in parts:
    runs.append(
        ("jax step, PPO + separate critic (gae)", algos.PPOConfig(**common), 2 * (fwd + 3 * fwd))
    )
  for name, ppo_cfg, flops in runs:
    sec, peak, pairs, compile_s = time_jax_step(
        model_cfg, ppo_cfg, batch, args.steps, args.matmul_n, width
    )
    note = f"compile {compile_s:.0f} s" + (f"; log-probs at {width} positions" if width else "")
    report(name, sec, peak, pairs, flops, note)
  if "fwdbwd" in parts:
    sec, peak, pairs = time_jax_fwd_bwd(
        model_cfg, batch, args.steps, args.matmul_n, args.vocab_chunk
    )
    note = f"chunked log-prob loss, attention {args.attention}"
    report("jax fwd+bwd only (same work as torch row)", sec, peak, pairs, 3 * fwd, note)
  if "torch" in parts:
    sec, peak, pairs = time_torch(model_cfg, batch, args.steps, args.matmul_n)
    report("torch fwd+bwd Qwen2ForCausalLM", sec, peak, pairs, 3 * fwd, "transformers, sdpa")
  print("\n" + header + "\n" + "\n".join(rows))


if __name__ == "__main__":
  main()

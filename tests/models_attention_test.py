"""Attention kernels against a NumPy reference, the kernel choice, and a model on each kernel.

Every implementation that runs on CPU (XLA in query blocks, the cuDNN path's row rotation and
length masks with the XLA kernel, splash in Pallas interpret mode) must equal a direct softmax
over the visible keys, with left padding, right padding, GQA and sequences that span blocks.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import models
from ragen_jax.models import attention

CPU_KERNELS = ("xla", "xla_by_length", "splash_interpret")


def _reference(q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, visible_BxTxS):
  """Direct float64 softmax attention; rows with no visible key are NaN (never compared)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh))
  b, t, h, dh = q.shape
  groups = h // k.shape[2]
  out = np.full((b, t, h, dh), np.nan)
  for bi in range(b):
    for ti in range(t):
      keys = np.flatnonzero(visible_BxTxS[bi, ti])
      if not len(keys):
        continue
      for hi in range(h):
        scores = k[bi, keys, hi // groups] @ q[bi, ti, hi] / np.sqrt(dh)
        weights = np.exp(scores - scores.max())
        out[bi, ti, hi] = weights @ v[bi, keys, hi // groups] / weights.sum()
  return out


def _inputs(seed, b, t, h, k, dh, lengths, right=False):
  keys = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(keys[0], (b, t, h, dh))
  kk = jax.random.normal(keys[1], (b, t, k, dh))
  v = jax.random.normal(keys[2], (b, t, k, dh))
  slot_T = np.arange(t)
  mask = np.stack([(slot_T < n) if right else (slot_T >= t - n) for n in lengths])
  return q, kk, v, mask


def _causal_visible(mask_BxT):
  t = mask_BxT.shape[1]
  return np.tril(np.ones((t, t), bool))[None] & mask_BxT[:, None, :]


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize(
    "t,h,k,lengths,right",
    [
        (40, 4, 2, (40, 25, 1), False),  # one block, GQA, left padding
        (300, 4, 1, (300, 170, 129), False),  # three blocks of 128, multi-query
        (64, 2, 2, (64, 10, 33), True),  # right padding
    ],
)
def test_causal_self_attention_matches_reference(kernel, t, h, k, lengths, right):
  q, kk, v, mask = _inputs(0, len(lengths), t, h, k, 16, lengths, right)
  out = attention.causal_self_attention(q, kk, v, jnp.asarray(mask), kernel)
  ref = _reference(q, kk, v, _causal_visible(mask))
  real = mask[:, :, None, None] & np.ones(out.shape, bool)
  np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=2e-5, rtol=2e-5)
  assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_gradients_equal_across_kernels(kernel):
  """The backward pass of each kernel equals XLA's (splash has its own backward kernels)."""
  q, kk, v, mask = _inputs(1, 3, 160, 4, 2, 16, (160, 90, 3))
  weights = jax.random.normal(jax.random.key(9), q.shape) * mask[:, :, None, None]

  def loss(q, kk, v, impl):
    return jnp.sum(attention.causal_self_attention(q, kk, v, jnp.asarray(mask), impl) * weights)

  want = jax.grad(loss, argnums=(0, 1, 2))(q, kk, v, "xla")
  got = jax.grad(loss, argnums=(0, 1, 2))(q, kk, v, kernel)
  for g, w in zip(got, want):
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize(
    "t,group_bytes",
    [
        (1, None),  # a decode step: keys-first matmuls
        (3, None),  # a prefill: queries first, the whole batch at once
        (3, 1),  # a prefill in groups of one row (lax.map on CPU)
    ],
)
def test_cached_attention_with_holes_matches_reference(t, group_bytes):
  """Cache attention in the [B, K, S, Dh] layout: holes (mask 0 mid-row) are never seen."""
  cached_attention = functools.partial(attention.cached_attention, group_bytes=group_bytes)
  b, s, h, k, dh = 4, 12, 4, 2, 8
  keys = jax.random.split(jax.random.key(2), 3)
  q = jax.random.normal(keys[0], (b, t, h, dh))
  k_BxKxSxDh = jax.random.normal(keys[1], (b, k, s, dh))
  v_BxKxSxDh = jax.random.normal(keys[2], (b, k, s, dh))
  key_mask = np.ones((b, s), bool)
  key_mask[0, [1, 4, 5]] = False
  key_mask[1, :3] = False
  key_mask[3, 2:5] = False
  end = 6  # the queries sit at slots 6, 7, 8
  query_slot = np.broadcast_to(end + np.arange(t), (b, t))
  visible = attention.cache_mask(jnp.asarray(key_mask), jnp.asarray(query_slot))
  out = cached_attention(q, k_BxKxSxDh, v_BxKxSxDh, visible)
  ref = _reference(q, k_BxKxSxDh.transpose(0, 2, 1, 3), v_BxKxSxDh.transpose(0, 2, 1, 3), visible)
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)
  assert not np.asarray(visible)[0, 0, [1, 4, 5, 7]].any() and np.asarray(visible)[0, 0, 6]
  # On CPU a prefill whose scores exceed the budget maps over groups of rows (here one each).
  jaxpr = str(jax.make_jaxpr(cached_attention)(q, k_BxKxSxDh, v_BxKxSxDh, visible))
  assert ("scan[" in jaxpr) == (group_bytes is not None)


@pytest.mark.parametrize(
    "name,platform,dtype,head_dim,want",
    [
        ("auto", "cpu", jnp.bfloat16, 64, "xla"),
        ("auto", "gpu", jnp.bfloat16, 64, "cudnn"),
        ("auto", "gpu", jnp.float32, 64, "xla"),  # cuDNN's flash kernel is half precision only
        ("auto", "gpu", jnp.bfloat16, 256, "xla"),
        ("auto", "tpu", jnp.float32, 64, "splash"),
        ("xla", "gpu", jnp.bfloat16, 64, "xla"),
        ("cudnn", "gpu", jnp.float16, 128, "cudnn"),
        ("splash", "tpu", jnp.bfloat16, 128, "splash"),
    ],
)
def test_resolve_picks_by_platform(name, platform, dtype, head_dim, want):
  assert attention.resolve(name, dtype, head_dim, platform) == want


@pytest.mark.parametrize(
    "name,platform,dtype,head_dim,message",
    [
        ("cudnn", "cpu", jnp.bfloat16, 64, "needs an NVIDIA GPU"),
        ("cudnn", "gpu", jnp.float32, 64, "bfloat16 or float16"),
        ("cudnn", "gpu", jnp.bfloat16, 100, "multiple of 8"),
        ("splash", "gpu", jnp.bfloat16, 64, "needs a TPU"),
        ("flash", "gpu", jnp.bfloat16, 64, "is not one of"),
    ],
)
def test_resolve_refuses_what_cannot_run(name, platform, dtype, head_dim, message):
  with pytest.raises(ValueError, match=message):
    attention.resolve(name, dtype, head_dim, platform)


def test_unavailable_kernel_fails_when_the_model_is_built():
  with pytest.raises(ValueError, match="attention must be one of"):
    models.get_config("tiny", attention="flash")
  if jax.default_backend() != "gpu":
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
      models.create("tiny", jax.random.key(0), attention="cudnn")


def test_model_on_splash_equals_model_on_xla(monkeypatch):
  """The whole model's logits agree when its self-attention runs on splash (gradients: above)."""
  config = models.get_config("tiny", num_layers=1, attention="xla")
  model = models.create(config, jax.random.key(0))
  ids = jax.random.randint(jax.random.key(1), (2, 100), 0, config.vocab_size)
  mask = jnp.arange(100)[None] >= jnp.array([[0], [61]])
  want = model(ids, mask)
  monkeypatch.setattr(attention, "resolve", lambda *args: "splash_interpret")
  got = model(ids, mask)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-4, rtol=1e-4)


def test_model_attention_block_reaches_the_kernel_and_keeps_the_logits():
  """model.attention_block: one block of 300 queries makes the layer's attention 2 matmuls
  instead of 3 blocks' 6, with the same logits on every real token."""
  config = models.get_config("tiny", num_layers=1, attention="xla")
  ids = jax.random.randint(jax.random.key(1), (2, 300), 0, config.vocab_size)
  mask = jnp.arange(300)[None] >= jnp.array([[0], [61]])
  logits, matmuls = {}, {}
  for block in (attention.QUERY_BLOCK, 300):
    model = models.create(config.replace(attention_block=block), jax.random.key(0))
    logits[block] = np.asarray(model(ids, mask))
    matmuls[block] = str(jax.make_jaxpr(model)(ids, mask)).count("dot_general")
  assert matmuls[attention.QUERY_BLOCK] - matmuls[300] == 6 - 2
  real = np.asarray(mask)
  np.testing.assert_allclose(logits[300][real], logits[attention.QUERY_BLOCK][real], atol=1e-5)


def _lowered_text(attention_name, dtype):
  config = models.get_config("tiny", num_layers=1, attention=attention_name, dtype=dtype)
  model = models.create(config, jax.random.key(0))
  ids = jnp.zeros((2, 128), jnp.int32)
  return jax.jit(lambda i: model(i)).lower(ids).compile().as_text()


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs an NVIDIA GPU")
def test_cudnn_choice_runs_the_fused_kernel():
  assert "__cudnn$fmha" in _lowered_text("cudnn", jnp.bfloat16)
  assert "__cudnn$fmha" not in _lowered_text("xla", jnp.bfloat16)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs an NVIDIA GPU")
@pytest.mark.parametrize("t,lengths", [(256, (256, 130, 1)), (300, (300, 171, 9))])
def test_cudnn_kernel_matches_reference_and_xla_gradients(t, lengths):
  """The fused kernel in bfloat16: outputs against float64 softmax, gradients against XLA's."""
  q, kk, v, mask = (
      a.astype(jnp.bfloat16) if i < 3 else a
      for i, a in enumerate(_inputs(3, len(lengths), t, 4, 2, 64, lengths))
  )
  out = attention.causal_self_attention(q, kk, v, jnp.asarray(mask), "cudnn")
  ref = _reference(
      q.astype(jnp.float32), kk.astype(jnp.float32), v.astype(jnp.float32), _causal_visible(mask)
  )
  real = mask[:, :, None, None] & np.ones(out.shape, bool)
  np.testing.assert_allclose(np.asarray(out, np.float32)[real], ref[real], atol=2e-2, rtol=2e-2)
  weights = jax.random.normal(jax.random.key(9), q.shape) * mask[:, :, None, None]

  def loss(q, kk, v, impl):
    out = attention.causal_self_attention(q, kk, v, jnp.asarray(mask), impl)
    return jnp.sum(out.astype(jnp.float32) * weights)

  want = jax.grad(loss, argnums=(0, 1, 2))(q, kk, v, "xla")
  got = jax.grad(loss, argnums=(0, 1, 2))(q, kk, v, "cudnn")
  for g, w in zip(got, want):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, w, atol=5e-2 * np.abs(w).max(), rtol=5e-2)


@pytest.mark.skipif(jax.default_backend() != "tpu", reason="splash needs a TPU")
def test_splash_choice_runs_the_pallas_kernel():
  assert "tpu_custom_call" in _lowered_text("splash", jnp.bfloat16)


def test_xla_choice_has_no_custom_kernel_on_cpu():
  if jax.default_backend() != "cpu":
    pytest.skip("checks the CPU program")
  text = _lowered_text("auto", jnp.float32)
  assert 'custom_call_target="__cudnn' not in text and "tpu_custom_call" not in text

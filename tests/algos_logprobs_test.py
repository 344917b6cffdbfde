"""Vocabulary-chunked log-probs and entropies against full-logits references.

Dimensions: B sequences, T positions, D hidden, V vocabulary.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax.algos import logprobs as logprobs_lib


def ref_logp_entropy(h, w, targets, temperature):
  """Full float64 softmax in NumPy."""
  z = np.einsum("btd,dv->btv", h.astype(np.float64), w.astype(np.float64)) / temperature
  lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  p = np.exp(z - lse[..., None])
  logp = np.take_along_axis(z, targets[..., None], -1)[..., 0] - lse
  return logp, lse - (p * z).sum(-1)


def _inputs(seed=0, b=2, t=5, d=8, v=37):
  rng = np.random.RandomState(seed)
  h = rng.randn(b, t, d).astype(np.float32)
  w = (2.0 * rng.randn(d, v)).astype(np.float32)
  targets = rng.randint(0, v, (b, t)).astype(np.int32)
  return h, w, targets


def test_chunked_matches_full_softmax_with_ragged_last_chunk():
  h, w, targets = _inputs()
  for chunk, temp in [(8, 1.0), (37, 0.7), (64, 1.3), (5, 1.0)]:
    logp, ent = algos.chunked_logprobs_entropy(
        jnp.asarray(h), jnp.asarray(w), jnp.asarray(targets), chunk, temp
    )
    ref_lp, ref_ent = ref_logp_entropy(h, w, targets, temp)
    np.testing.assert_allclose(logp, ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


def test_chunked_gradient_matches_full_logits_gradient():
  h, w, targets = _inputs(1)
  coef = jnp.asarray(np.random.RandomState(2).randn(2, 5).astype(np.float32))

  def full(h, w):
    z = jnp.einsum("btd,dv->btv", h, w)
    lsm = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(lsm, jnp.asarray(targets)[..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
    return jnp.sum(coef * logp) + 0.3 * jnp.sum(coef * ent)

  def chunked(h, w):
    logp, ent = algos.chunked_logprobs_entropy(h, w, jnp.asarray(targets), 8)
    return jnp.sum(coef * logp) + 0.3 * jnp.sum(coef * ent)

  g_ref = jax.grad(full, argnums=(0, 1))(jnp.asarray(h), jnp.asarray(w))
  g = jax.jit(jax.grad(chunked, argnums=(0, 1)))(jnp.asarray(h), jnp.asarray(w))
  for a, b in zip(g, g_ref):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_sequence_logprobs_shift_convention():
  # Position t scores tokens[t] from hidden[t − 1]; position 0 is 0.
  h, w, tokens = _inputs(3)
  logp, ent = algos.sequence_logprobs(jnp.asarray(h), jnp.asarray(w), jnp.asarray(tokens), 16)
  ref_lp, ref_ent = ref_logp_entropy(h[:, :-1], w, tokens[:, 1:], 1.0)
  np.testing.assert_allclose(logp[:, 1:], ref_lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent[:, 1:], ref_ent, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(logp[:, 0], 0.0)


def test_no_full_vocab_tensor_in_compiled_program():
  # With chunk C ≪ V, no intermediate of the compiled forward+backward has B·T·V elements.
  b, t, d, v, c = 2, 16, 8, 4096, 256
  h = jnp.ones((b, t, d))
  w = jnp.ones((d, v)) * 0.01
  targets = jnp.zeros((b, t), jnp.int32)
  fn = jax.grad(
      lambda h, w: jnp.sum(algos.chunked_logprobs_entropy(h, w, targets, c)[0]), argnums=(0, 1)
  )
  hlo = jax.jit(fn).lower(h, w).as_text()
  assert f"{b}x{t}x{v}x" not in hlo and f"{b},{t},{v}]" not in hlo
  assert f"{b},{t},{c}]" in hlo or f"{b}x{t}x{c}x" in hlo


def test_logprobs_at_response_positions_equal_the_full_pass_there_and_zero_elsewhere():
  rng = np.random.default_rng(3)
  b, t, d, v = 3, 10, 8, 40
  h = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
  mask = np.zeros((b, t), np.int32)
  mask[0, [2, 3, 7]] = 1
  mask[1, 5:10] = 1
  # row 2: no trained token
  width = algos.response_width(mask, least=1)
  assert width == 8  # five trained tokens, rounded up to a power of two
  full_logp, full_ent = algos.sequence_logprobs(h, w, tokens, 16)
  positions = logprobs_lib.response_positions(jnp.asarray(mask), width)
  logp, ent = algos.sequence_logprobs(h, w, tokens, 16, positions_BxR=positions)
  np.testing.assert_allclose(logp, np.where(mask, full_logp, 0.0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ent, np.where(mask, full_ent, 0.0), rtol=1e-5, atol=1e-6)

"""Bi-level GAE against a per-episode loop reference (RAGEN's two passes) and hand-worked numbers.

Dimensions: B episodes, T token positions.
"""

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax.algos import advantages as adv_lib

from references import ref_gae  # pylint: disable=g-bad-import-order
from references import ref_masked_whiten  # pylint: disable=g-bad-import-order


def ref_bi_level(r, v, m, gamma, lam, high_gamma):
  """Two explicit passes per episode over index lists, as RAGEN writes them."""
  b, t_len = r.shape
  raw = np.zeros((b, t_len))
  for i in range(b):
    valid = [t for t in range(t_len) if m[i, t] == 1]
    ends = [t for t in valid if t + 1 == t_len or m[i, t + 1] == 0]
    turn_return = {}
    g = 0.0
    for k in reversed(range(len(ends))):
      e = ends[k]
      next_value = v[i, ends[k + 1]] if k + 1 < len(ends) else 0.0
      g = r[i, e] + high_gamma * next_value - v[i, e] + high_gamma * lam * g
      turn_return[e] = g + v[i, e]
    g = 0.0
    for j in reversed(range(len(valid))):
      t = valid[j]
      if t in turn_return:  # a turn's last token: its return, no bootstrap past it
        reward, next_value, g = turn_return[t], 0.0, 0.0
      else:
        reward, next_value = r[i, t], v[i, valid[j + 1]]
      g = reward + gamma * next_value - v[i, t] + gamma * lam * g
      raw[i, t] = g
    for t in reversed(range(t_len)):  # a masked position holds the next valid token's value
      if m[i, t] == 0:
        raw[i, t] = raw[i, t + 1] if t + 1 < t_len else 0.0
  return ref_masked_whiten(raw, m), raw + v


_bi_jit = jax.jit(algos.compute_bi_level_gae, static_argnums=(3, 4, 5))


def test_two_turns_hand_worked():
  # [obs, a1, a2, obs, b1]: turn 1 = a1 a2 (reward 0.5 on a2), turn 2 = b1 (reward 1.0).
  r = np.array([[0.0, 0.0, 0.5, 0.0, 1.0]], np.float32)
  v = np.array([[0.0, 0.2, 0.4, 0.0, 0.6]], np.float32)
  m = np.array([[0, 1, 1, 0, 1]], np.int32)
  # Turn level (γ_H = 0.5, λ = 1): turn 2: δ = 1 − 0.6 = 0.4, R̂ = 1.0; turn 1:
  # δ = 0.5 + 0.5·0.6 − 0.4 = 0.4, g = 0.4 + 0.5·0.4 = 0.6, R̂ = 0.6 + 0.4 = 1.0.
  # Token level (γ = λ = 1): b1: 1.0 − 0.6 = 0.4; a2: 1.0 − 0.4 = 0.6; a1: 0.2 + 0.6 = 0.8.
  adv, ret = _bi_jit(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), 1.0, 1.0, 0.5)
  raw = np.array([[0.8, 0.8, 0.6, 0.4, 0.4]])
  np.testing.assert_allclose(ret, raw + v, atol=1e-6)
  np.testing.assert_allclose(adv, ref_masked_whiten(raw, m), atol=1e-5)


def test_turn_discount_reaches_earlier_turns():
  # Three one-token turns, reward 1 only at the end, zero values: turn k's return is γ_H^(K−k).
  r = np.array([[0, 0, 0, 0, 1]], np.float32)
  v = np.zeros((1, 5), np.float32)
  m = np.array([[1, 0, 1, 0, 1]], np.int32)
  _, ret = _bi_jit(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), 1.0, 1.0, 0.9)
  np.testing.assert_allclose(np.asarray(ret)[0, [0, 2, 4]], [0.81, 0.9, 1.0], atol=1e-6)
  # Plain GAE with γ = 1 gives every turn the same return: the turn discount is the difference.
  _, plain = algos.compute_gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m))
  np.testing.assert_allclose(np.asarray(plain)[0, [0, 2, 4]], [1.0, 1.0, 1.0], atol=1e-6)


def test_ragen_degenerate_cases_equal_plain_gae():
  """One reward on the last token (RAGEN's required use_turn_scores=False): with γ_H = λ = γ = 1
  every turn's return is that reward, as plain GAE gives; a single turn equals plain GAE for
  any γ_H, λ, γ."""
  rng = np.random.default_rng(0)
  v = rng.normal(size=(2, 9)).astype(np.float32)
  m = np.array([[0, 1, 1, 0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 0, 1, 1, 1]], np.int32)
  r = np.zeros((2, 9), np.float32)
  r[:, -1] = [1.0, -0.5]
  args = (jnp.asarray(r), jnp.asarray(v * m), jnp.asarray(m))
  for got, want in zip(_bi_jit(*args, 1.0, 1.0, 1.0), algos.compute_gae(*args, 1.0, 1.0)):
    np.testing.assert_allclose(got, want, atol=1e-5)
  single = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1]] * 2, np.int32)
  args = (jnp.asarray(r), jnp.asarray(v * single), jnp.asarray(single))
  for got, want in zip(_bi_jit(*args, 0.9, 0.8, 0.5), algos.compute_gae(*args, 0.9, 0.8)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_turn_ends():
  m = jnp.asarray([[0, 1, 1, 0, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(
      adv_lib.turn_ends(m),
      [[0, 0, 1, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]],
  )


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    r=hnp.arrays(np.float32, (3, 8), elements=st.floats(-3, 3, width=32)),
    v=hnp.arrays(np.float32, (3, 8), elements=st.floats(-3, 3, width=32)),
    m=hnp.arrays(np.int32, (3, 8), elements=st.integers(0, 1)),
    gamma=st.sampled_from([1.0, 0.95]),
    lam=st.sampled_from([1.0, 0.9, 0.0]),
    high_gamma=st.sampled_from([1.0, 0.95, 0.5]),
)
def test_matches_reference_on_random_turns(r, v, m, gamma, lam, high_gamma):
  hypothesis.assume(m.sum() >= 2)
  ref_adv, ref_ret = ref_bi_level(
      r.astype(np.float64), v.astype(np.float64), m, gamma, lam, high_gamma
  )
  hypothesis.assume(np.var((ref_ret - v)[m == 1]) > 1e-3)  # whitening of a constant is noise
  adv, ret = _bi_jit(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma, lam, high_gamma)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-3, atol=1e-3)


def test_reference_reduces_to_plain_gae_reference_for_one_turn():
  """The loop reference itself, checked against the plain-GAE reference on single turns."""
  rng = np.random.default_rng(1)
  r, v = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
  m = np.array([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
  for got, want in zip(ref_bi_level(r, v, m, 0.9, 0.7, 0.3), ref_gae(r, v, m, 0.9, 0.7)):
    np.testing.assert_allclose(got, want, atol=1e-12)

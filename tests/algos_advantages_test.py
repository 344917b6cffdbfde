"""Advantage estimators against a loop-by-loop NumPy reference and hand-worked numbers.

Dimensions: B episodes, T token positions.
"""

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from references import ref_gae  # pylint: disable=g-bad-import-order
from references import ref_masked_whiten  # pylint: disable=g-bad-import-order

# ---------------------------------------------------------------- NumPy reference (rl_math.md)


def ref_grpo(scores, ids, norm_by_std, eps=1e-6):
  out = np.zeros(len(scores))
  for i, s in enumerate(scores):
    members = [scores[j] for j in range(len(scores)) if ids[j] == ids[i]]
    if len(members) == 1:
      mu, sd = 0.0, 1.0
    else:
      mu, sd = np.mean(members), np.std(members, ddof=1)
    out[i] = (s - mu) / (sd + eps) if norm_by_std else s - mu
  return out


# ---------------------------------------------------------------- GAE


def test_gae_hand_worked_observation_tokens():
  # Row: assistant token, two observation tokens (with a reward and values that must be
  # ignored), two assistant tokens, trailing padding. γ = 0.9, λ = 0.8.
  r = np.array([[0.0, 5.0, 0.0, 0.0, 1.0, 0.0]])
  v = np.array([[0.5, 9.0, 9.0, 0.2, 0.4, 7.0]])
  m = np.array([[1, 0, 0, 1, 1, 0]])
  adv, ret = jax.jit(algos.compute_gae, static_argnums=(3, 4))(
      jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32), jnp.asarray(m), 0.9, 0.8
  )
  # Raw: Â4 = 1 − 0.4 = 0.6; Â3 = 0.9·0.4 − 0.2 + 0.72·0.6 = 0.592; Â1 = Â2 = Â3 (carried);
  # Â0 = 0.9·0.2 − 0.5 + 0.72·0.592 = 0.10624 (γ applied once across the observation block).
  raw = np.array([0.10624, 0.592, 0.592, 0.592, 0.6, 0.0])
  np.testing.assert_allclose(ret[0], raw + v[0], rtol=1e-6, atol=1e-6)
  valid = np.array([0.10624, 0.592, 0.6])
  mu = valid.mean()
  sd = np.sqrt(((valid - mu) ** 2).sum() / 2)
  np.testing.assert_allclose(adv[0], (raw - mu) / np.sqrt(sd**2 + 1e-8), rtol=1e-5, atol=1e-6)
  # Masked positions are whitened too (non-zero), as in veRL.
  assert abs(float(adv[0, 5])) > 0.1


def test_gae_defaults_give_return_minus_value():
  # γ = λ = 1 and one terminal reward R: raw advantage of each valid token = R − V_t.
  r = np.zeros((2, 5))
  r[0, 3] = 2.0
  r[1, 4] = -1.0
  v = np.random.RandomState(0).randn(2, 5)
  m = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]])
  _, ret = algos.compute_gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m))
  raw = np.asarray(ret) - v
  for i, big_r in enumerate([2.0, -1.0]):
    np.testing.assert_allclose(raw[i][m[i] == 1], big_r - v[i][m[i] == 1], rtol=1e-5, atol=1e-5)


_gae_jit = jax.jit(algos.compute_gae, static_argnums=(3, 4))


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    r=hnp.arrays(np.float32, (3, 7), elements=st.floats(-3, 3, width=32)),
    v=hnp.arrays(np.float32, (3, 7), elements=st.floats(-3, 3, width=32)),
    m=hnp.arrays(np.int32, (3, 7), elements=st.integers(0, 1)),
    gamma=st.sampled_from([1.0, 0.95, 0.5]),
    lam=st.sampled_from([1.0, 0.9, 0.0]),
)
def test_gae_matches_reference_on_random_masks(r, v, m, gamma, lam):
  hypothesis.assume(m.sum() >= 2)
  hypothesis.assume(np.var(ref_gae(r, v, m, gamma, lam)[1][m == 1] - v[m == 1]) > 1e-3)
  adv, ret = _gae_jit(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma, lam)
  ref_adv, ref_ret = ref_gae(r.astype(np.float64), v.astype(np.float64), m, gamma, lam)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-3, atol=1e-3)


def test_gae_fully_masked_row_and_whitening_is_batch_global():
  r = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
  v = np.array([[0.1, 0.2, 0.3], [0.0, 0.5, 1.0], [4.0, 4.0, 4.0]])
  m = np.array([[1, 1, 1], [0, 1, 1], [0, 0, 0]])
  adv, ret = algos.compute_gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m))
  ref_adv, ref_ret = ref_gae(r, v, m, 1.0, 1.0)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  # The fully masked row has raw advantage 0 everywhere, so returns = values there.
  np.testing.assert_allclose(ret[2], v[2])
  # Whitening used one mean over all 5 valid tokens (not per row).
  valid = np.asarray(adv)[m == 1]
  assert abs(valid.mean()) < 1e-5 and abs(valid.std(ddof=1) - 1.0) < 1e-3


# ---------------------------------------------------------------- whitening


def test_masked_whiten_unbiased_eps_and_degenerate_counts():
  x = jnp.array([[1.0, 2.0, 100.0], [3.0, 4.0, -7.0]])
  m = jnp.array([[1, 1, 0], [1, 1, 0]])
  # μ = 2.5, unbiased var = 5/3; masked entries are whitened as well.
  expect = (np.asarray(x) - 2.5) / np.sqrt(5.0 / 3.0 + 1e-8)
  np.testing.assert_allclose(algos.masked_whiten(x, m), expect, rtol=1e-6)
  # veRL raises for fewer than two valid elements; under jit we return NaN instead.
  assert np.all(np.isnan(algos.masked_whiten(x, jnp.zeros_like(m))))
  one = jnp.zeros_like(m).at[0, 0].set(1)
  assert np.all(np.isnan(algos.masked_whiten(x, one)))
  # All-equal valid values: σ = 0, the 1e-8 inside the rsqrt gives (x − μ)·1e4.
  np.testing.assert_allclose(
      algos.masked_whiten(jnp.array([2.0, 2.0, 3.0]), jnp.array([1, 1, 0])),
      [0.0, 0.0, 1e4],
      rtol=1e-4,
  )


# ---------------------------------------------------------------- GRPO family


def test_grpo_hand_worked_singleton_equal_and_dr_grpo():
  scores = jnp.array([1.0, 0.0, 1.0, 0.0, 2.0, 3.0, 3.0])
  ids = jnp.array([7, 7, 7, 7, 2, 5, 5])
  adv = algos.grpo_advantages(scores, ids)
  sd = np.sqrt(1.0 / 3.0)  # unbiased std of {1, 0, 1, 0}
  expect = [0.5 / (sd + 1e-6), -0.5 / (sd + 1e-6)] * 2 + [2.0 / (1.0 + 1e-6), 0.0, 0.0]
  np.testing.assert_allclose(adv, expect, rtol=1e-6)
  dr = algos.grpo_advantages(scores, ids, norm_by_std=False)
  np.testing.assert_allclose(dr, [0.5, -0.5, 0.5, -0.5, 2.0, 0.0, 0.0], rtol=1e-6)


def test_grpo_eps_is_added_to_std_not_variance():
  adv = algos.grpo_advantages(jnp.array([1.0, 1.0001]), jnp.array([0, 0]))
  np.testing.assert_allclose(adv, [-0.6972, 0.6972], atol=2e-3)  # rl_math §3.2's loop value


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    scores=hnp.arrays(np.float32, (8,), elements=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0])),
    ids=hnp.arrays(np.int32, (8,), elements=st.integers(0, 4)),
    norm=st.booleans(),
)
def test_grpo_matches_reference(scores, ids, norm):
  grpo = jax.jit(algos.grpo_advantages, static_argnums=2)
  adv = grpo(jnp.asarray(scores), jnp.asarray(ids), norm)
  np.testing.assert_allclose(adv, ref_grpo(scores, ids, norm), rtol=1e-4, atol=1e-5)


def test_outcome_estimators_broadcast_over_mask():
  scores = jnp.array([1.0, 3.0, 2.0, 2.0])
  ids = jnp.array([0, 0, 1, 1])
  mask = jnp.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]])
  a, ret = algos.outcome_advantages(scores, ids, mask, "arpo")
  np.testing.assert_allclose(a, np.array([1.0, 3.0, 2.0, 2.0])[:, None] * np.asarray(mask))
  np.testing.assert_allclose(ret, a)
  a, _ = algos.outcome_advantages(scores, ids, mask, "brpo")
  bsd = np.std([1.0, 3.0, 2.0, 2.0], ddof=1)
  np.testing.assert_allclose(a[1, 2], 1.0 / (bsd + 1e-6), rtol=1e-6)
  np.testing.assert_allclose(a[0, 0], -1.0 / (bsd + 1e-6), rtol=1e-6)
  a, _ = algos.outcome_advantages(scores, ids, mask, "grpo")
  np.testing.assert_allclose(a[0, 0], -1.0 / (np.sqrt(2.0) + 1e-6), rtol=1e-6)
  np.testing.assert_allclose(a[2], [0.0, 0.0, 0.0])
  a, _ = algos.outcome_advantages(scores, ids, mask, "drgrpo")
  np.testing.assert_allclose(a[1], [0.0, 1.0, 1.0])
  with pytest.raises(ValueError):
    algos.outcome_advantages(scores, ids, mask, "remax")


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    scores=hnp.arrays(np.float32, (8,), elements=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0])),
    ids=hnp.arrays(np.int32, (8,), elements=st.integers(0, 3)),
    valid=hnp.arrays(np.bool_, (8,)),
    mask=hnp.arrays(np.int32, (8, 5), elements=st.integers(0, 1)),
    estimator=st.sampled_from(["arpo", "brpo", "grpo", "drgrpo"]),
)
def test_outcome_estimators_with_valid_B_equal_the_call_on_the_kept_episodes(
    scores, ids, valid, mask, estimator
):
  """valid_B (the train step's filter): the kept episodes get what the unfiltered call on them
  alone gives (dropped ones enter no statistic), and the dropped ones get 0."""
  adv, ret = algos.outcome_advantages(
      jnp.asarray(scores), jnp.asarray(ids), jnp.asarray(mask), estimator, valid_B=valid
  )
  adv = np.asarray(adv)
  np.testing.assert_array_equal(ret, adv)
  np.testing.assert_array_equal(adv[~valid], 0.0)
  if valid.any():
    alone, _ = algos.outcome_advantages(
        jnp.asarray(scores[valid]), jnp.asarray(ids[valid]), jnp.asarray(mask[valid]), estimator
    )
    np.testing.assert_allclose(adv[valid], alone, rtol=1e-5, atol=1e-6)


def test_explained_variance():
  ret = jnp.array([[1.0, 2.0, 3.0, 9.0]])
  val = jnp.array([[1.0, 2.5, 2.0, -5.0]])
  m = jnp.array([[1, 1, 1, 0]])
  resid = np.array([0.0, -0.5, 1.0])
  expect = 1 - np.var(resid, ddof=1) / (np.var([1.0, 2.0, 3.0], ddof=1) + 1e-5)
  np.testing.assert_allclose(algos.explained_variance(val, ret, m), expect, rtol=1e-5)

"""Loss aggregation, policy loss, value loss and KL estimators against a NumPy reference.

Dimensions: B sequences, T token positions.
"""

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos

CLIPS = dict(clip_low=0.2, clip_high=0.28, clip_c=3.0)  # the reference's, PPOConfig's defaults
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ---------------------------------------------------------------- NumPy reference (rl_math.md)


def ref_agg(loss, m, mode):
  """verl v0.6.1 agg_loss, row by row."""
  b, t_len = loss.shape
  if mode == "token-mean":
    return sum(loss[i, t] * m[i, t] for i in range(b) for t in range(t_len)) / (m.sum() + 1e-8)
  sums = [sum(loss[i, t] for t in range(t_len) if m[i, t]) for i in range(b)]
  counts = [m[i].sum() for i in range(b)]
  valid = [1.0 if c > 0 else 0.0 for c in counts]
  if mode == "seq-mean-token-sum":
    return sum(v * s for v, s in zip(valid, sums)) / (sum(valid) + 1e-8)
  if mode == "seq-mean-token-mean":
    return sum(v * s / (c + 1e-8) for v, s, c in zip(valid, sums, counts)) / (sum(valid) + 1e-8)
  return sum(sums) / t_len


def ref_policy(logp, old, adv, m, lo, hi, c):
  b, t_len = logp.shape
  loss = np.zeros((b, t_len))
  clip = np.zeros((b, t_len))
  low = np.zeros((b, t_len))
  lr = np.zeros((b, t_len))
  for i in range(b):
    for t in range(t_len):
      ell = min(max(logp[i, t] - old[i, t], -20.0), 20.0)
      rho = np.exp(ell)
      a = adv[i, t]
      l1, l2 = -a * rho, -a * min(max(rho, 1 - lo), 1 + hi)
      lc = max(l1, l2)
      l3 = -a * c
      loss[i, t] = min(lc, l3) if a < 0 else lc
      clip[i, t] = float(l2 > l1)
      low[i, t] = float(lc > l3 and a < 0)
      lr[i, t] = ell
  mm = lambda x: (x * m).sum() / (m.sum() + 1e-8)
  return loss, mm(-lr), mm(clip), mm(low)


def ref_kl(d, kind):
  if kind == "k1":
    return d
  if kind == "abs":
    return np.abs(d)
  if kind == "k2":
    return 0.5 * d * d
  k = np.clip(-d, -20, 20)
  return np.clip(np.exp(k) - k - 1, -10, 10)


# ---------------------------------------------------------------- agg_loss


def test_agg_loss_hand_worked_with_fully_masked_row():
  loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, np.inf]])
  m = jnp.array([[1, 1, 0], [0, 0, 0], [1, 1, 0]])
  # S = [3, 0, 15], n = [2, 0, 2]; the inf is masked and must not leak.
  np.testing.assert_allclose(algos.agg_loss(loss, m, "token-mean"), 18 / (4 + 1e-8), rtol=1e-6)
  np.testing.assert_allclose(algos.agg_loss(loss, m, "seq-mean-token-sum"), 9.0, rtol=1e-6)
  np.testing.assert_allclose(algos.agg_loss(loss, m, "seq-mean-token-mean"), 4.5, rtol=1e-6)
  np.testing.assert_allclose(algos.agg_loss(loss, m, "seq-mean-token-sum-norm"), 6.0, rtol=1e-6)
  np.testing.assert_allclose(
      algos.agg_loss(loss, m, "seq-mean-token-sum-norm", loss_scale_factor=9.0), 2.0, rtol=1e-6
  )
  # Everything masked: 0, not NaN (the 1e-8 denominators of v0.6.1).
  for mode in MODES:
    assert float(algos.agg_loss(loss, jnp.zeros_like(m), mode)) == 0.0
  with pytest.raises(ValueError):
    algos.agg_loss(loss, m, "sum")


_agg_jit = jax.jit(algos.agg_loss, static_argnums=2)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    loss=hnp.arrays(np.float32, (4, 6), elements=st.floats(-5, 5, width=32)),
    m=hnp.arrays(np.int32, (4, 6), elements=st.integers(0, 1)),
    mode=st.sampled_from(MODES),
)
def test_agg_loss_matches_reference_on_random_masks(loss, m, mode):
  got = _agg_jit(jnp.asarray(loss), jnp.asarray(m), mode)
  np.testing.assert_allclose(got, ref_agg(loss.astype(np.float64), m, mode), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- policy loss


def test_policy_loss_case_table_and_clamps():
  # Columns: (A>0, ρ=1.5 → clipped to 1.28), (A<0, ρ=0.5 → clipped to 0.8),
  # (A<0, log ratio 25 → clamp 20 → dual clip at c=3), (A=0), (A>0, ρ=0.5, not clipped).
  old = jnp.zeros((1, 5))
  logp = jnp.log(jnp.array([[1.5, 0.5, 1.0, 2.0, 0.5]])).at[0, 2].set(25.0)
  adv = jnp.array([[1.0, -1.0, -1.0, 0.0, 2.0]])
  m = jnp.ones((1, 5))
  loss, met = algos.policy_loss(logp, old, adv, m, **CLIPS)
  per_token = np.array([-1.28, 0.8, 3.0, 0.0, -1.0])
  np.testing.assert_allclose(loss, per_token.mean(), rtol=1e-5)
  np.testing.assert_allclose(met["pg_clipfrac"], 2 / 5, rtol=1e-6)
  np.testing.assert_allclose(met["pg_clipfrac_lower"], 1 / 5, rtol=1e-6)
  expect_kl = -(np.log(1.5) + np.log(0.5) + 20.0 + np.log(2.0) + np.log(0.5)) / 5
  np.testing.assert_allclose(met["ppo_kl"], expect_kl, rtol=1e-5)
  # The gradient is finite even for the extreme token, and zero where a clip is active.
  g = jax.grad(lambda lp: algos.policy_loss(lp, old, adv, m, **CLIPS)[0])(logp)
  assert np.all(np.isfinite(g))
  np.testing.assert_allclose(g[0, :4], 0.0, atol=1e-7)
  np.testing.assert_allclose(g[0, 4], -2.0 * 0.5 / 5, rtol=1e-5)  # −A·ρ/N, unclipped


def test_policy_loss_on_policy_is_plain_policy_gradient():
  adv = jnp.array([[1.0, -2.0, 0.5]])
  logp = jnp.array([[-1.0, -2.0, -0.5]])
  m = jnp.array([[1, 1, 0]])
  g = jax.grad(lambda lp: algos.policy_loss(lp, jax.lax.stop_gradient(lp), adv, m, **CLIPS)[0])(
      logp
  )
  np.testing.assert_allclose(g, [[-0.5, 1.0, 0.0]], rtol=1e-6)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    lr=hnp.arrays(np.float32, (3, 5), elements=st.floats(-30, 30, width=32)),
    # No subnormal advantages: XLA on CPU flushes them to zero, the float64 reference does not.
    adv=hnp.arrays(np.float32, (3, 5), elements=st.floats(-2, 2, width=32, allow_subnormal=False)),
    m=hnp.arrays(np.int32, (3, 5), elements=st.integers(0, 1)),
    mode=st.sampled_from(MODES),
)
def test_policy_loss_matches_reference(lr, adv, m, mode):
  old = np.full((3, 5), -1.0, np.float32)
  logp = old + lr
  loss, met = _policy_jit(
      jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(m), mode
  )
  ref_l, ref_kl_, ref_cf, ref_low = ref_policy(
      logp.astype(np.float64), old, adv, m, *CLIPS.values()
  )
  np.testing.assert_allclose(loss, ref_agg(ref_l, m, mode), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(met["ppo_kl"], ref_kl_, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(met["pg_clipfrac"], ref_cf, atol=1e-6)
  np.testing.assert_allclose(met["pg_clipfrac_lower"], ref_low, atol=1e-6)


_policy_jit = jax.jit(
    lambda lp, old, a, m, mode: algos.policy_loss(lp, old, a, m, agg_mode=mode, **CLIPS),
    static_argnums=4,
)


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_worked():
  v_new = jnp.array([[1.0, 2.0, 0.0, 5.0]])
  v_old = jnp.array([[0.0, 2.0, 0.0, 0.0]])
  ret = jnp.array([[0.0, 3.0, 1.0, 9.0]])
  m = jnp.array([[1, 1, 1, 0]])
  # Token 0: v̂c = 0.5, l1 = 1, l2 = 0.25 → 1 (not clipped). Token 1: v̂c = 2, l1 = l2 = 1.
  # Token 2: l1 = l2 = 1. Masked token 3 ignored.
  loss, met = algos.value_loss(v_new, v_old, ret, m, cliprange=0.5)
  np.testing.assert_allclose(loss, 0.5 * 3.0 / 3.0, rtol=1e-6)
  np.testing.assert_allclose(met["vf_clipfrac"], 0.0, atol=1e-7)
  # Moving away from the target beyond the clip: v̂ = 3 with old 2, R = 0.
  loss, met = algos.value_loss(
      jnp.array([[3.0]]), jnp.array([[2.0]]), jnp.array([[0.0]]), jnp.array([[1]]), 0.5
  )
  np.testing.assert_allclose(loss, 0.5 * 9.0, rtol=1e-6)  # max(9, 6.25)
  np.testing.assert_allclose(met["vf_clipfrac"], 0.0, atol=1e-7)
  # Overshooting towards the target: v̂ = -1, old 2, R = 0 → l1 = 1, l2 = 1.5² = 2.25, clipped.
  loss, met = algos.value_loss(
      jnp.array([[-1.0]]), jnp.array([[2.0]]), jnp.array([[0.0]]), jnp.array([[1]]), 0.5
  )
  np.testing.assert_allclose(loss, 0.5 * 2.25, rtol=1e-6)
  np.testing.assert_allclose(met["vf_clipfrac"], 1.0, rtol=1e-6)


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize(
    "kind,alias", [("k1", "kl"), ("abs", "abs"), ("k2", "mse"), ("k3", "low_var_kl")]
)
def test_kl_penalty_matches_reference_including_clamps(kind, alias):
  d = np.array([-30.0, -12.0, -1.0, -0.1, 0.0, 0.3, 2.0, 25.0], np.float32)
  ref_logp = np.full_like(d, -2.0)
  got = algos.kl_penalty(jnp.asarray(ref_logp + d), jnp.asarray(ref_logp), kind)
  np.testing.assert_allclose(got, ref_kl(d.astype(np.float64), kind), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      algos.kl_penalty(jnp.asarray(ref_logp + d), jnp.asarray(ref_logp), alias), got
  )
  if kind == "k3":
    # d = −30 → k = 20 clamped, value e^20 − 21 clamped to 10; d = 25 → k = −20 → 19 + e^−20 → 10.
    assert float(got[0]) == 10.0 and float(got[-1]) == 10.0
    np.testing.assert_allclose(got[2], np.exp(1.0) - 2.0, rtol=1e-6)
  with pytest.raises(ValueError):
    algos.kl_penalty(jnp.zeros(2), jnp.zeros(2), "full")

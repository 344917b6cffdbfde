"""StarPO-S rollout filtering against a plain-Python reference of ragen.md §4.

Dimensions: B episodes, G group slots.
"""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos


def ref_filter(
    scores, strategy, value, filter_type="largest", include_zero=True, prob_mode="linear", eps=0.01
):
  """Returns the set of kept group indices, walking a Python-sorted list."""
  n = len(scores)
  cand = [g for g in range(n) if include_zero or abs(scores[g]) > 1e-10]
  sign = 1.0 if filter_type == "largest" else -1.0
  ranked = sorted(cand, key=lambda g: (-sign * scores[g], g))
  if strategy == "top_p" and prob_mode == "linear":
    if value >= 1.0 and include_zero:
      return set(range(n))
    thr = value * sum(scores[g] for g in cand) - eps
    kept, total = [], 0.0
    for g in ranked:
      if scores[g] <= 0:
        return set()
      kept.append(g)
      total += scores[g]
      if total >= thr:
        return set(kept)
    return set()
  if strategy == "top_p":
    if not ranked:
      return set()
    logits = np.array([sign * scores[g] for g in ranked], np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    kept, mass = [], 0.0
    for g, pg in zip(ranked, p):
      kept.append(g)
      mass += pg
      if mass >= value:
        break
    return set(kept)
  if strategy == "top_k":
    return set(ranked[: max(1, int(value * n))])
  if strategy == "top_k_abs":
    return set(ranked[: int(value)])
  if not ranked:
    return set()
  if filter_type == "largest":
    best = max(scores[g] for g in cand)
    return {g for g in cand if scores[g] >= value * best}
  worst = min(scores[g] for g in cand)
  return {g for g in cand if scores[g] <= worst / value}


def kept_set(keep):
  return {int(g) for g in np.flatnonzero(np.asarray(keep))}


def test_top_p_linear_hand_worked():
  s = jnp.array([0.5, 0.0, 2.0, 1.0, 0.5])
  # Σ = 4, p = 0.7 → thr = 2.79: 2.0 (2 < 2.79), then 1.0 (3.0 ≥ 2.79) → keep {2, 3}.
  assert kept_set(algos.filter_groups(s, "top_p", 0.7)) == {2, 3}
  # p = 1 with include_zero keeps everything (RAGEN's "no filter" default)...
  assert kept_set(algos.filter_groups(s, "top_p", 1.0)) == {0, 1, 2, 3, 4}
  # ... and without include_zero keeps exactly the non-zero groups.
  assert kept_set(algos.filter_groups(s, "top_p", 1.0, include_zero=False)) == {0, 2, 3, 4}
  # All groups have zero spread: nothing is kept (the step is skipped).
  assert kept_set(algos.filter_groups(jnp.zeros(4), "top_p", 0.9)) == set()


def test_top_p_softmax_top_k_min_p_hand_worked():
  s = jnp.array([0.0, 3.0, 1.0, 2.0])
  # softmax([0,3,1,2]) = [.032, .644, .087, .237]: 0.644 < 0.8, 0.644 + 0.237 ≥ 0.8 → {1, 3}.
  assert kept_set(algos.filter_groups(s, "top_p", 0.8, prob_mode="softmax")) == {1, 3}
  # At least one group, even for a tiny p.
  assert kept_set(algos.filter_groups(s, "top_p", 0.01, prob_mode="softmax")) == {1}
  assert kept_set(algos.filter_groups(s, "top_k", 0.25)) == {1}  # max(1, int(1.0))
  assert kept_set(algos.filter_groups(s, "top_k", 0.1)) == {1}  # max(1, 0)
  assert kept_set(algos.filter_groups(s, "top_k", 0.5, filter_type="smallest")) == {0, 2}
  assert kept_set(algos.filter_groups(s, "top_k_abs", 3)) == {1, 3, 2}
  assert kept_set(algos.filter_groups(s, "min_p", 0.5)) == {1, 3}  # s ≥ 1.5
  assert kept_set(
      algos.filter_groups(s, "min_p", 0.6, filter_type="smallest", include_zero=False)
  ) == {
      2
  }  # s ≤ 1/0.6
  with pytest.raises(ValueError):
    algos.filter_groups(s, "random", 0.5)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    scores=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0, 1.5, 4.0]), min_size=6, max_size=6),
    config=st.sampled_from(
        [
            ("top_p", 0.9, "largest", "linear"),
            ("top_p", 0.5, "largest", "linear"),
            ("top_p", 1.0, "largest", "linear"),
            ("top_p", 0.9, "largest", "softmax"),
            ("top_p", 0.6, "smallest", "softmax"),
            ("top_k", 0.25, "largest", "linear"),
            ("top_k", 0.5, "smallest", "linear"),
            ("top_k_abs", 2, "largest", "linear"),
            ("min_p", 0.4, "largest", "linear"),
            ("min_p", 0.5, "smallest", "linear"),
        ]
    ),
    include_zero=st.booleans(),
)
def test_filter_groups_matches_reference(scores, config, include_zero):
  strategy, value, ftype, mode = config
  if ftype == "smallest" and strategy == "min_p":
    hypothesis.assume(not include_zero or min(scores) > 0)
  if strategy == "top_p" and mode == "linear":
    # A running sum that lands on the threshold within float32 rounding is a coin toss between
    # float32 (the filter) and float64 (the reference): such ties are not what is tested.
    cand = [x for x in scores if include_zero or abs(x) > 1e-10]
    thr = value * sum(cand) - 0.01
    partial = np.cumsum(sorted(cand, reverse=True))
    hypothesis.assume(np.all(np.abs(partial - thr) > 1e-5))
  got = algos.filter_groups(
      jnp.asarray(scores),
      strategy,
      value,
      filter_type=ftype,
      include_zero=include_zero,
      prob_mode=mode,
  )
  assert kept_set(got) == ref_filter(scores, strategy, value, ftype, include_zero, mode)


def test_episode_keep_mask_ranks_groups_by_unbiased_std():
  # Groups with ids 4 (scores 0, 1, 0, 1), 9 (all 2: std 0), 1 (singleton), 6 (−1, 3).
  scores = jnp.array([0.0, 2.0, 1.0, 2.0, 0.0, 5.0, 1.0, 2.0, -1.0, 3.0])
  ids = jnp.array([4, 9, 4, 9, 4, 1, 4, 9, 6, 6])
  keep, stats = jax.jit(lambda s, i: algos.episode_keep_mask(s, i, strategy="top_k_abs", value=1))(
      scores, ids
  )
  np.testing.assert_array_equal(keep, ids == 6)  # std(−1, 3) = 2.83 is the largest
  stds = [np.std([0, 1, 0, 1], ddof=1), 0.0, 0.0, np.std([-1, 3], ddof=1)]
  np.testing.assert_allclose(stats["in_group_reward_std"], np.mean(stds), rtol=1e-6)
  np.testing.assert_allclose(stats["filter_kept_ratio"], 0.25)
  keep, _ = algos.episode_keep_mask(scores, ids, metric="reward", strategy="top_k_abs", value=1)
  np.testing.assert_array_equal(keep, ids == 1)  # singleton mean 5 is the largest
  keep, stats = algos.episode_keep_mask(scores, ids, include_zero=False)
  np.testing.assert_array_equal(keep, (ids == 4) | (ids == 6))
  np.testing.assert_allclose(stats["filter_kept_ratio"], 0.5)


_keep_jit = jax.jit(
    lambda s, i: algos.episode_keep_mask(s, i, strategy="top_p", value=0.6, include_zero=False)[0]
)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    scores=st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0]), min_size=8, max_size=8),
    ids=st.lists(st.integers(0, 3), min_size=8, max_size=8),
)
def test_episode_keep_mask_matches_reference_for_arbitrary_group_ids(scores, ids):
  # Groups in order of first appearance; unbiased std, 0 for a singleton.
  order = list(dict.fromkeys(ids))
  members = {g: [s for s, i in zip(scores, ids) if i == g] for g in order}
  stds = [float(np.std(members[g], ddof=1)) if len(members[g]) > 1 else 0.0 for g in order]
  kept_groups = {order[k] for k in ref_filter(stds, "top_p", 0.6, include_zero=False)}
  got = _keep_jit(jnp.asarray(scores, jnp.float32), jnp.asarray(ids, jnp.int32))
  np.testing.assert_array_equal(got, [i in kept_groups for i in ids])

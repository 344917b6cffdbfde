"""Mutual-information collapse metrics against hand-worked cases and a NumPy loop reference."""

import math

import jax
import numpy as np
import pytest

from ragen_jax import diagnostics


def test_a_model_that_ignores_the_prompt_has_zero_mi():
  rng = np.random.default_rng(0)
  per_sample = rng.normal(-30.0, 5.0, size=(32, 1))
  logp = np.repeat(per_sample, 8, axis=1)  # l(i, j) does not depend on j.
  tokens = rng.integers(5, 20, size=32)
  m = diagnostics.mi_metrics(logp, tokens, np.arange(32) % 8)
  assert abs(float(m["mi_estimate"])) < 1e-5 and abs(float(m["mi_seq_estimate"])) < 1e-4
  np.testing.assert_allclose(m["conditional_entropy_est"], m["marginal_entropy_est"], rtol=1e-5)
  np.testing.assert_allclose(m["conditional_entropy_seq_est"], -per_sample.mean(), rtol=1e-5)
  assert float(m["mi_upper_bound"]) == pytest.approx(math.log(8))
  assert float(m["retrieval_chance_top1"]) == pytest.approx(1 / 8)


def test_a_perfectly_input_specific_model_reaches_log_n():
  n, k = 8, 4
  own = np.arange(n * k) % n
  logp = np.full((n * k, n), -1e4)
  logp[np.arange(n * k), own] = -3.0
  m = diagnostics.mi_metrics(logp, np.full(n * k, 3), own)
  assert float(m["mi_seq_estimate"]) == pytest.approx(math.log(n), abs=1e-4)
  assert float(m["mi_estimate"]) == pytest.approx(math.log(n), abs=1e-4)
  assert float(m["conditional_entropy_est"]) == pytest.approx(1.0)  # -(-3 / 3)
  for top in (1, 2, 4, 8):
    assert float(m[f"retrieval_acc_top{top}"]) == 1.0
  assert float(m["retrieval_chance_top2"]) == pytest.approx(2 / 8)
  assert float(m["mi_zscore"]) > 100  # Every sample has the same marginal: std ~ 0.


def _reference(logp_sum, num_tokens, own, column_ids, top_k=(1, 2, 4)):
  """Straight loops over the formulas of RAGEN-2 (ragen.md §5)."""
  s, p = logp_sum.shape
  out = {}
  for name, table in (("", logp_sum / num_tokens[:, None]), ("_seq", logp_sum)):
    matched = np.array([table[i, own[i]] for i in range(s)])
    marginal = np.array(
        [math.log(sum(math.exp(v) for v in table[i])) - math.log(p) for i in range(s)]
    )
    out[f"mi{name}_estimate"] = np.mean(matched - marginal)
    out[f"conditional_entropy{name}_est"] = -np.mean(matched)
    out[f"marginal_entropy{name}_est"] = -np.mean(marginal)
    out[f"mi{name}_zscore"] = np.mean(matched - marginal) / (np.std(marginal) + 1e-3)
  tok = logp_sum / num_tokens[:, None]
  for k in top_k:
    hits, chance = [], []
    for i in range(s):
      ranked = sorted(range(p), key=lambda j: (-tok[i, j], j))[:k]
      hits.append(any(column_ids[j] == column_ids[own[i]] for j in ranked))
      m = sum(column_ids[j] == column_ids[own[i]] for j in range(p))
      chance.append(1 - math.comb(p - m, k) / math.comb(p, k))
    out[f"retrieval_acc_top{k}"] = np.mean(hits)
    out[f"retrieval_chance_top{k}"] = np.mean(chance)
  return out


def test_matches_a_loop_reference_with_identical_columns():
  rng = np.random.default_rng(1)
  s, p = 40, 6
  logp = rng.normal(-2.0, 1.5, size=(s, p)) * rng.integers(1, 9, size=(s, 1))
  tokens = rng.integers(1, 9, size=s).astype(np.float64)
  own = rng.integers(0, p, size=s)
  column_ids = diagnostics.column_ids_from_prompts([[1, 2], [3], [1, 2], [4], [5, 6], [3]])
  np.testing.assert_array_equal(column_ids, [0, 1, 0, 2, 3, 1])
  got = jax.jit(
      lambda a, b, c: diagnostics.mi_metrics(a, b, c, column_ids_P=column_ids, top_k=(1, 2, 4))
  )(logp, tokens, own)
  want = _reference(logp, tokens, own, column_ids)
  for name, value in want.items():
    np.testing.assert_allclose(float(got[name]), value, rtol=1e-4, atol=1e-5, err_msg=name)
  assert "retrieval_acc_top8" not in got  # More than P columns: skipped.
  # Hand-worked chance: 2 identical columns of 6, top-2: 1 - C(4,2)/C(6,2) = 1 - 6/15.
  one = diagnostics.mi_metrics(
      logp[:1], tokens[:1], np.array([0]), column_ids_P=column_ids, top_k=(2,)
  )
  assert float(one["retrieval_chance_top2"]) == pytest.approx(1 - 6 / 15)


def test_zscore_ema_carries_the_std():
  rng = np.random.default_rng(2)
  logp = rng.normal(-5.0, 2.0, size=(16, 4))
  first = diagnostics.mi_metrics(logp, np.ones(16), np.arange(16) % 4)
  std = float(first["marginal_std_ema"])
  assert float(first["mi_zscore_ema"]) == pytest.approx(float(first["mi_zscore"]), rel=1e-5)
  second = diagnostics.mi_metrics(logp, np.ones(16), np.arange(16) % 4, std_ema=2.0 * std)
  assert float(second["marginal_std_ema"]) == pytest.approx(0.9 * 2.0 * std + 0.1 * std, rel=1e-5)
  assert float(second["mi_zscore_ema"]) == pytest.approx(
      float(first["mi_estimate"]) / (1.9 * std + 1e-3), rel=1e-4
  )

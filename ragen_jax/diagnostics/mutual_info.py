"""RAGEN-2's collapse proxies: conditional entropy H(Z|X), marginal entropy H(Z), and I(X;Z).

Dimensions: S sampled reasoning texts z_i; P prompt columns x_j (the distinct prompts in the sample,
or one column per sample for multi-turn contexts).

Given l(i, j) = log p(z_i | x_j) summed over z_i's tokens (scored with the current policy by
teacher forcing), with z_i's own prompt in column c(i), under the uniform mixture over the P
columns (RAGEN-2, ../shared/reference/ragen.md §5):

  matched_i  = l(i, c(i))
  marginal_i = logsumexp_j l(i, j) - log P            (log of the prompt-mixture likelihood)
  H(Z|X) ~= -mean_i matched_i      H(Z) ~= -mean_i marginal_i      I(X;Z) ~= mean_i (matched_i - marginal_i)

Each comes per sequence (sums) and per token (every l divided by |z_i|); the ceiling is log P. The
estimate can dip slightly below 0 on finite samples. Retrieval accuracy asks whether z_i's own prompt
is among the top-k columns by per-token log-prob (columns with an identical prompt count as correct);
chance is the same probability for k columns drawn at random. The MI z-score divides the MI
estimate by the population std of marginal_i (+1e-3); its EMA variant divides by an exponential
moving average (decay 0.9) of that std, carried by the caller.
"""

from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_EMA_DECAY = 0.9
_STD_EPS = 1e-3


def _chance_topk(identical_S, num_columns: int, k: int):
  """P(k columns drawn without replacement include one of m identical ones) = 1 - C(P-m,k)/C(P,k)."""
  miss = jnp.ones_like(identical_S, jnp.float32)
  for t in range(k):  # Product form of the hypergeometric miss probability.
    miss = miss * jnp.clip((num_columns - identical_S - t) / (num_columns - t), 0.0, 1.0)
  return 1.0 - miss


def mi_metrics(
    logp_sum_SxP: jax.Array,
    num_tokens_S: jax.Array,
    prompt_index_S: jax.Array,
    *,
    column_ids_P: Optional[jax.Array] = None,
    std_ema: Optional[jax.Array] = None,
    top_k: Sequence[int] = (1, 2, 4, 8),
) -> Dict[str, jax.Array]:
  """Mutual-information family of collapse metrics (pure, jit-able with static `top_k`).

  Args:
    logp_sum_SxP: float [S, P], sum of log p(z_i | x_j) over z_i's tokens.
    num_tokens_S: int [S], |z_i| (at least 1).
    prompt_index_S: int [S], the column of z_i's own prompt.
    column_ids_P: int [P], equal ids for columns whose prompts are token-identical (default: all
      distinct). A column identical to z_i's own counts as a correct retrieval.
    std_ema: previous EMA of the per-token marginal std (None at the first computation).
    top_k: retrieval cut-offs; those above P are skipped.

  Returns:
    A dict of float32 scalars: mi_estimate, mi_seq_estimate, conditional_entropy_est,
    conditional_entropy_seq_est, marginal_entropy_est, marginal_entropy_seq_est, mi_upper_bound,
    matched_log_prob_mean, marginal_log_prob_mean, retrieval_acc_top{k},
    retrieval_chance_top{k}, retrieval_above_chance_top{k}, mi_zscore, mi_seq_zscore,
    mi_zscore_ema and marginal_std_ema (the updated EMA to pass back next time).
  """
  logp_sum_SxP = jnp.asarray(logp_sum_SxP, jnp.float32)
  num_samples, num_columns = logp_sum_SxP.shape
  prompt_index_S = jnp.asarray(prompt_index_S, jnp.int32)
  if column_ids_P is None:
    column_ids_P = jnp.arange(num_columns)
  column_ids_P = jnp.asarray(column_ids_P)
  logp_tok_SxP = logp_sum_SxP / jnp.maximum(jnp.asarray(num_tokens_S, jnp.float32), 1.0)[:, None]
  rows = jnp.arange(num_samples)
  log_p = jnp.log(jnp.float32(num_columns))
  out = {"mi_upper_bound": log_p}
  for suffix, table in (("", logp_tok_SxP), ("_seq", logp_sum_SxP)):
    matched_S = table[rows, prompt_index_S]
    marginal_S = jax.nn.logsumexp(table, axis=1) - log_p
    gap_S = matched_S - marginal_S
    out[f"mi{suffix}_estimate"] = jnp.mean(gap_S)
    out[f"conditional_entropy{suffix}_est"] = -jnp.mean(matched_S)
    out[f"marginal_entropy{suffix}_est"] = -jnp.mean(marginal_S)
    std = jnp.std(marginal_S)  # Population std, as RAGEN-2.
    out[f"mi{suffix}_zscore"] = jnp.mean(gap_S) / (std + _STD_EPS)
    if not suffix:
      out["matched_log_prob_mean"] = jnp.mean(matched_S)
      out["marginal_log_prob_mean"] = jnp.mean(marginal_S)
      ema = std if std_ema is None else _EMA_DECAY * std_ema + (1 - _EMA_DECAY) * std
      out["marginal_std_ema"] = ema
      out["mi_zscore_ema"] = jnp.mean(gap_S) / (ema + _STD_EPS)
  # Retrieval: rank columns per sample; identical prompts share credit.
  correct_SxP = column_ids_P[None, :] == column_ids_P[prompt_index_S][:, None]
  identical_S = jnp.sum(correct_SxP, axis=1).astype(jnp.float32)
  order_SxP = jnp.argsort(-logp_tok_SxP, axis=1, stable=True)
  ranked_correct_SxP = jnp.take_along_axis(correct_SxP, order_SxP, axis=1)
  for k in top_k:
    if k > num_columns:
      continue
    acc = jnp.mean(jnp.any(ranked_correct_SxP[:, :k], axis=1).astype(jnp.float32))
    chance = jnp.mean(_chance_topk(identical_S, num_columns, k))
    out[f"retrieval_acc_top{k}"] = acc
    out[f"retrieval_chance_top{k}"] = chance
    out[f"retrieval_above_chance_top{k}"] = acc - chance
  return {name: jnp.asarray(value, jnp.float32) for name, value in out.items()}


def column_ids_from_prompts(prompt_tokens: Sequence[Sequence[int]]) -> np.ndarray:
  """Host helper: equal ids for token-identical prompts, for `mi_metrics(column_ids_P=...)`."""
  seen = {}
  return np.array([seen.setdefault(tuple(p), len(seen)) for p in prompt_tokens], np.int32)

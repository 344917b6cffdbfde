"""StarPO-S rollout filtering: keep whole env groups ranked by reward spread or mean reward.

RAGEN's strategies (shared/reference/ragen.md §4), as a keep mask with static shapes so that a
filtered batch never changes the compiled train step.

Dimensions:
  B: episodes.
  G: group slots. Inside the train step G = B: slot i stands for the group of episode i when
     i is the first episode carrying that group id, and is invalid otherwise. This represents
     any grouping (ids need not be contiguous or equal-sized) without a dynamic group count.
"""

import jax.numpy as jnp

from ragen_jax.algos.advantages import group_mean_std

STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
ZERO_SCORE_TOL = 1e-10  # |score| <= this counts as "zero" for include_zero=False


def _rank_G(key_G, cand_G):
  """rank[g] = position of g when candidates are sorted by key descending (stable by index)."""
  order_G = jnp.argsort(jnp.where(cand_G, -key_G, jnp.inf), stable=True)
  return jnp.zeros_like(order_G).at[order_G].set(jnp.arange(order_G.shape[0])), order_G


def filter_groups(
    group_scores_G,
    strategy="top_p",
    value=1.0,
    *,
    valid_G=None,
    filter_type="largest",
    include_zero=True,
    prob_mode="linear",
    eps=0.01,
):
  """RAGEN's rollout filter: which groups to keep.

  Candidates are the valid groups, minus those with |s| <= 1e-10 when include_zero is False.
  "largest" ranks by score descending, "smallest" ascending (ties keep index order).
    top_p, linear:  if value >= 1 and include_zero, keep every valid group. Otherwise, with
                    thr = value·Σ_cand s − eps, walk the ranked candidates accumulating s and
                    stop once the running sum reaches thr (that group is kept); meeting a
                    non-positive score first, or never reaching thr, keeps nothing.
                    ("largest" only: the walk over ascending scores is not defined by RAGEN.)
    top_p, softmax: p = softmax(±s) over candidates (− for "smallest"); keep the smallest
                    ranked prefix whose cumulative p reaches value (at least one group).
    top_k:          keep k = max(1, int(value · #valid groups)) best candidates.
    top_k_abs:      keep k = int(value) best candidates.
    min_p:          largest: keep s >= value · max s; smallest: keep s <= min s / value.

  Args:
    group_scores_G: float per-group statistic (e.g. unbiased in-group reward std).
    strategy, value, filter_type, include_zero, prob_mode, eps: RAGEN's rollout_filter_*.
    valid_G: which slots are real groups (default all).

  Returns:
    keep_G: bool; all False means the update is skipped.
  """
  scores_G = group_scores_G.astype(jnp.float32)
  num_slots = scores_G.shape[0]
  if valid_G is None:
    valid_G = jnp.ones(scores_G.shape, bool)
  if filter_type not in ("largest", "smallest"):
    raise ValueError(f"filter_type must be 'largest' or 'smallest', got {filter_type!r}")
  cand_G = valid_G if include_zero else valid_G & (jnp.abs(scores_G) > ZERO_SCORE_TOL)
  key_G = scores_G if filter_type == "largest" else -scores_G
  rank_G, order_G = _rank_G(key_G, cand_G)

  if strategy == "top_p" and prob_mode == "linear":
    if filter_type != "largest":
      raise ValueError("top_p in linear mode supports filter_type='largest' only")
    if value >= 1.0 and include_zero:
      return valid_G
    thr = value * jnp.sum(jnp.where(cand_G, scores_G, 0.0)) - eps
    sorted_s = jnp.where(cand_G[order_G], scores_G[order_G], -jnp.inf)
    cum_s = jnp.cumsum(jnp.where(jnp.isfinite(sorted_s), sorted_s, 0.0))
    # The walk may continue through position j only if every score up to j is positive.
    all_pos_upto = jnp.cumprod((sorted_s > 0).astype(jnp.int32)) > 0
    reached = all_pos_upto & (cum_s >= thr)
    any_reached = jnp.any(reached)
    stop_pos = jnp.argmax(reached)  # first position where the threshold is reached
    return cand_G & any_reached & (rank_G <= stop_pos)
  if strategy == "top_p" and prob_mode == "softmax":
    logits_G = jnp.where(cand_G, key_G, -jnp.inf)
    probs_G = jnp.exp(logits_G - jnp.max(logits_G))
    probs_G = probs_G / jnp.sum(probs_G)
    cum_p = jnp.cumsum(probs_G[order_G])
    # Keep position j while the mass before it is still short of value (j = 0 always kept).
    before = cum_p - probs_G[order_G]
    keep_sorted = (before < value) | (jnp.arange(num_slots) == 0)
    return cand_G & keep_sorted[rank_G]
  if strategy == "top_p":
    raise ValueError(f"prob_mode must be 'linear' or 'softmax', got {prob_mode!r}")
  if strategy == "top_k":
    # int() truncation of value·n exactly as Python does it, tabulated for every n.
    table = jnp.asarray([max(1, int(value * n)) for n in range(num_slots + 1)], jnp.int32)
    k = table[jnp.sum(valid_G.astype(jnp.int32))]
    return cand_G & (rank_G < k)
  if strategy == "top_k_abs":
    return cand_G & (rank_G < int(value))
  if strategy == "min_p":
    if filter_type == "largest":
      best = jnp.max(jnp.where(cand_G, scores_G, -jnp.inf))
      return cand_G & (scores_G >= value * best)
    worst = jnp.min(jnp.where(cand_G, scores_G, jnp.inf))
    return cand_G & (scores_G <= worst / value)
  raise ValueError(f"unknown filter strategy {strategy!r}; expected one of {STRATEGIES}")


def first_of_group_B(group_ids_B):
  """is_first[i] = no earlier episode has the same group id (the slot that represents the group)."""
  same_BxB = group_ids_B[:, None] == group_ids_B[None, :]
  earlier_BxB = jnp.tril(jnp.ones(same_BxB.shape, bool), k=-1)
  return ~jnp.any(same_BxB & earlier_BxB, axis=1)


def group_metric_B(scores_B, group_ids_B, metric="reward_variance"):
  """Per-episode value of its group's filter statistic.

  metric: "reward_variance" (RAGEN's name; the unbiased in-group reward STD, 0 for a
  singleton), "reward" (group mean) or "reward_sum" (group sum).
  """
  mean_B, std_B, n_B = group_mean_std(scores_B, group_ids_B)
  if metric == "reward_variance":
    return std_B
  if metric == "reward":
    return mean_B
  if metric == "reward_sum":
    return mean_B * n_B
  raise ValueError(f"unknown filter metric {metric!r}")


def episode_keep_mask(
    scores_B,
    group_ids_B,
    *,
    metric="reward_variance",
    strategy="top_p",
    value=1.0,
    filter_type="largest",
    include_zero=True,
    prob_mode="linear",
    eps=0.01,
):
  """Applies filter_groups to a batch of episodes and broadcasts the decision to episodes.

  Returns:
    (keep_B bool, stats dict): stats has "in_group_reward_std" (mean over groups of the
    unbiased in-group std, before filtering), "filter_kept_ratio" (kept groups / groups) and
    "filter_kept_count".
  """
  first_B = first_of_group_B(group_ids_B)
  stat_B = group_metric_B(scores_B, group_ids_B, metric)
  keep_slot_B = filter_groups(
      stat_B,
      strategy,
      value,
      valid_G=first_B,
      filter_type=filter_type,
      include_zero=include_zero,
      prob_mode=prob_mode,
      eps=eps,
  )
  # Every episode follows the decision taken for its group's representative slot.
  same_BxB = group_ids_B[:, None] == group_ids_B[None, :]
  keep_B = jnp.any(same_BxB & keep_slot_B[None, :], axis=1)
  n_groups = jnp.sum(first_B.astype(jnp.float32))
  _, std_B, _ = group_mean_std(scores_B, group_ids_B)
  kept = jnp.sum(keep_slot_B.astype(jnp.float32))
  stats = {
      "in_group_reward_std": jnp.sum(jnp.where(first_B, std_B, 0.0)) / jnp.maximum(n_groups, 1.0),
      "filter_kept_ratio": kept / jnp.maximum(n_groups, 1.0),
      "filter_kept_count": kept,
  }
  return keep_B, stats

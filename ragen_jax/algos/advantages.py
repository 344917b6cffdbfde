"""Advantage estimators: GAE with observation skipping, bi-level (turn, token) GAE, GRPO and the
outcome family, and GiGPO's critic-free turn-level credit.

Follows veRL's mathematics (shared/reference/rl_math.md §1.1, §2, §3) as pinned by RAGEN.
Every function is pure jnp and jit-able; none of them carries gradient in the trainer.

Dimensions:
  B: episodes (sequences) in the batch.
  T: token positions of a sequence.
  K: turns of an episode (GiGPO); N: entries of a flattened array (N = B or B·K); S: segments.

Names carry their shape as a suffix: `mask_BxT` is [B, T], `scores_B` is [B].
"""

import jax
from jax import lax
import jax.numpy as jnp

WHITEN_EPS = 1e-8  # inside the rsqrt of masked_whiten, and in masked_mean's denominator
GRPO_EPS = 1e-6  # added to the group standard deviation (not to the variance)


def masked_sum(x, mask):
  """Σ x·m, with non-finite entries of x at m = 0 replaced by 0 first (so 0·inf is not NaN)."""
  mask = mask.astype(x.dtype)
  return jnp.sum(jnp.where(mask > 0, x, 0.0) * mask)


def masked_mean(x, mask):
  """masked_sum(x, m) / (Σ m + 1e-8): the eps keeps an all-masked input at 0 instead of NaN."""
  return masked_sum(x, mask) / (jnp.sum(mask.astype(x.dtype)) + WHITEN_EPS)


def masked_var(x, mask):
  """Unbiased masked variance over all elements: v = mean_m((x − μ)²) · N/(N − 1).

  veRL raises when N = Σ m < 2. Under jit we cannot raise, so the result is NaN then; the
  train step checks the token count itself and skips such an update.
  """
  mask = mask.astype(x.dtype)
  n = jnp.sum(mask)
  mu = masked_mean(x, mask)
  var = masked_mean(jnp.square(x - mu), mask)
  return jnp.where(n >= 2, var * n / jnp.maximum(n - 1.0, 1.0), jnp.nan)


def masked_whiten(x, mask):
  """Batch-global whitening: (x − μ) · (v + 1e-8)^(−1/2), μ and unbiased v over all m = 1 entries.

  Applied to every element, masked ones included (they become (x − μ)/σ, usually non-zero).
  """
  mu = masked_mean(x, mask)
  var = masked_var(x, mask)
  return (x - mu) * lax.rsqrt(var + WHITEN_EPS)


def _gae_scan(rewards_BxT, values_BxT, valid_BxT, gamma, lam, reset_BxT=None):
  """Raw (unwhitened) masked-skip GAE, backward over t with carries nv ("next value") and g
  ("last GAE"), both 0 at t = T:
    reset_t: nv ← 0, g ← 0 first (the bootstrap ends there: a turn's last token)
    δ_t = r_t + γ·nv − V_t,   cand_t = δ_t + γλ·g
    valid_t: nv ← V_t, g ← cand_t;   otherwise the carries pass unchanged
    Â_t = g (after the update)
  """
  if reset_BxT is None:
    reset_BxT = jnp.zeros(valid_BxT.shape, bool)

  def step(carry, xs):
    next_value_B, last_gae_B = carry
    r_B, v_B, m_B, reset_B = xs
    next_value_B = jnp.where(reset_B, 0.0, next_value_B)
    last_gae_B = jnp.where(reset_B, 0.0, last_gae_B)
    delta_B = r_B + gamma * next_value_B - v_B
    cand_B = delta_B + gamma * lam * last_gae_B
    next_value_B = jnp.where(m_B, v_B, next_value_B)
    last_gae_B = jnp.where(m_B, cand_B, last_gae_B)
    return (next_value_B, last_gae_B), last_gae_B

  zeros_B = jnp.zeros(rewards_BxT.shape[0], jnp.float32)
  xs = (rewards_BxT.T, values_BxT.T, valid_BxT.T, reset_BxT.T)
  _, gae_TxB = lax.scan(step, (zeros_B, zeros_B), xs, reverse=True)
  return gae_TxB.T


def compute_gae(token_rewards_BxT, values_BxT, response_mask_BxT, gamma=1.0, lam=1.0):
  """GAE of current veRL: masked (observation / padding) positions are skipped (`_gae_scan`).

  So γ is applied once across a block of observation tokens, rewards and values at masked
  positions are ignored, a masked position holds the advantage of the next valid token (0 if
  none) and the bootstrap after the last valid token is 0.

  Returns:
    (advantages_BxT, returns_BxT): advantages = masked_whiten(Â, m) (batch-global, unbiased,
    eps 1e-8); returns = Â + V, taken before whitening (finite junk at masked positions).
  """
  values = values_BxT.astype(jnp.float32)
  valid = response_mask_BxT > 0
  raw_adv_BxT = _gae_scan(token_rewards_BxT.astype(jnp.float32), values, valid, gamma, lam)
  return masked_whiten(raw_adv_BxT, valid), raw_adv_BxT + values


def turn_ends(response_mask_BxT):
  """True at the last sampled token of each turn: a valid position whose successor is not."""
  valid = response_mask_BxT > 0
  next_valid = jnp.pad(valid[:, 1:], ((0, 0), (0, 1)))
  return valid & ~next_valid


def compute_bi_level_gae(
    token_rewards_BxT, values_BxT, response_mask_BxT, gamma=1.0, lam=1.0, high_level_gamma=0.95
):
  """RAGEN's bi-level GAE, with turns taken from the response mask.

  Turn level: GAE over the turns' last tokens e_1 < ... < e_K with discount `high_level_gamma`
  (γ_H), each turn's reward r_e (the reward on its last token) and the value there:
    δ_k = r_{e_k} + γ_H·V_{e_{k+1}} − V_{e_k},  g_k = δ_k + γ_H·λ·g_{k+1},  R̂_k = g_k + V_{e_k}.
  Token level: GAE inside each turn (γ, λ), the turn's last token earning R̂_k with no bootstrap
  beyond it, so every token of turn k is credited with that turn's return.

  Turns are the response mask's runs of sampled tokens. RAGEN finds them as the positions with a
  non-zero reward instead, which with its required `use_turn_scores=False` leaves one position
  and reduces the estimator to plain GAE; here a turn without reward is still a turn, so the
  critic learns a value per turn with or without per-turn rewards.

  Returns:
    (advantages_BxT, returns_BxT) as `compute_gae`: whitened advantages, and Â + V.
  """
  rewards = token_rewards_BxT.astype(jnp.float32)
  values = values_BxT.astype(jnp.float32)
  valid = response_mask_BxT > 0
  ends_BxT = turn_ends(response_mask_BxT)
  turn_gae_BxT = _gae_scan(rewards, values, ends_BxT, high_level_gamma, lam)
  turn_rewards_BxT = jnp.where(ends_BxT, turn_gae_BxT + values, rewards)
  raw_adv_BxT = _gae_scan(turn_rewards_BxT, values, valid, gamma, lam, reset_BxT=ends_BxT)
  return masked_whiten(raw_adv_BxT, valid), raw_adv_BxT + values


def _same_group_BxB(group_ids_B, valid_B):
  """same[i, j] = 1 when episodes i and j share a group id and j is a valid (kept) episode."""
  same = group_ids_B[:, None] == group_ids_B[None, :]
  return (same & valid_B[None, :]).astype(jnp.float32)


def group_mean_std(scores_B, group_ids_B, valid_B=None):
  """Per-episode statistics of its group: (mean_B, unbiased std_B, count_B).

  Groups are formed by equal ids among valid episodes, in O(B²) (B is at most a few thousand).
  The std of a singleton is reported as 0 here (callers apply their own singleton rule).
  """
  scores_B = scores_B.astype(jnp.float32)
  if valid_B is None:
    valid_B = jnp.ones(scores_B.shape, bool)
  same_BxB = _same_group_BxB(group_ids_B, valid_B)
  n_B = jnp.sum(same_BxB, axis=1)
  # A masked sum rather than a matmul: TPU/GPU default matmul precision would round the scores.
  mean_B = jnp.sum(same_BxB * scores_B[None, :], axis=1) / jnp.maximum(n_B, 1.0)
  sq_dev_BxB = jnp.square(scores_B[None, :] - mean_B[:, None])
  var_B = jnp.sum(same_BxB * sq_dev_BxB, axis=1) / jnp.maximum(n_B - 1.0, 1.0)
  std_B = jnp.where(n_B >= 2, jnp.sqrt(var_B), 0.0)
  return mean_B, std_B, n_B


def grpo_advantages(scores_B, group_ids_B, norm_by_std=True, eps=GRPO_EPS, valid_B=None):
  """GRPO per-sequence advantages (veRL's loop implementation).

    |g| ≥ 2: μ_g = mean, σ_g = unbiased std;  |g| = 1 (singleton): μ_g = 0, σ_g = 1
    a_i = (s_i − μ_g)/(σ_g + eps)   if norm_by_std   (eps on the std, not the variance)
    a_i = s_i − μ_g                 otherwise (Dr.GRPO)
  A group of equal scores gets 0; a singleton keeps its raw score s_i/(1 + eps).
  Invalid episodes (valid_B False) neither contribute to nor receive statistics (they get 0).
  """
  scores_B = scores_B.astype(jnp.float32)
  if valid_B is None:
    valid_B = jnp.ones(scores_B.shape, bool)
  mean_B, std_B, n_B = group_mean_std(scores_B, group_ids_B, valid_B)
  singleton_B = n_B < 2
  mean_B = jnp.where(singleton_B, 0.0, mean_B)
  std_B = jnp.where(singleton_B, 1.0, std_B)
  adv_B = scores_B - mean_B
  if norm_by_std:
    adv_B = adv_B / (std_B + eps)
  return jnp.where(valid_B, adv_B, 0.0)


def brpo_advantages(scores_B, eps=GRPO_EPS, valid_B=None):
  """BRPO (batch-normalised rewards): a_i = (s_i − μ_batch)/(σ_batch + eps), unbiased σ.

  The whole (valid part of the) batch is one group, so the singleton rule of GRPO applies
  when only one episode is valid.
  """
  return grpo_advantages(scores_B, jnp.zeros(scores_B.shape, jnp.int32), True, eps, valid_B)


def outcome_advantages(
    scores_B, group_ids_B, response_mask_BxT, estimator, valid_B=None, rows_R=None
):
  """Critic-free estimators, a per-sequence scalar broadcast over tokens: A_{i,t} = a_i·m_{i,t}.

  estimator: "arpo" (a_i = s_i, raw), "brpo" (batch mean/std), "grpo" (group mean/std),
  "drgrpo" (group mean only). Returns (advantages_BxT, returns_BxT) with returns = advantages,
  as in veRL. With `rows_R` (one row per turn: the episode of each row) the statistics are over
  episodes, each counted once, and row r carries its episode's a.
  """
  scores_B = scores_B.astype(jnp.float32)
  if valid_B is None:
    valid_B = jnp.ones(scores_B.shape, bool)
  if estimator == "arpo":
    adv_B = jnp.where(valid_B, scores_B, 0.0)
  elif estimator == "brpo":
    adv_B = brpo_advantages(scores_B, valid_B=valid_B)
  elif estimator == "grpo":
    adv_B = grpo_advantages(scores_B, group_ids_B, True, valid_B=valid_B)
  elif estimator == "drgrpo":
    adv_B = grpo_advantages(scores_B, group_ids_B, False, valid_B=valid_B)
  else:
    raise ValueError(f"unknown outcome estimator {estimator!r}")
  if rows_R is not None:
    adv_B = adv_B[rows_R]
  adv_BxT = adv_B[:, None] * response_mask_BxT.astype(jnp.float32)
  return adv_BxT, adv_BxT


def explained_variance(values_BxT, returns_BxT, mask_BxT):
  """veRL's critic/vf_explained_var: 1 − Var_m(R − V) / (Var_m(R) + 1e-5), unbiased variances."""
  var_resid = masked_var(returns_BxT - values_BxT, mask_BxT)
  var_ret = masked_var(returns_BxT, mask_BxT)
  return 1.0 - var_resid / (var_ret + 1e-5)


# ---------------------------------------------------------------- GiGPO (turn-level credit)

GIGPO_NORMS = ("mean", "mean_std")  # verl-agent's mean_norm (its default) and mean_std_norm


def segment_stats(x_N, keys, valid_N):
  """Per-entry statistics of its segment: the valid entries that agree on every array of `keys`.

  Returns (mean_N, unbiased std_N, count_N); a segment of one has std 0, and invalid entries
  count 0 and get mean 0. Sort-based, O(N log N), so N = B·K turns stays cheap where the
  O(B²) comparison of `group_mean_std` would not.
  """
  n = x_N.shape[0]
  x_N = x_N.astype(jnp.float32)
  # lexsort's last key is the primary one: valid entries first, then by the keys in order.
  order_N = jnp.lexsort(tuple(reversed(keys)) + (~valid_N,))
  new_N = jnp.zeros(n, bool)  # True where a segment starts (the first entry always does)
  for key_N in [k[order_N] for k in keys] + [valid_N[order_N]]:
    new_N = new_N | jnp.concatenate([jnp.ones(1, bool), key_N[1:] != key_N[:-1]])
  seg_N = jnp.cumsum(new_N) - 1  # S: segment ids (at most N)
  w_N = valid_N[order_N].astype(jnp.float32)
  xs_N = x_N[order_N]
  count_S = jax.ops.segment_sum(w_N, seg_N, num_segments=n)
  mean_S = jax.ops.segment_sum(w_N * xs_N, seg_N, num_segments=n) / jnp.maximum(count_S, 1.0)
  sq_S = jax.ops.segment_sum(w_N * jnp.square(xs_N - mean_S[seg_N]), seg_N, num_segments=n)
  std_S = jnp.where(count_S >= 2, jnp.sqrt(sq_S / jnp.maximum(count_S - 1.0, 1.0)), 0.0)
  unsort = lambda s_S: jnp.zeros(n, s_S.dtype).at[order_N].set(s_S[seg_N])
  valid_f = valid_N.astype(jnp.float32)
  return unsort(mean_S) * valid_f, unsort(std_S) * valid_f, unsort(count_S) * valid_f


def _group_normalise(x_N, mean_N, std_N, count_N, norm, eps):
  """x − mean (`mean`), or (x − mean)/(std + eps) (`mean_std`); 0 in a group of fewer than two."""
  centred_N = x_N - mean_N
  if norm == "mean_std":
    centred_N = centred_N / (std_N + eps)
  elif norm != "mean":
    raise ValueError(f"gigpo norm must be one of {GIGPO_NORMS}, got {norm!r}")
  return jnp.where(count_N >= 2, centred_N, 0.0)


def discounted_turn_returns(turn_rewards_BxK, turn_mask_BxK, gamma):
  """R_t = Σ_{j ≥ t, j valid} γ^(j−t)·r_j: each turn's discounted return over the episode's later
  valid turns (the exponent counts turn indices). K is small, so a [K, K] weight table."""
  k = turn_rewards_BxK.shape[1]
  ahead_KxK = jnp.arange(k)[None, :] - jnp.arange(k)[:, None]  # j − t
  w_KxK = jnp.where(ahead_KxK >= 0, jnp.power(gamma, jnp.maximum(ahead_KxK, 0)), 0.0)
  r_BxK = jnp.where(turn_mask_BxK, turn_rewards_BxK.astype(jnp.float32), 0.0)
  # An elementwise sum, not a matmul (accelerators' default matmul precision rounds).
  return jnp.sum(r_BxK[:, None, :] * w_KxK[None].astype(jnp.float32), axis=-1)


def gigpo_terms(turn_rewards_BxK, turn_mask_BxK, state_keys_BxK, group_ids_B, *, gamma, norm, eps):
  """(episode_adv_B, A_S step_adv_BxK without ω, step_group_size_BxK): see `gigpo`."""
  mask_BxK = turn_mask_BxK > 0
  b, k = mask_BxK.shape
  valid_B = jnp.any(mask_BxK, axis=1)  # an episode without a valid turn counts nowhere
  score_B = jnp.sum(jnp.where(mask_BxK, turn_rewards_BxK.astype(jnp.float32), 0.0), axis=1)
  e_mean, e_std, e_count = segment_stats(score_B, (group_ids_B,), valid_B)
  episode_adv_B = _group_normalise(score_B, e_mean, e_std, e_count, norm, eps)
  returns_N = discounted_turn_returns(turn_rewards_BxK, mask_BxK, gamma).reshape(-1)
  groups_N = jnp.broadcast_to(group_ids_B[:, None], (b, k)).reshape(-1)
  s_mean, s_std, s_count = segment_stats(
      returns_N, (groups_N, state_keys_BxK.reshape(-1)), mask_BxK.reshape(-1)
  )
  step_adv_N = _group_normalise(returns_N, s_mean, s_std, s_count, norm, eps)
  return episode_adv_B, step_adv_N.reshape(b, k), s_count.reshape(b, k)


def gigpo(
    turn_rewards_BxK,
    turn_mask_BxK,
    state_keys_BxK,
    group_ids_B,
    *,
    gamma,
    omega,
    norm,
    eps=GRPO_EPS,
):
  """GiGPO's two advantages (arXiv 2505.10978; verl-agent's rules, per-episode counting).

  K is the turn axis. Episode level: score_b = Σ_k r_bk over valid turns; within its group (equal
  `group_ids_B` among episodes with a valid turn, each counted once)
    A_E = score − mean        (`mean`),   or (score − mean)/(std + eps)   (`mean_std`, ddof 1).
  Step level: R_bk = `discounted_turn_returns`; valid turns of one group with equal integer state
  keys form a step group, A_S = R − its mean (or /(std + eps)).
  A group of one (episode or step) gets 0: it has no baseline but itself (verl-agent keeps a lone
  episode's raw score instead).

  Returns:
    (episode_adv_B, step_adv_BxK): A_E, and ω·A_S (0 on invalid turns), so a token of turn k
    trains on episode_adv_B[b] + step_adv_BxK[b, k].
  """
  episode_adv_B, step_adv_BxK, _ = gigpo_terms(
      turn_rewards_BxK, turn_mask_BxK, state_keys_BxK, group_ids_B, gamma=gamma, norm=norm, eps=eps
  )
  return episode_adv_B, omega * step_adv_BxK


def gigpo_token_advantages(
    turn_rewards_BxK,
    turn_mask_BxK,
    state_keys_BxK,
    token_turns_BxT,
    group_ids_B,
    response_mask_BxT,
    *,
    gamma,
    omega,
    norm,
    rows_R=None,
):
  """GiGPO on token rows: (advantages_BxT, returns_BxT, step_group_share).

  Each sampled token (response_mask_BxT) carries A_E + ω·A_S of its turn (`token_turns_BxT`,
  -1 off the replies). Rows are episodes, or with `rows_R` (the episode of each row) one row
  per turn. `step_group_share` is the share of valid turns whose step group holds more than
  one turn: 0 means the step level has nothing to compare.
  """
  mask_BxK = turn_mask_BxK > 0
  episode_adv_B, step_adv_BxK, count_BxK = gigpo_terms(
      turn_rewards_BxK, mask_BxK, state_keys_BxK, group_ids_B, gamma=gamma, norm=norm, eps=GRPO_EPS
  )
  turn_adv_BxK = episode_adv_B[:, None] + omega * step_adv_BxK
  if rows_R is not None:
    turn_adv_BxK = turn_adv_BxK[rows_R]
  k = turn_adv_BxK.shape[1]
  tokens_BxT = jnp.take_along_axis(turn_adv_BxK, jnp.clip(token_turns_BxT, 0, k - 1), axis=1)
  on_turn_BxT = (response_mask_BxT > 0) & (token_turns_BxT >= 0)
  adv_BxT = jnp.where(on_turn_BxT, tokens_BxT, 0.0)
  share = masked_mean((count_BxK >= 2).astype(jnp.float32), mask_BxK)
  return adv_BxT, adv_BxT, share

"""StarPO losses: loss aggregation, clipped policy loss, clipped value loss, KL estimators,
rollout-correction weights.

veRL's mathematics as pinned by RAGEN (verl v0.6.1; shared/reference/rl_math.md §4-§7).
All functions are pure jnp, jit-able and differentiable in their first argument.

Dimensions:
  B: sequences in the (micro-)batch.
  T: token positions.
"""

from jax import lax
import jax.numpy as jnp

from ragen_jax.algos.advantages import masked_mean

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
ROLLOUT_CORRECTIONS = ("none", "tis", "icepop", "seq_mask")
LOG_RATIO_CLAMP = 20.0  # |log π/π_old| clamp in the policy loss and on k3's exponent
K3_VALUE_CLAMP = 10.0  # k3 value clamp


def agg_loss(loss_BxT, mask_BxT, mode="token-mean", loss_scale_factor=None):
  """Aggregates a per-token loss with veRL v0.6.1's agg_loss.

  With S_i = Σ_t m L, n_i = Σ_t m, v_i = [n_i > 0] (fully masked rows are excluded):
    token-mean:               Σ_i S_i / (Σ_i n_i + 1e-8)
    seq-mean-token-sum:       Σ_i v_i S_i / (Σ_i v_i + 1e-8)
    seq-mean-token-mean:      Σ_i v_i S_i/(n_i + 1e-8) / (Σ_i v_i + 1e-8)
    seq-mean-token-sum-norm:  Σ_i S_i / F, F = loss_scale_factor or T (Dr.GRPO; no row count)

  Non-finite losses at masked positions are zeroed before the sums.
  """
  mask = mask_BxT.astype(jnp.float32)
  loss = jnp.where(mask > 0, loss_BxT, 0.0) * mask
  if mode == "token-mean":
    return jnp.sum(loss) / (jnp.sum(mask) + 1e-8)
  row_sum_B = jnp.sum(loss, axis=-1)
  row_n_B = jnp.sum(mask, axis=-1)
  row_valid_B = (row_n_B > 0).astype(jnp.float32)
  if mode == "seq-mean-token-sum":
    return jnp.sum(row_valid_B * row_sum_B) / (jnp.sum(row_valid_B) + 1e-8)
  if mode == "seq-mean-token-mean":
    row_mean_B = row_sum_B / (row_n_B + 1e-8)
    return jnp.sum(row_valid_B * row_mean_B) / (jnp.sum(row_valid_B) + 1e-8)
  if mode == "seq-mean-token-sum-norm":
    factor = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return jnp.sum(row_sum_B) / factor
  raise ValueError(f"unknown agg_mode {mode!r}; expected one of {AGG_MODES}")


def policy_loss(
    logp_BxT,
    old_logp_BxT,
    advantages_BxT,
    mask_BxT,
    *,
    clip_low,
    clip_high,
    clip_c,
    agg_mode="token-mean",
    loss_scale_factor=None,
    weights_BxT=None,
):
  """Dual-clip PPO policy loss with decoupled clip range (veRL compute_policy_loss_vanilla).

  The clip range comes from the caller (`PPOConfig.clip_low`, `clip_high`, `clip_c`: their
  defaults live there only).

    ℓ = clamp(logp − old_logp, −20, 20), ρ = e^ℓ
    L1 = −A·ρ,  L2 = −A·clip(ρ, 1 − clip_low, 1 + clip_high),  Lc = max(L1, L2)
    L  = min(Lc, −A·c) if A < 0 else Lc              (dual clip on negative advantages)
    L ← L·w  with `weights_BxT` w (rollout correction), after clipping; agg_loss's normaliser
             is unchanged
    pg_loss = agg_loss(L, m, agg_mode)   (loss_scale_factor: see agg_loss)

  Metrics (masked means with the 1e-8 denominator):
    ppo_kl = mean(−ℓ);  pg_clipfrac = mean([L2 > L1]);
    pg_clipfrac_lower = mean([Lc > L3] ∧ [A < 0])   (dual-clip activations).

  Returns:
    (pg_loss, metrics dict with "pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl").
  """
  adv = advantages_BxT.astype(jnp.float32)
  log_ratio = jnp.clip(logp_BxT - old_logp_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  loss1 = -adv * ratio
  loss2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss_clipped = jnp.maximum(loss1, loss2)
  loss3 = -adv * clip_c
  loss_dual = jnp.minimum(loss_clipped, loss3)
  loss_BxT = jnp.where(adv < 0, loss_dual, loss_clipped)
  if weights_BxT is not None:
    loss_BxT = loss_BxT * weights_BxT
  pg_loss = agg_loss(loss_BxT, mask_BxT, agg_mode, loss_scale_factor)
  metrics = {
      "pg_loss": pg_loss,
      "ppo_kl": masked_mean(-log_ratio, mask_BxT),
      "pg_clipfrac": masked_mean((loss2 > loss1).astype(jnp.float32), mask_BxT),
      "pg_clipfrac_lower": masked_mean(
          ((loss_clipped > loss3) & (adv < 0)).astype(jnp.float32), mask_BxT
      ),
  }
  return pg_loss, metrics


def _rollout_log_ratio(old_logp_BxT, sampler_logp_BxT, mask_BxT):
  """log r = clamp(old − sampler, ±20), 0 off the mask (whatever the padding holds there)."""
  diff = old_logp_BxT.astype(jnp.float32) - sampler_logp_BxT.astype(jnp.float32)
  return jnp.where(mask_BxT > 0, jnp.clip(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def rollout_correction_weights(old_logp_BxT, sampler_logp_BxT, mask_BxT, *, mode, cap):
  """Per-token weights of the policy loss correcting for the sampler/trainer mismatch.

  r = exp(clamp(old_logp − sampler_logp, ±20)) per token: the trained policy at the start of
  the step (π_old, recomputed) over the policy that sampled (μ). With C = `cap` (>= 1):
    tis:      w = min(r, C)                                  (truncated importance sampling)
    icepop:   w = [1/C <= r <= C]                            (out-of-band tokens masked)
    seq_mask: w = [1/C <= g <= C] for every token of a row, g = exp(mean_m log r), the row's
              geometric mean over its loss tokens          (the whole sequence kept or masked)
    none:     w = 1
  w = 0 off the mask. The weights are constants of the update (no gradient).
  """
  if mode not in ROLLOUT_CORRECTIONS:
    raise ValueError(f"unknown rollout correction {mode!r}; expected one of {ROLLOUT_CORRECTIONS}")
  on_BxT = mask_BxT > 0
  log_r_BxT = _rollout_log_ratio(old_logp_BxT, sampler_logp_BxT, mask_BxT)
  r_BxT = jnp.exp(log_r_BxT)
  if mode == "none":
    w_BxT = jnp.ones_like(r_BxT)
  elif mode == "tis":
    w_BxT = jnp.minimum(r_BxT, cap)
  elif mode == "icepop":
    w_BxT = ((r_BxT >= 1.0 / cap) & (r_BxT <= cap)).astype(jnp.float32)
  else:
    n_B = jnp.sum(on_BxT, axis=-1)
    g_B = jnp.exp(jnp.sum(log_r_BxT, axis=-1) / jnp.maximum(n_B, 1))
    w_BxT = jnp.broadcast_to(((g_B >= 1.0 / cap) & (g_B <= cap))[:, None], r_BxT.shape)
    w_BxT = w_BxT.astype(jnp.float32)
  return lax.stop_gradient(jnp.where(on_BxT, w_BxT, 0.0))


def rollout_correction_metrics(old_logp_BxT, sampler_logp_BxT, mask_BxT, *, mode, cap):
  """Statistics of r over the loss tokens (0 when there are none):
  `rollout_correction/ratio_{mean,min,max}`, and the share of loss tokens whose loss is
  truncated (tis: r > C, `truncated_share`) or masked (icepop, seq_mask: w = 0, `masked_share`).
  """
  on_BxT = mask_BxT > 0
  maskf_BxT = on_BxT.astype(jnp.float32)
  r_BxT = jnp.exp(_rollout_log_ratio(old_logp_BxT, sampler_logp_BxT, mask_BxT))
  any_on = jnp.any(on_BxT)
  metrics = {
      "ratio_mean": masked_mean(r_BxT, maskf_BxT),
      "ratio_min": jnp.where(any_on, jnp.min(jnp.where(on_BxT, r_BxT, jnp.inf)), 0.0),
      "ratio_max": jnp.max(jnp.where(on_BxT, r_BxT, 0.0)),
  }
  if mode == "tis":
    metrics["truncated_share"] = masked_mean((r_BxT > cap).astype(jnp.float32), maskf_BxT)
  elif mode in ("icepop", "seq_mask"):
    w_BxT = rollout_correction_weights(old_logp_BxT, sampler_logp_BxT, mask_BxT, mode=mode, cap=cap)
    metrics["masked_share"] = masked_mean((w_BxT == 0).astype(jnp.float32), maskf_BxT)
  return {f"rollout_correction/{k}": v for k, v in metrics.items()}


def value_loss(
    values_BxT,
    old_values_BxT,
    returns_BxT,
    mask_BxT,
    cliprange=0.5,
    agg_mode="token-mean",
    loss_scale_factor=None,
):
  """Clipped value loss (veRL compute_value_loss).

    v̂c = clip(v̂, V_old − κ, V_old + κ);  l1 = (v̂ − R)², l2 = (v̂c − R)²
    vf_loss = 0.5 · agg_loss(max(l1, l2), m, agg_mode);  vf_clipfrac = mean_m([l2 > l1])

  Returns:
    (vf_loss, metrics dict with "vf_loss", "vf_clipfrac").
  """
  clipped = jnp.clip(values_BxT, old_values_BxT - cliprange, old_values_BxT + cliprange)
  loss1 = jnp.square(values_BxT - returns_BxT)
  loss2 = jnp.square(clipped - returns_BxT)
  vf_loss = 0.5 * agg_loss(jnp.maximum(loss1, loss2), mask_BxT, agg_mode, loss_scale_factor)
  metrics = {
      "vf_loss": vf_loss,
      "vf_clipfrac": masked_mean((loss2 > loss1).astype(jnp.float32), mask_BxT),
  }
  return vf_loss, metrics


def kl_penalty(logp_BxT, ref_logp_BxT, kind="k1"):
  """Per-token KL estimators of π vs π_ref, with d = logp − ref_logp.

  k1 / kl:          d
  abs:              |d|
  k2 / mse:         ½ d²
  k3 / low_var_kl:  k = clamp(−d, −20, 20); clamp(e^k − k − 1, −10, 10)
  """
  d = logp_BxT - ref_logp_BxT
  if kind in ("k1", "kl"):
    return d
  if kind == "abs":
    return jnp.abs(d)
  if kind in ("k2", "mse"):
    return 0.5 * jnp.square(d)
  if kind in ("k3", "low_var_kl"):
    k = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(k) - k - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)
  raise ValueError(f"unknown KL kind {kind!r}; expected one of {KL_KINDS}")

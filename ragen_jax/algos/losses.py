"""StarPO losses: loss aggregation, the policy loss in three modes (PPO, GSPO, CISPO), clipped
value loss, KL estimators, rollout-correction weights.

veRL's mathematics as pinned by RAGEN (verl v0.6.1; shared/reference/rl_math.md §4-§7); GSPO
(arXiv 2507.18071) and CISPO (arXiv 2506.13585) as their papers state them
(shared/reference/algorithms_2026.md). All functions are pure jnp, jit-able and differentiable in
their first argument.

Dimensions:
  B: sequences in the (micro-)batch: the update's rows (an episode's conversation, or one turn
     of it with a context window).
  T: token positions.
"""

import dataclasses
from typing import Annotated, Any, Callable, NamedTuple

from jax import lax
import jax.numpy as jnp

from ragen_jax.algos.advantages import masked_mean
from ragen_jax.config_checks import PositiveFloat
from ragen_jax.config_checks import Range

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


class PolicySettings(NamedTuple):
  """A policy loss's settings with nothing left to its mode (`PolicyLossMode.settings`)."""

  mode: str  # a POLICY_LOSSES name
  clip_low: float
  clip_high: float
  clip_c: float | None  # PPO's dual clip; None: none (GSPO and CISPO never read it)
  agg_mode: str


def _clip_metrics(log_ratio_BxT, clipped_BxT, mask_BxT):
  """What every mode logs: ppo_kl = mean(−ℓ) and pg_clipfrac = mean([the clip binds])."""
  return {
      "ppo_kl": masked_mean(-log_ratio_BxT, mask_BxT),
      "pg_clipfrac": masked_mean(clipped_BxT.astype(jnp.float32), mask_BxT),
  }


def _ppo_token_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, s: PolicySettings):
  """PPO's per-token loss with the decoupled clip range and the dual clip (see policy_loss)."""
  log_ratio = jnp.clip(logp_BxT - old_logp_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  loss1 = -adv_BxT * ratio
  loss2 = -adv_BxT * jnp.clip(ratio, 1.0 - s.clip_low, 1.0 + s.clip_high)
  loss_clipped = jnp.maximum(loss1, loss2)
  metrics = _clip_metrics(log_ratio, loss2 > loss1, mask_BxT)
  if s.clip_c is None:
    return loss_clipped, {**metrics, "pg_clipfrac_lower": jnp.zeros((), jnp.float32)}
  loss3 = -adv_BxT * s.clip_c
  loss_dual = jnp.minimum(loss_clipped, loss3)
  lower_BxT = (loss_clipped > loss3) & (adv_BxT < 0)
  metrics["pg_clipfrac_lower"] = masked_mean(lower_BxT.astype(jnp.float32), mask_BxT)
  return jnp.where(adv_BxT < 0, loss_dual, loss_clipped), metrics


def sequence_log_ratio(logp_BxT, old_logp_BxT, mask_BxT):
  """log s_B = clamp(Σ_t m (logp − old_logp) / |y|, ±20): GSPO's length-normalised sequence
  log-ratio of each row (0 for a row without loss tokens)."""
  on_BxT = mask_BxT > 0
  n_B = jnp.sum(on_BxT, axis=-1)
  diff_BxT = jnp.where(on_BxT, logp_BxT - old_logp_BxT, 0.0)
  mean_B = jnp.sum(diff_BxT, axis=-1) / jnp.maximum(n_B, 1)
  return jnp.clip(mean_B, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _gspo_token_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, s: PolicySettings):
  """GSPO-token's per-token loss (see policy_loss), and the rows' sequence-ratio statistics."""
  log_s_B = lax.stop_gradient(sequence_log_ratio(logp_BxT, old_logp_BxT, mask_BxT))
  # The value is s_i at every token; the gradient flows through each token's own log-prob. The
  # zero (logp − sg(logp)) is added first so the value is exactly s_i (the order of verl #2775).
  log_ratio = (logp_BxT - lax.stop_gradient(logp_BxT)) + log_s_B[:, None]
  ratio = jnp.exp(log_ratio)
  loss1 = -adv_BxT * ratio
  loss2 = -adv_BxT * jnp.clip(ratio, 1.0 - s.clip_low, 1.0 + s.clip_high)
  token_log_ratio = jnp.clip(logp_BxT - old_logp_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  metrics = _clip_metrics(token_log_ratio, loss2 > loss1, mask_BxT)
  rows_B = jnp.any(mask_BxT > 0, axis=-1)
  s_B = jnp.exp(log_s_B)
  metrics["seq_ratio_mean"] = masked_mean(s_B, rows_B)
  metrics["seq_ratio_min"] = jnp.where(
      jnp.any(rows_B), jnp.min(jnp.where(rows_B, s_B, jnp.inf)), 0.0
  )
  metrics["seq_ratio_max"] = jnp.max(jnp.where(rows_B, s_B, 0.0))
  return jnp.maximum(loss1, loss2), metrics


def _cispo_token_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, s: PolicySettings):
  """CISPO's per-token loss (see policy_loss), and the mean of its clipped weights."""
  log_ratio = jnp.clip(logp_BxT - old_logp_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  low, high = 1.0 - s.clip_low, 1.0 + s.clip_high
  weight_BxT = lax.stop_gradient(jnp.clip(ratio, low, high))
  metrics = _clip_metrics(log_ratio, (ratio < low) | (ratio > high), mask_BxT)
  metrics["is_weight_mean"] = masked_mean(weight_BxT, mask_BxT)
  return -weight_BxT * adv_BxT * logp_BxT, metrics


# A lower clip 1 − clip_low must stay above 0 where the clip gates the loss (PPO, GSPO); CISPO's
# weight may have no lower bound at all (clip_low >= 1, MiniMax-M1's choice).
_UNIT_OPEN = Annotated[float, Range(0, 1, open_low=True, open_high=True)]


@dataclasses.dataclass(frozen=True)
class PolicyLossMode:
  """One policy loss: its per-token loss and the settings a None stands for under it.

  `token_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, settings) -> (loss_BxT, metrics)` is
  the loss of each token before the rollout-correction weights and the aggregation.
  """

  name: str
  token_loss: Callable[..., Any]
  clip_low: float  # default ε_low
  clip_high: float  # default ε_high
  agg_mode: str  # default aggregation (AGG_MODES)
  clip_low_type: Any  # the config_checks annotation an explicit clip_low must satisfy

  def settings(self, clip_low=None, clip_high=None, clip_c=None, agg_mode=None):
    """The settings with each None replaced by this mode's default: the one place they are
    resolved (`policy_loss` and `PPOConfig.policy` both call it)."""
    return PolicySettings(
        mode=self.name,
        clip_low=self.clip_low if clip_low is None else clip_low,
        clip_high=self.clip_high if clip_high is None else clip_high,
        clip_c=clip_c,
        agg_mode=self.agg_mode if agg_mode is None else agg_mode,
    )


# Defaults: PPO, RAGEN's clip-higher (0.2 / 0.28, DAPO); GSPO, the paper's and verl's recipe
# (3e-4 / 4e-4, sequence-mean); CISPO, no lower bound (MiniMax-M1: ε_low "large"; 1 puts it at
# 0, like verl's example's 10 or SkyRL's 1) and verl's example ε_high 0.2
# (examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh), token-mean as the paper's 1/Σ|y_i|.
POLICY_LOSS_MODES = {
    "ppo": PolicyLossMode("ppo", _ppo_token_loss, 0.2, 0.28, "token-mean", _UNIT_OPEN),
    "gspo": PolicyLossMode("gspo", _gspo_token_loss, 3e-4, 4e-4, "seq-mean-token-mean", _UNIT_OPEN),
    "cispo": PolicyLossMode("cispo", _cispo_token_loss, 1.0, 0.2, "token-mean", PositiveFloat),
}
POLICY_LOSSES = tuple(POLICY_LOSS_MODES)


def policy_loss(
    logp_BxT,
    old_logp_BxT,
    advantages_BxT,
    mask_BxT,
    *,
    clip_low=None,
    clip_high=None,
    clip_c=None,
    agg_mode=None,
    loss_scale_factor=None,
    weights_BxT=None,
    mode="ppo",
):
  """The policy loss of `mode` (POLICY_LOSSES); a None setting takes the mode's default
  (POLICY_LOSS_MODES; `PPOConfig.policy` resolves the config's the same way).

  With ℓ_t = clamp(logp_t − old_logp_t, ±20), ρ_t = e^ℓ_t, ε = (clip_low, clip_high), m the mask:

    ppo (veRL compute_policy_loss_vanilla):
      L1 = −A·ρ,  L2 = −A·clip(ρ, 1 − ε_low, 1 + ε_high),  Lc = max(L1, L2)
      L  = min(Lc, −A·c) if A < 0 else Lc                    (dual clip c = clip_c; None: none)
    gspo (GSPO-token): per row i, s_i = exp(clamp(Σ_t m (logp − old_logp) / |y_i|, ±20)),
      s_it = sg(s_i)·exp(logp_t − sg(logp_t)) (value s_i, gradient s_i per unit of logp_t)
      L  = max(−A·s_it, −A·clip(s_it, 1 − ε_low, 1 + ε_high))   (no dual clip)
    cispo: w = sg(clip(ρ, 1 − ε_low, 1 + ε_high));  L = −w·A·logp   (every token keeps a
      gradient, −w·A per unit of logp; no dual clip)

  Then L ← L·w_rc with the rollout-correction `weights_BxT` (after clipping; the normaliser is
  unchanged) and pg_loss = agg_loss(L, m, agg_mode) (loss_scale_factor: see agg_loss). A row is a
  sequence: GSPO's s_i spans all of a row's loss tokens. Per-token advantages (GAE, GiGPO) enter
  every mode token by token.

  Metrics (masked means with the 1e-8 denominator): every mode ppo_kl = mean(−ℓ) and pg_clipfrac,
  the share of tokens where the clip binds (ppo, gspo: [L2 > L1]; cispo: the weight clipped);
  ppo pg_clipfrac_lower = mean([Lc > −A·c] ∧ [A < 0]) (dual-clip activations); gspo
  seq_ratio_{mean,min,max} of s_i over rows with loss tokens; cispo is_weight_mean = mean(w).

  Returns:
    (pg_loss, metrics dict with "pg_loss" and the mode's metrics above).
  """
  loss_mode = POLICY_LOSS_MODES[mode]
  settings = loss_mode.settings(clip_low, clip_high, clip_c, agg_mode)
  adv = advantages_BxT.astype(jnp.float32)
  loss_BxT, metrics = loss_mode.token_loss(logp_BxT, old_logp_BxT, adv, mask_BxT, settings)
  if weights_BxT is not None:
    loss_BxT = loss_BxT * weights_BxT
  pg_loss = agg_loss(loss_BxT, mask_BxT, settings.agg_mode, loss_scale_factor)
  return pg_loss, {"pg_loss": pg_loss, **metrics}


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

"""Stage 5 of the train step (`train_step.py`): batch statistics under veRL's and RAGEN's names.

Dimensions: B rows.  T tokens.
"""

import jax.numpy as jnp

from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import losses
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.step_losses import aggregate
from ragen_jax.algos.step_records import Advantages
from ragen_jax.algos.step_records import OldPass
from ragen_jax.algos.step_records import Selection


def correction(cfg: PPOConfig):
  """The rollout-correction keywords of `losses.rollout_correction_weights` and its metrics."""
  return dict(mode=cfg.rollout_correction, cap=cfg.rollout_correction_cap)


def batch_metrics(cfg: PPOConfig, sel: Selection, old: OldPass, adv: Advantages):
  """Stage 5: batch statistics under veRL's and RAGEN's names."""
  mask_BxT, skipped = sel.mask_BxT, adv.skipped
  maskf_BxT = mask_BxT.astype(jnp.float32)
  adv_BxT, returns_BxT = adv.adv_BxT, adv.returns_BxT
  metrics = {
      "actor/entropy": aggregate(cfg, old.entropy_BxT, maskf_BxT),
      "critic/advantages/mean": adv_lib.masked_mean(adv_BxT, maskf_BxT),
  }
  adv_max = jnp.max(jnp.where(mask_BxT, adv_BxT, -jnp.inf))
  adv_min = jnp.min(jnp.where(mask_BxT, adv_BxT, jnp.inf))
  metrics["critic/advantages/max"] = jnp.where(skipped, 0.0, adv_max)
  metrics["critic/advantages/min"] = jnp.where(skipped, 0.0, adv_min)
  metrics["critic/returns/mean"] = adv_lib.masked_mean(
      jnp.where(mask_BxT, returns_BxT, 0.0), maskf_BxT
  )
  if adv.values_BxT is not None:
    metrics["critic/values/mean"] = adv_lib.masked_mean(adv.values_BxT, maskf_BxT)
    metrics["critic/vf_explained_var"] = jnp.where(
        skipped, 0.0, adv_lib.explained_variance(adv.values_BxT, returns_BxT, maskf_BxT)
    )
  # Train/inference mismatch (veRL's training/rollout_probs_diff_*): the sampler's token
  # probabilities against the training forward's; large values mean the update is off-policy.
  probs_diff_BxT = jnp.abs(
      jnp.exp(old.logp_BxT) - jnp.exp(sel.batch.logprobs_BxT.astype(jnp.float32))
  )
  metrics["training/rollout_probs_diff_mean"] = adv_lib.masked_mean(probs_diff_BxT, maskf_BxT)
  metrics["training/rollout_probs_diff_max"] = jnp.max(jnp.where(mask_BxT, probs_diff_BxT, 0.0))
  if cfg.rollout_correction != "none":
    metrics.update(
        losses.rollout_correction_metrics(
            old.logp_BxT, sel.batch.logprobs_BxT, mask_BxT, **correction(cfg)
        )
    )
  if adv.step_group_share is not None:  # whether GiGPO's step level has anything to compare
    metrics["gigpo/step_group_share"] = adv.step_group_share
  if adv.distill_metrics is not None:
    metrics.update(adv.distill_metrics)
  for name in ("in_group_reward_std", "filter_kept_ratio", "filter_kept_count"):
    metrics[f"rollout/{name}"] = sel.stats[name]
  metrics["rollout/skipped"] = skipped.astype(jnp.float32)
  return metrics

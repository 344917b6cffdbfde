"""The train step's forward pass and loss terms: what one micro-batch's gradients are taken of.

`micro_grads` differentiates the policy loss of `ppo.policy_loss` (minus the entropy bonus, plus
the KL loss) and, through the `critic.Critic` strategy, the value loss; `train_step` accumulates
them over micro-batches and applies them.

Dimensions: B episodes (rows) of a micro-batch.  T tokens.  D hidden size.
"""

import functools

import jax

from ragen_jax.algos import losses
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.logprobs import response_positions
from ragen_jax.algos.logprobs import sequence_logprobs
from ragen_jax.algos.step_records import StepSpec
from ragen_jax.algos.step_records import UpdateData
from ragen_jax.models import lora


def hidden_states(model, tokens_BxT, attn_BxT, frames, train_tower: bool):
  """Final-normed hidden_BxTxD of `model` on the rows; with `frames` (each row's images,
  `RolloutBatch.frames_BxNxHxWx3`) spliced into their image tokens, the tower differentiated
  only with `train_tower`. The one forward every scorer of training rows takes (the update,
  the supervised warm start)."""
  if frames is None:
    return model.backbone(tokens_BxT, attn_BxT)[0]
  return model.frames_backbone(tokens_BxT, attn_BxT, frames, train_tower)[0]


def keep_frozen_tower(stepped, trainable, train_tower: bool):
  """The trainable parameters after an optimizer step, the vision tower's (a Qwen2.5-VL's
  "visual") as they were unless `train_tower`: it got no gradient (`hidden_states`), and
  AdamW's decoupled weight decay must not shrink it either."""
  if "visual" in trainable and not train_tower:
    return {**stepped, "visual": trainable["visual"]}
  return stepped


def policy_forward(
    graph,
    params,
    tokens_BxT,
    attn_BxT,
    spec: StepSpec,
    with_entropy,
    mask_BxT=None,
    width=None,
    frames=None,
):
  """(logp_BxT, entropy_BxT, hidden_BxTxD) of a policy with `params`.

  With `width` (R) the log-probs and entropies are computed at the R first positions of
  `mask_BxT` in each row and are 0 elsewhere (`logprobs.response_positions`). `frames`: each
  row's images (`RolloutBatch.frames_BxNxHxWx3`), spliced into its image tokens.
  """
  model = graph.merge(params)
  hidden_BxTxD = hidden_states(model, tokens_BxT, attn_BxT, frames, spec.cfg.train_vision_tower)
  w_DxV = model.unembed_kernel().astype(hidden_BxTxD.dtype)
  positions = None if width is None else response_positions(mask_BxT, width)
  logp_BxT, entropy_BxT = sequence_logprobs(
      hidden_BxTxD,
      w_DxV,
      tokens_BxT,
      spec.cfg.vocab_chunk,
      spec.temperature,
      with_entropy,
      positions,
      model.config.excluded_token_ids,
  )
  return logp_BxT, entropy_BxT, hidden_BxTxD


def aggregate(cfg: PPOConfig, x_BxT, mask_BxT):
  """`x_BxT` over the mask, by the aggregation in force (`agg_mode` or the policy loss's)."""
  return losses.agg_loss(x_BxT, mask_BxT, cfg.policy.agg_mode, cfg.loss_scale_factor)


def actor_terms(cfg: PPOConfig, logp_BxT, entropy_BxT, mb: UpdateData):
  """The configured policy loss (`ppo.policy_loss`), minus the entropy bonus, plus the KL loss;
  (loss, metrics)."""
  mask_BxT = mb.mask_BxT
  pg, pg_metrics = losses.policy_loss(
      logp_BxT,
      mb.old_logp_BxT,
      mb.adv_BxT,
      mask_BxT,
      **cfg.policy._asdict(),
      loss_scale_factor=cfg.loss_scale_factor,
      weights_BxT=mb.pg_weights_BxT,
  )
  loss, metrics = pg, {f"actor/{k}": v for k, v in pg_metrics.items()}
  if cfg.entropy_coeff > 0:
    ent = aggregate(cfg, entropy_BxT, mask_BxT)
    loss = loss - cfg.entropy_coeff * ent
    metrics["actor/entropy_loss"] = ent
  if cfg.use_kl_loss:
    kl = aggregate(cfg, losses.kl_penalty(logp_BxT, mb.ref_logp_BxT, cfg.kl_type), mask_BxT)
    loss = loss + cfg.kl_coef * kl
    metrics["actor/kl_loss"] = kl
  return loss, metrics


def value_terms(cfg: PPOConfig, mb: UpdateData, values_BxT):
  """Clipped value loss; (loss, metrics)."""
  vf, vf_metrics = losses.value_loss(
      values_BxT,
      mb.old_values_BxT,
      mb.returns_BxT,
      mb.mask_BxT,
      cfg.value_clip,
      cfg.policy.agg_mode,
      cfg.loss_scale_factor,
  )
  return vf, {f"critic/{k}": v for k, v in vf_metrics.items()}


def micro_grads(spec: StepSpec, actor_params, critic_params, mb: UpdateData):
  """(actor grads of the trained part (`lora.partition`), critic grads or None, metrics) of one
  micro-batch."""
  cfg, critic = spec.cfg, spec.critic
  value_loss = functools.partial(value_terms, cfg, mb)
  # With LoRA only the adapters are differentiated: no base-sized gradient buffers.
  trainable, frozen = lora.partition(actor_params)

  def actor_loss(trainable, head):
    params = lora.combine(trainable, frozen)
    logp_BxT, entropy_BxT, hidden_BxTxD = policy_forward(
        spec.actor,
        params,
        mb.tokens_BxT,
        mb.attn_BxT,
        spec,
        cfg.entropy_coeff > 0,
        mb.mask_BxT,
        spec.width,
        mb.frames_BxNxHxWx3,
    )
    loss, metrics = actor_terms(cfg, logp_BxT, entropy_BxT, mb)
    return critic.add_to_actor_loss(loss, metrics, head, hidden_BxTxD, value_loss)

  grad_fn = jax.value_and_grad(actor_loss, argnums=(0, 1), has_aux=True)
  (_, metrics), (a_grads, head_grads) = grad_fn(trainable, critic.actor_loss_params(critic_params))
  c_grads, c_metrics = critic.grads(
      critic_params, head_grads, mb.tokens_BxT, mb.attn_BxT, value_loss
  )
  return a_grads, c_grads, {**metrics, **c_metrics}

"""The StarPO update as one jitted, donated train step.

    state = init_train_state(actor, critic_or_None, ppo_config, key)
    train_step = make_train_step(actor, critic_or_None, ppo_config)
    state, metrics = train_step(state, batch, key)       # batch: ragen_jax.batch.RolloutBatch

Inside one compiled call: rollout filter (a keep mask over episodes, so shapes never change;
kept episodes are moved first and micro-batches holding none are not computed), a no-gradient
pass for old log-probs, entropies, critic values and reference log-probs, advantages
(batch-global whitening for GAE), then `lax.scan` over PPO epochs and shuffled
minibatches with gradient accumulation over micro-batches, updating actor and critic with
AdamW (decoupled weight decay, global-norm clip).

Dimensions:
  B: episodes.  T: tokens.  N: minibatches per epoch.  M: micro-batches per minibatch.
  U: episodes per micro-batch (B = N·M·U).  D: hidden size.
"""
from typing import Any

import flax
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import optax

from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import filtering
from ragen_jax.algos import losses
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.logprobs import sequence_logprobs


@flax.struct.dataclass
class TrainState:
  """Everything the update carries between steps (a pytree; donated to the step).

  Parameters are pure nested dicts of arrays (`nnx.to_pure_dict`), owned by the state: they
  are copies, so donating the state never invalidates the modules they came from.
  """
  actor_params: Any
  actor_opt: Any
  critic_params: Any            # None for critic-free estimators
  critic_opt: Any
  ref_params: Any               # None unless use_kl_loss
  step: jax.Array               # int32, train_step calls so far
  skipped_steps: jax.Array      # int32, steps whose filter kept nothing (no update)


def _optimizer(lr, cfg):
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=cfg.weight_decay))


def _split(model):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), rest


def _copy(tree):
  return jax.tree.map(lambda a: jnp.array(a, copy=True), tree)


def _separate_critic(actor_model, critic_model, key):
  if critic_model is not None:
    return critic_model
  from ragen_jax import models  # pylint: disable=g-import-not-at-top
  return models.critic_from_policy(actor_model, key)


def init_train_state(actor_model, critic_model, cfg: PPOConfig, key, ref_model=None,
                     actor_tx=None, critic_tx=None):
  """Builds the TrainState.

  Args:
    actor_model: models.Qwen2 policy.
    critic_model: models.Qwen2Critic, or None: for "gae" with a separate critic one is then
      initialised from the policy weights (RAGEN); ignored by critic-free estimators.
    cfg: PPOConfig.
    key: PRNG key (critic construction).
    ref_model: frozen reference policy for the KL loss (default: a copy of the actor).
    actor_tx, critic_tx: optional optax transformations replacing the configured AdamW
      (schedules, tests); pass the same ones to make_train_step.
  """
  actor_tx = actor_tx or _optimizer(cfg.actor_lr, cfg)
  critic_tx = critic_tx or _optimizer(cfg.critic_lr, cfg)
  actor_params = _copy(_split(actor_model)[1])
  critic_params = critic_opt = ref_params = None
  if cfg.uses_critic:
    if cfg.critic == "separate":
      critic_params = _copy(_split(_separate_critic(actor_model, critic_model, key))[1])
    else:
      critic_params = {"value_kernel": jnp.zeros((actor_model.config.hidden_size,), jnp.float32),
                       "value_bias": jnp.zeros((), jnp.float32)}
    critic_opt = critic_tx.init(critic_params)
  if cfg.use_kl_loss:
    ref_params = _copy(_split(ref_model)[1]) if ref_model is not None else _copy(actor_params)
  return TrainState(actor_params=actor_params, actor_opt=actor_tx.init(actor_params),
                    critic_params=critic_params, critic_opt=critic_opt, ref_params=ref_params,
                    step=jnp.zeros((), jnp.int32), skipped_steps=jnp.zeros((), jnp.int32))


def _shift_right(x_BxT):
  """Value for token t is read at position t − 1 (the state before the token), as in veRL."""
  return jnp.pad(x_BxT[:, :-1], ((0, 0), (1, 0)))


def make_train_step(actor_model, critic_model, cfg: PPOConfig, ref_model=None, jit=True,
                    actor_tx=None, critic_tx=None, compiler_options=None, out_shardings=None):
  """Returns `train_step(state, batch, key) -> (state, metrics)`, jitted with the state donated.

  Args:
    actor_model, critic_model, cfg: as for init_train_state (only graph structure is used).
    ref_model: only its structure is used (it must match the actor's when None).
    jit: False returns the plain Python function (for tests and debugging).
    actor_tx, critic_tx: optimizer overrides, as given to init_train_state.
    compiler_options: passed to jax.jit (e.g. a lower XLA optimisation level in tests).
    out_shardings: passed to jax.jit: (state shardings, metrics sharding) on a mesh, so the
      state keeps its layout from step to step (and donation reuses its buffers).
  """
  actor_gd, _, actor_rest = nnx.split(actor_model, nnx.Param, ...)
  ref_gd, _, ref_rest = nnx.split(ref_model if ref_model is not None else actor_model,
                                  nnx.Param, ...)
  use_critic = cfg.uses_critic
  shared = use_critic and cfg.critic == "shared"
  if use_critic and not shared:
    abstract = critic_model if critic_model is not None else nnx.eval_shape(
        lambda: _separate_critic(actor_model, None, jax.random.key(0)))
    critic_gd, _, critic_rest = nnx.split(abstract, nnx.Param, ...)
  actor_tx = actor_tx or _optimizer(cfg.actor_lr, cfg)
  critic_tx = critic_tx or _optimizer(cfg.critic_lr, cfg)
  with_entropy_loss = cfg.entropy_coeff > 0

  def actor_forward(params, gd, rest, tokens, attn, with_entropy):
    model = nnx.merge(gd, params, rest)
    hidden_BxTxD, _ = model.backbone(tokens, attn)
    w_DxV = model.unembed_kernel().astype(hidden_BxTxD.dtype)
    logp, ent = sequence_logprobs(hidden_BxTxD, w_DxV, tokens, cfg.vocab_chunk, cfg.temperature,
                                  with_entropy)
    return logp, ent, hidden_BxTxD

  def head_values(head, hidden_BxTxD):
    values = jnp.einsum("btd,d->bt", hidden_BxTxD.astype(jnp.float32), head["value_kernel"])
    return _shift_right(values + head["value_bias"])

  def critic_values(params, tokens, attn):
    return _shift_right(nnx.merge(critic_gd, params, critic_rest)(tokens, attn))

  # ------------------------------------------------------------------ losses of one micro-batch

  def agg(x_BxT, mask_BxT):
    return losses.agg_loss(x_BxT, mask_BxT, cfg.agg_mode, cfg.loss_scale_factor)

  def actor_terms(logp, ent, mb):
    mask = mb["mask"]
    pg, pm = losses.policy_loss(logp, mb["old_logp"], mb["adv"], mask, cfg.clip_low,
                                cfg.clip_high, cfg.clip_c, cfg.agg_mode, cfg.loss_scale_factor)
    loss, metrics = pg, {f"actor/{k}": v for k, v in pm.items()}
    if with_entropy_loss:
      ent_agg = agg(ent, mask)
      loss = loss - cfg.entropy_coeff * ent_agg
      metrics["actor/entropy_loss"] = ent_agg
    if cfg.use_kl_loss:
      kl = agg(losses.kl_penalty(logp, mb["ref_logp"], cfg.kl_type), mask)
      loss = loss + cfg.kl_coef * kl
      metrics["actor/kl_loss"] = kl
    return loss, metrics

  def critic_terms(values, mb):
    vf, vm = losses.value_loss(values, mb["old_values"], mb["returns"], mb["mask"],
                               cfg.value_clip, cfg.agg_mode, cfg.loss_scale_factor)
    return vf, {f"critic/{k}": v for k, v in vm.items()}

  def micro_grads(actor_params, critic_params, mb):
    """(actor grads, critic grads or None, metrics) of one micro-batch."""
    tokens, attn = mb["tokens"], mb["attn"]

    def actor_loss(ap, head):
      logp, ent, hidden = actor_forward(ap, actor_gd, actor_rest, tokens, attn, with_entropy_loss)
      loss, metrics = actor_terms(logp, ent, mb)
      if shared:   # one trunk: the value loss also trains the actor's decoder
        vf, vm = critic_terms(head_values(head, hidden), mb)
        loss, metrics = loss + cfg.vf_coef * vf, {**metrics, **vm}
      return loss, metrics

    grad_fn = jax.value_and_grad(actor_loss, argnums=(0, 1), has_aux=True)
    (_, metrics), (a_grads, c_grads) = grad_fn(actor_params, critic_params if shared else None)
    if use_critic and not shared:
      def critic_loss(cp):
        return critic_terms(critic_values(cp, tokens, attn), mb)
      (_, cm), c_grads = jax.value_and_grad(critic_loss, has_aux=True)(critic_params)
      metrics = {**metrics, **cm}
    return a_grads, c_grads, metrics

  # ------------------------------------------------------------------ the step

  def train_step(state: TrainState, batch, key):
    b = batch.tokens_BxT.shape[0]
    cfg.check_batch(b)
    n_mb, n_micro = cfg.num_minibatches, cfg.micro_batches
    u = b // (n_mb * n_micro)

    # 1. Rollout filter: whole groups, as a mask over episodes.
    keep_B, fstats = filtering.episode_keep_mask(
        batch.scores_B, batch.group_ids_B, metric=cfg.filter_metric, strategy=cfg.filter_strategy,
        value=cfg.filter_value, filter_type=cfg.filter_type, include_zero=cfg.filter_include_zero,
        prob_mode=cfg.filter_prob_mode, eps=cfg.filter_eps)
    # Kept episodes first (stable), so that dropped ones fill whole trailing micro-batches whose
    # forward and backward passes are skipped below: a half-filtered batch costs about half.
    # Nothing per-episode leaves the step, so the order is free.
    perm_B = jnp.argsort(~keep_B, stable=True)
    batch, keep_B = jax.tree.map(lambda x: x[perm_B], (batch, keep_B))
    tokens, attn = batch.tokens_BxT.astype(jnp.int32), batch.attention_mask_BxT.astype(jnp.int32)
    mask = (batch.loss_mask_BxT > 0) & keep_B[:, None]
    maskf = mask.astype(jnp.float32)

    # 2. No-gradient pass, in micro-batch chunks to bound activation memory.
    def old_pass(chunk):
      t, a = chunk
      out = {}
      logp, ent, hidden = actor_forward(state.actor_params, actor_gd, actor_rest, t, a, True)
      out["logp"], out["ent"] = logp, ent
      if shared:
        out["values"] = head_values(state.critic_params, hidden)
      elif use_critic:
        out["values"] = critic_values(state.critic_params, t, a)
      if cfg.use_kl_loss:
        out["ref_logp"] = actor_forward(state.ref_params, ref_gd, ref_rest, t, a, False)[0]
      return out

    def old_pass_if_kept(chunk):
      t, a, k = chunk
      zeros = lambda: jax.tree.map(jnp.zeros_like, jax.eval_shape(old_pass, (t, a)))
      return lax.cond(jnp.any(k), lambda: old_pass((t, a)), zeros)

    chunks = b // u
    old = lax.map(old_pass_if_kept, (tokens.reshape(chunks, u, -1), attn.reshape(chunks, u, -1),
                                     keep_B.reshape(chunks, u)))
    old = jax.tree.map(lambda x: lax.stop_gradient(x.reshape(b, -1)), old)
    old_logp = old["logp"] if cfg.recompute_old_logprobs else batch.logprobs_BxT.astype(jnp.float32)

    # 3. Advantages and returns (batch-global statistics over kept episodes).
    n_tokens = jnp.sum(maskf)
    if use_critic:
      values = old["values"] * maskf          # the critic's values are 0 at masked positions
      advs, returns = adv_lib.compute_gae(batch.token_rewards_BxT, values, mask, cfg.gamma, cfg.lam)
      skipped = (~jnp.any(keep_B)) | (n_tokens < 2)     # whitening needs two valid tokens
    else:
      advs, returns = adv_lib.outcome_advantages(batch.scores_B, batch.group_ids_B, mask,
                                                 cfg.adv_estimator, valid_B=keep_B)
      skipped = (~jnp.any(keep_B)) | (n_tokens < 1)
    advs = jnp.where(skipped, 0.0, advs)
    if cfg.positive_advantages_only:
      advs = jnp.maximum(advs, 0.0)

    data = {"tokens": tokens, "attn": attn, "mask": maskf, "old_logp": old_logp, "adv": advs}
    if use_critic:
      data.update(old_values=values, returns=returns)
    if cfg.use_kl_loss:
      data["ref_logp"] = old["ref_logp"]

    # 4. PPO epochs x minibatches x micro-batches.
    def minibatch(carry, idx_MxU):
      ap, aopt, cp, copt = carry
      mbs = jax.tree.map(lambda x: x[idx_MxU], data)            # [M, U, ...]
      live_M = (jnp.sum(mbs["mask"], axis=(1, 2)) > 0).astype(jnp.float32)
      n_live = jnp.sum(live_M)
      w_M = live_M / jnp.maximum(n_live, 1.0)     # mean over non-empty micro-batches

      def micro(acc, xs):
        mb, w = xs

        def add(acc):
          ag, cg, met = micro_grads(ap, cp, mb)
          return jax.tree.map(lambda s, g: s + w * g, acc, (ag, cg, met))
        return lax.cond(w > 0, add, lambda acc: acc, acc), None   # w = 0: nothing kept

      zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(micro_grads, ap, cp,
                                                         jax.tree.map(lambda x: x[0], mbs)))
      (ag, cg, met), _ = lax.scan(micro, zero, (mbs, w_M))
      live = (n_live > 0) & ~skipped
      met["actor/grad_norm"] = optax.tree.norm(ag)
      if use_critic:
        met["critic/grad_norm"] = optax.tree.norm(cg)

      def apply(args):
        ap, aopt, cp, copt, ag, cg = args
        upd, aopt = actor_tx.update(ag, aopt, ap)
        ap = optax.apply_updates(ap, upd)
        if use_critic:
          cupd, copt = critic_tx.update(cg, copt, cp)
          cp = optax.apply_updates(cp, cupd)
        return ap, aopt, cp, copt

      # An empty minibatch (everything filtered away) or a skipped step leaves parameters and
      # optimizer moments untouched; lax.cond lets XLA reuse the buffers instead of selecting.
      new = lax.cond(live, apply, lambda args: args[:4], (ap, aopt, cp, copt, ag, cg))
      return new, (met, live.astype(jnp.float32))

    def epoch(carry, ekey):
      # Kept episodes first (shuffled among themselves), so filtered-out ones fill the last
      # minibatches, which are then skipped: the same optimizer steps as a smaller batch.
      u01 = jax.random.uniform(ekey, (b,)) if cfg.shuffle else jnp.arange(b) / b
      order = jnp.argsort(jnp.where(keep_B, u01, u01 + 2.0))
      return lax.scan(minibatch, carry, order.reshape(n_mb, n_micro, u))

    carry = (state.actor_params, state.actor_opt, state.critic_params, state.critic_opt)
    carry, (mets, lives) = lax.scan(epoch, carry, jax.random.split(key, cfg.ppo_epochs))
    n_updates = jnp.maximum(jnp.sum(lives), 1.0)
    metrics = {k: jnp.sum(v * lives) / n_updates for k, v in mets.items()}

    # 5. Batch metrics under veRL's and RAGEN's names.
    metrics["actor/entropy"] = agg(old["ent"], maskf)
    metrics["critic/advantages/mean"] = adv_lib.masked_mean(advs, maskf)
    adv_max = jnp.max(jnp.where(mask, advs, -jnp.inf))
    adv_min = jnp.min(jnp.where(mask, advs, jnp.inf))
    metrics["critic/advantages/max"] = jnp.where(skipped, 0.0, adv_max)
    metrics["critic/advantages/min"] = jnp.where(skipped, 0.0, adv_min)
    metrics["critic/returns/mean"] = adv_lib.masked_mean(jnp.where(mask, returns, 0.0), maskf)
    if use_critic:
      metrics["critic/values/mean"] = adv_lib.masked_mean(values, maskf)
      metrics["critic/vf_explained_var"] = jnp.where(
          skipped, 0.0, adv_lib.explained_variance(values, returns, maskf))
    # Train/inference mismatch (veRL's training/rollout_probs_diff_*): the sampler's token
    # probabilities against the training forward's; large values mean the update is off-policy.
    probs_diff = jnp.abs(jnp.exp(old["logp"]) - jnp.exp(batch.logprobs_BxT.astype(jnp.float32)))
    metrics["training/rollout_probs_diff_mean"] = adv_lib.masked_mean(probs_diff, maskf)
    metrics["training/rollout_probs_diff_max"] = jnp.max(jnp.where(mask, probs_diff, 0.0))
    metrics["rollout/in_group_reward_std"] = fstats["in_group_reward_std"]
    metrics["rollout/filter_kept_ratio"] = fstats["filter_kept_ratio"]
    metrics["rollout/filter_kept_count"] = fstats["filter_kept_count"]
    metrics["rollout/skipped"] = skipped.astype(jnp.float32)
    metrics["train/num_updates"] = jnp.sum(lives)

    actor_params, actor_opt, critic_params, critic_opt = carry
    skipped_steps = state.skipped_steps + skipped.astype(jnp.int32)
    metrics["rollout/skipped_steps"] = skipped_steps.astype(jnp.float32)
    new_state = state.replace(actor_params=actor_params, actor_opt=actor_opt,
                              critic_params=critic_params, critic_opt=critic_opt,
                              step=state.step + 1, skipped_steps=skipped_steps)
    return new_state, metrics

  if not jit:
    return train_step
  return jax.jit(train_step, donate_argnums=(0,), compiler_options=compiler_options,
                 out_shardings=out_shardings)


def actor_module(actor_model, state: TrainState):
  """The actor module carrying the state's current parameters (e.g. for the next rollout)."""
  graphdef, _, rest = nnx.split(actor_model, nnx.Param, ...)
  return nnx.merge(graphdef, state.actor_params, rest)

"""The StarPO update as one jitted, donated train step.

    state = init_train_state(actor, critic_or_None, ppo_config, key)
    train_step = make_train_step(actor, critic_or_None, ppo_config)
    state, metrics = train_step(state, batch, key)       # batch: ragen_jax.batch.RolloutBatch

Inside one compiled call, five stages (pure functions below, composed by `train_step`):
  1. `order_and_filter`: the rollout filter as a keep mask over episodes (shapes never change),
     kept episodes moved first so that micro-batches holding none are not computed;
  2. `old_pass`: no-gradient log-probs, entropies, critic values, and the log-probs of the
     frozen scorers: the KL reference and the distillation teacher;
  3. `advantages`: GAE with the critic (batch-global whitening), outcome advantages or GiGPO's
     per-turn ones (from the batch's turn records), plus the teacher's dense term
     (`algos.distill`);
  4. `update`: `lax.scan` over PPO epochs and shuffled minibatches with gradient accumulation
     over micro-batches (summed in float32), updating actor and critic with AdamW (decoupled
     weight decay, global-norm clip; moments in `ppo.moment_dtype`, `optim`);
  5. `step_metrics.batch_metrics`: batch statistics under veRL's and RAGEN's names.
The critic mode (none, separate model, shared value head) is a `critic.Critic` strategy; the
stages pass the typed records of `step_records`; the state and its optimizer are `train_state`'s,
one micro-batch's forward pass, losses and gradients `step_losses`'.

Dimensions:
  B: rows: episodes, or with a context window one row per turn (`RolloutBatch.row_episodes_R`;
     the episode arrays keep one entry per episode, and statistics over episodes are read by
     each row through it).  T: tokens.  N: minibatches per epoch.  M: micro-batches per
  minibatch.  U: rows per micro-batch (B = N·M·U).  D: hidden size.
"""

import collections
import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
import optax

from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import critic as critic_lib
from ragen_jax.algos import distill
from ragen_jax.algos import filtering
from ragen_jax.algos import losses
from ragen_jax.algos import step_metrics
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.step_losses import keep_frozen_tower
from ragen_jax.algos.step_losses import micro_grads
from ragen_jax.algos.step_losses import policy_forward
from ragen_jax.algos.step_records import Advantages
from ragen_jax.algos.step_records import Learner
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import OldPass
from ragen_jax.algos.step_records import optimizer_step
from ragen_jax.algos.step_records import Selection
from ragen_jax.algos.step_records import StepSpec
from ragen_jax.algos.step_records import UpdateData
from ragen_jax.algos.train_state import optimizer
from ragen_jax.algos.train_state import TrainState
from ragen_jax.models import lora

# ---------------------------------------------------------------- the stages


def order_and_filter(cfg: PPOConfig, batch) -> Selection:
  """Stage 1: the rollout filter (whole groups) as a keep mask, kept episodes moved first."""
  keep_B, stats = filtering.episode_keep_mask(
      batch.scores_B,
      batch.group_ids_B,
      metric=cfg.filter_metric,
      strategy=cfg.filter_strategy,
      value=cfg.filter_value,
      filter_type=cfg.filter_type,
      include_zero=cfg.filter_include_zero,
      prob_mode=cfg.filter_prob_mode,
      eps=cfg.filter_eps,
  )
  # Kept episodes first (stable), so that dropped ones fill whole trailing micro-batches whose
  # forward and backward passes are skipped: a half-filtered batch costs about half. Nothing
  # per-episode leaves the step, so the order is free.
  if batch.row_episodes_R is None:  # one row per episode
    perm_B = jnp.argsort(~keep_B, stable=True)
    batch, keep_B = jax.tree.map(lambda x: x[perm_B], (batch, keep_B))
    keep_episodes_B, row_order_R = keep_B, None
  else:  # one row per turn: the rows of kept episodes' played turns first
    keep_episodes_B = keep_B
    keep_B = keep_B[batch.row_episodes_R] & jnp.any(batch.loss_mask_BxT > 0, axis=1)
    row_order_R = jnp.argsort(~keep_B, stable=True)
    batch, keep_B = _permute_rows(batch, row_order_R), keep_B[row_order_R]
  return Selection(
      batch=batch,
      tokens_BxT=batch.tokens_BxT.astype(jnp.int32),
      attn_BxT=batch.attention_mask_BxT.astype(jnp.int32),
      keep_B=keep_B,
      mask_BxT=(batch.loss_mask_BxT > 0) & keep_B[:, None],
      stats=stats,
      keep_episodes_B=keep_episodes_B,
      row_order_R=row_order_R,
  )


def _permute_rows(batch, perm_R):
  """The row arrays of a per-turn batch in the order perm_R; the episode arrays unchanged."""
  rows = lambda x: x[perm_R]
  return batch.replace(
      tokens_BxT=rows(batch.tokens_BxT),
      attention_mask_BxT=rows(batch.attention_mask_BxT),
      loss_mask_BxT=rows(batch.loss_mask_BxT),
      logprobs_BxT=rows(batch.logprobs_BxT),
      token_rewards_BxT=rows(batch.token_rewards_BxT),
      row_episodes_R=rows(batch.row_episodes_R),
      frames_BxNxHxWx3=None if batch.frames_BxNxHxWx3 is None else rows(batch.frames_BxNxHxWx3),
      turns=batch.turns.replace(token_turns_BxT=rows(batch.turns.token_turns_BxT)),
  )


def old_pass(
    spec: StepSpec, state: TrainState, sel: Selection, chunk_size, teacher_params=None
) -> OldPass:
  """Stage 2: the no-gradient pass, in chunks of `chunk_size` episodes to bound activations.

  Chunks holding no kept episode are not computed (zeros). The KL reference and the
  distillation teacher are frozen scorers: one forward each, no entropy.
  """
  cfg = spec.cfg

  def forward(tokens_UxT, attn_UxT, mask_UxT, frames_U):
    logp, ent, hidden = policy_forward(
        spec.actor,
        state.actor_params,
        tokens_UxT,
        attn_UxT,
        spec,
        True,
        mask_UxT,
        spec.width,
        frames_U,
    )
    values = spec.critic.values(state.critic_params, tokens_UxT, attn_UxT, hidden)
    score = lambda graph, params: policy_forward(
        graph, params, tokens_UxT, attn_UxT, spec, False, mask_UxT, spec.width, frames_U
    )[0]
    ref_logp = teacher_logp = None
    if cfg.use_kl_loss:
      ref_params = state.ref_params
      if ref_params is None:  # LoRA: the frozen base, i.e. the actor with every B at zero
        ref_params = lora.without_adapters(state.actor_params)
      ref_logp = score(spec.ref, ref_params)
    if spec.teacher is not None:
      teacher_logp = score(spec.teacher, teacher_params)
    return OldPass(
        logp_BxT=logp,
        entropy_BxT=ent,
        values_BxT=values,
        ref_logp_BxT=ref_logp,
        teacher_logp_BxT=teacher_logp,
    )

  def forward_if_kept(chunk):
    tokens_UxT, attn_UxT, mask_UxT, keep_U, frames_U = chunk
    args = (tokens_UxT, attn_UxT, mask_UxT, frames_U)
    zeros = lambda: jax.tree.map(jnp.zeros_like, jax.eval_shape(forward, *args))
    return lax.cond(jnp.any(keep_U), lambda: forward(*args), zeros)

  b = sel.keep_B.shape[0]
  chunks = b // chunk_size
  old = lax.map(
      forward_if_kept,
      (
          sel.tokens_BxT.reshape(chunks, chunk_size, -1),
          sel.attn_BxT.reshape(chunks, chunk_size, -1),
          sel.mask_BxT.reshape(chunks, chunk_size, -1),
          sel.keep_B.reshape(chunks, chunk_size),
          jax.tree.map(  # None without images
              lambda x: x.reshape((chunks, chunk_size) + x.shape[1:]), sel.batch.frames_BxNxHxWx3
          ),
      ),
  )
  return jax.tree.map(lambda x: lax.stop_gradient(x.reshape(b, -1)), old)


def advantages(cfg: PPOConfig, sel: Selection, old: OldPass) -> Advantages:
  """Stage 3: the environment's advantages and returns (batch-global statistics over kept
  episodes), plus the teacher's −coef·k_t when one scores (`algos.distill`; after
  positive_advantages_only, which concerns the environment's term alone)."""
  adv = _env_advantages(cfg, sel, old)
  if old.teacher_logp_BxT is None:
    return adv
  adv_BxT, metrics = distill.add_distill_advantage(
      adv.adv_BxT, old.logp_BxT, old.teacher_logp_BxT, sel.mask_BxT, cfg.distill_coef, adv.skipped
  )
  return adv.replace(adv_BxT=adv_BxT, distill_metrics=metrics)


def _env_advantages(cfg: PPOConfig, sel: Selection, old: OldPass) -> Advantages:
  batch, mask_BxT = sel.batch, sel.mask_BxT
  maskf_BxT = mask_BxT.astype(jnp.float32)
  n_tokens = jnp.sum(maskf_BxT)
  values_BxT = None
  if old.values_BxT is not None:  # GAE with the critic's values as the baseline
    values_BxT = old.values_BxT * maskf_BxT  # the critic's values are 0 at masked positions
    gae = (
        functools.partial(adv_lib.compute_bi_level_gae, high_level_gamma=cfg.high_level_gamma)
        if cfg.adv_estimator == "bi_level_gae"
        else adv_lib.compute_gae
    )
    gae_args = (batch.token_rewards_BxT, values_BxT, mask_BxT, cfg.gamma, cfg.lam)
    if batch.row_episodes_R is None:
      adv_BxT, returns_BxT = gae(*gae_args)
    else:  # one row per turn: GAE along each episode's rows in turn order
      adv_BxT, returns_BxT = _along_episodes(gae, sel, *gae_args)
    skipped = (~jnp.any(sel.keep_B)) | (n_tokens < 2)  # whitening needs two valid tokens
  elif cfg.adv_estimator == "gigpo":
    return _gigpo_advantages(cfg, sel, n_tokens)
  else:
    adv_BxT, returns_BxT = adv_lib.outcome_advantages(
        batch.scores_B,
        batch.group_ids_B,
        mask_BxT,
        cfg.adv_estimator,
        valid_B=sel.keep_episodes_B,
        rows_R=batch.row_episodes_R,
    )
    skipped = (~jnp.any(sel.keep_B)) | (n_tokens < 1)
  adv_BxT = jnp.where(skipped, 0.0, adv_BxT)
  if cfg.positive_advantages_only:
    adv_BxT = jnp.maximum(adv_BxT, 0.0)
  return Advantages(
      adv_BxT=adv_BxT, returns_BxT=returns_BxT, values_BxT=values_BxT, skipped=skipped
  )


def _along_episodes(gae, sel: Selection, rewards_RxT, values_RxT, mask_RxT, gamma, lam):
  """`gae` over the row layout: each episode's K rows (R = B·K), in turn order, joined into one
  [B, K·T] sequence, as its one sequence would hold them (a turn's prompt separates its reply
  from the last), then split back into rows."""
  r, t = mask_RxT.shape
  b = sel.batch.group_ids_B.shape[0]
  canonical_R = jnp.argsort(sel.row_order_R)  # row b·K + j of the rollout is at canonical[...]
  join = lambda x_RxT: x_RxT[canonical_R].reshape(b, (r // b) * t)
  split = lambda x_BxL: x_BxL.reshape(r, t)[sel.row_order_R]
  adv, returns = gae(join(rewards_RxT), join(values_RxT), join(mask_RxT), gamma, lam)
  return split(adv), split(returns)


def _gigpo_advantages(cfg: PPOConfig, sel: Selection, n_tokens) -> Advantages:
  """Stage 3 for GiGPO: per-turn advantages from the batch's turn records, over kept episodes."""
  turns = sel.batch.turns
  if turns is None:
    raise ValueError(
        "ppo.adv_estimator='gigpo' needs the batch's per-turn records (RolloutBatch.turns, "
        "which the rollout fills)"
    )
  adv_BxT, returns_BxT, share = adv_lib.gigpo_token_advantages(
      turns.rewards_BxK,
      (turns.mask_BxK > 0) & sel.keep_episodes_B[:, None],
      turns.state_keys_BxK,
      turns.token_turns_BxT,
      sel.batch.group_ids_B,
      sel.mask_BxT,
      rows_R=sel.batch.row_episodes_R,
      gamma=cfg.gigpo_gamma,
      omega=cfg.gigpo_omega,
      norm=cfg.gigpo_norm,
  )
  skipped = (~jnp.any(sel.keep_B)) | (n_tokens < 1)
  adv_BxT = jnp.where(skipped, 0.0, adv_BxT)
  if cfg.positive_advantages_only:
    adv_BxT = jnp.maximum(adv_BxT, 0.0)
  return Advantages(
      adv_BxT=adv_BxT,
      returns_BxT=returns_BxT,
      values_BxT=None,
      skipped=skipped,
      step_group_share=share,
  )


def update_data(cfg: PPOConfig, sel: Selection, old: OldPass, adv: Advantages) -> UpdateData:
  """The update's inputs; old values and returns are None without a critic.

  Old log-probs are the current actor's (veRL, RAGEN), or the sampler's when
  recompute_old_logprobs is False. The rollout-correction weights of the policy loss are
  computed here, once per step.
  """
  old_logp_BxT = (
      old.logp_BxT if cfg.recompute_old_logprobs else sel.batch.logprobs_BxT.astype(jnp.float32)
  )
  pg_weights_BxT = None
  if cfg.rollout_correction != "none":  # "none" leaves the step's program as it was
    pg_weights_BxT = losses.rollout_correction_weights(
        old.logp_BxT, sel.batch.logprobs_BxT, sel.mask_BxT, **step_metrics.correction(cfg)
    )
  with_values = adv.values_BxT is not None
  return UpdateData(
      tokens_BxT=sel.tokens_BxT,
      attn_BxT=sel.attn_BxT,
      mask_BxT=sel.mask_BxT.astype(jnp.float32),
      old_logp_BxT=old_logp_BxT,
      adv_BxT=adv.adv_BxT,
      old_values_BxT=adv.values_BxT,
      returns_BxT=adv.returns_BxT if with_values else None,
      ref_logp_BxT=old.ref_logp_BxT,
      pg_weights_BxT=pg_weights_BxT,
      frames_BxNxHxWx3=sel.batch.frames_BxNxHxWx3,
  )


def _minibatch(spec: StepSpec, data: UpdateData, skipped, learner: Learner, idx_MxU):
  """One optimizer step on the episodes idx_MxU, accumulating over M micro-batches."""
  critic = spec.critic
  mbs = jax.tree.map(lambda x: x[idx_MxU], data)  # [M, U, ...]
  live_M = (jnp.sum(mbs.mask_BxT, axis=(1, 2)) > 0).astype(jnp.float32)
  n_live = jnp.sum(live_M)
  w_M = live_M / jnp.maximum(n_live, 1.0)  # mean over non-empty micro-batches
  grads_of = functools.partial(micro_grads, spec, learner.actor_params, learner.critic_params)

  def micro(acc, xs):
    mb, w = xs

    def add(acc):
      return jax.tree.map(lambda s, g: s + w * g, acc, grads_of(mb))

    return lax.cond(w > 0, add, lambda acc: acc, acc), None  # w = 0: nothing kept

  def zeros(s):
    # The sum is float32 whatever the parameters' dtype: each bfloat16 gradient is rounded once,
    # not again at every addition.
    return jnp.zeros(s.shape, jnp.float32 if jnp.issubdtype(s.dtype, jnp.floating) else s.dtype)

  zero = jax.tree.map(zeros, jax.eval_shape(grads_of, jax.tree.map(lambda x: x[0], mbs)))
  (a_grads, c_grads, metrics), _ = lax.scan(micro, zero, (mbs, w_M))
  live = (n_live > 0) & ~skipped
  metrics["actor/grad_norm"] = optax.tree.norm(a_grads)
  metrics.update(critic.grad_metrics(c_grads))

  def apply(learner, a_grads, c_grads):
    trainable, frozen = lora.partition(learner.actor_params)
    stepped, actor_opt = optimizer_step(spec.actor_tx, a_grads, learner.actor_opt, trainable)
    stepped = keep_frozen_tower(stepped, trainable, spec.cfg.train_vision_tower)
    actor_params = lora.combine(stepped, frozen)
    critic_params, critic_opt = critic.apply(
        spec.critic_tx, c_grads, learner.critic_opt, learner.critic_params
    )
    return Learner(actor_params, actor_opt, critic_params, critic_opt)

  # An empty minibatch (everything filtered away) or a skipped step leaves parameters and
  # optimizer moments untouched; lax.cond lets XLA reuse the buffers instead of selecting.
  learner = lax.cond(live, apply, lambda learner, *_: learner, learner, a_grads, c_grads)
  return learner, (metrics, live.astype(jnp.float32))


def update(spec: StepSpec, learner: Learner, data: UpdateData, keep_B, skipped, key):
  """Stage 4: PPO epochs x minibatches x micro-batches; (learner, update metrics).

  Metrics are averaged over the optimizer steps taken (`train/num_updates`).
  """
  cfg = spec.cfg
  b = keep_B.shape[0]
  n_mb, n_micro = cfg.num_minibatches, cfg.micro_batches
  u = b // (n_mb * n_micro)
  minibatch = functools.partial(_minibatch, spec, data, skipped)

  def epoch(learner, epoch_key):
    # Kept episodes first (shuffled among themselves), so filtered-out ones fill the last
    # minibatches, which are then skipped: the same optimizer steps as a smaller batch.
    u01_B = jax.random.uniform(epoch_key, (b,)) if cfg.shuffle else jnp.arange(b) / b
    order_B = jnp.argsort(jnp.where(keep_B, u01_B, u01_B + 2.0))
    return lax.scan(minibatch, learner, order_B.reshape(n_mb, n_micro, u))

  learner, (mets, lives) = lax.scan(epoch, learner, jax.random.split(key, cfg.ppo_epochs))
  n_updates = jnp.maximum(jnp.sum(lives), 1.0)
  metrics = {k: jnp.sum(v * lives) / n_updates for k, v in mets.items()}
  metrics["train/num_updates"] = jnp.sum(lives)
  return learner, metrics


# ---------------------------------------------------------------- the step


def train_step(
    spec: StepSpec, state: TrainState, batch, key, response_width=None, teacher_params=None
):
  """One StarPO update: `(state, batch, key) -> (state, metrics)` once `spec` is bound.

  `response_width` (static; `logprobs.response_width` of the host batch): log-probs are then
  computed at each row's trained tokens alone. It must be at least the largest count of
  trained tokens in a row; None computes them at every position (the same update, slower).
  `teacher_params`: the distillation teacher's parameters (a pure dict), when the step was
  made with a teacher.
  """
  spec = dataclasses.replace(spec, width=response_width)
  cfg = spec.cfg
  b = batch.tokens_BxT.shape[0]
  cfg.check_batch(b)
  sel = order_and_filter(cfg, batch)
  if (spec.teacher is None) != (teacher_params is None):
    raise ValueError(
        "ppo.distill_teacher: the train step was made "
        + ("with a teacher and needs teacher_params" if spec.teacher else "without a teacher")
    )
  chunk_size = b // (cfg.num_minibatches * cfg.micro_batches)
  old = old_pass(spec, state, sel, chunk_size, teacher_params)
  adv = advantages(cfg, sel, old)
  learner = Learner(state.actor_params, state.actor_opt, state.critic_params, state.critic_opt)
  learner, metrics = update(
      spec, learner, update_data(cfg, sel, old, adv), sel.keep_B, adv.skipped, key
  )
  metrics.update(step_metrics.batch_metrics(cfg, sel, old, adv))
  skipped_steps = state.skipped_steps + adv.skipped.astype(jnp.int32)
  metrics["rollout/skipped_steps"] = skipped_steps.astype(jnp.float32)
  new_state = state.replace(
      actor_params=learner.actor_params,
      actor_opt=learner.actor_opt,
      critic_params=learner.critic_params,
      critic_opt=learner.critic_opt,
      step=state.step + 1,
      skipped_steps=skipped_steps,
  )
  return new_state, metrics


def make_train_step(
    actor_model,
    critic_model,
    cfg: PPOConfig,
    ref_model=None,
    jit=True,
    actor_tx=None,
    critic_tx=None,
    out_shardings=None,
    temperature: float = 1.0,
    teacher_model=None,
):
  """Returns `train_step(state, batch, key, response_width=None) -> (state, metrics)`, jitted
  with the state donated.

  Args:
    actor_model, critic_model, cfg: as for init_train_state (only graph structure is used).
    temperature: the rollout's sampling temperature: the update's log-probs are those of the
      distribution sampled from (logits divided by it).
    ref_model: only its structure is used (it must match the actor's when None).
    jit: False returns the plain Python function (for tests and debugging).
    actor_tx, critic_tx: optimizer overrides, as given to init_train_state.
    out_shardings: passed to jax.jit: (state shardings, metrics sharding) on a mesh, so the
      state keeps its layout from step to step (and donation reuses its buffers).
    teacher_model: the distillation teacher (needed when cfg.distill_teacher is set; only its
      structure is used: its parameters are given to each call as `teacher_params`).
  """
  if cfg.distills and teacher_model is None:
    raise ValueError(
        f"ppo.distill_teacher={cfg.distill_teacher!r} needs the teacher model "
        "(train/teacher.py loads it)"
    )
  spec = StepSpec(
      cfg=cfg,
      temperature=float(temperature),
      actor=ModelGraph.of(actor_model),
      ref=ModelGraph.of(ref_model if ref_model is not None else actor_model),
      critic=critic_lib.make_critic(cfg, actor_model, critic_model, initialises=False),
      actor_tx=actor_tx or optimizer(cfg.actor_lr, cfg),
      critic_tx=critic_tx or optimizer(cfg.critic_lr, cfg),
      teacher=ModelGraph.of(teacher_model) if cfg.distills else None,
  )
  step = functools.partial(train_step, spec)
  if not jit:
    return step
  defaults = actor_tx is None and critic_tx is None and critic_model is None
  key = _program_key(spec, out_shardings) if defaults else None
  jitted = _JITTED.pop(key, None) or jax.jit(
      step, donate_argnums=(0,), static_argnames=("response_width",), out_shardings=out_shardings
  )
  if key is not None:  # kept, the most recent last
    _JITTED[key] = jitted
    while len(_JITTED) > _JITTED_KEPT:
      _JITTED.popitem(last=False)
  return jitted


# Jitted steps by what their program is made of: a later run in the same process (a notebook's
# next cell, a sweep, a resume) calls the step an earlier one traced instead of tracing and
# lowering it again (seconds). A few are kept: each holds its executables.
_JITTED: collections.OrderedDict = collections.OrderedDict()
_JITTED_KEPT = 4


def _program_key(spec: StepSpec, out_shardings):
  """Hashable, equal for specs that trace to the same program (default optimizers and critic
  follow from the config and the actor, and a graphdef holds its modules' sizes and dtypes); None
  when a module's non-parameter state (arrays) is closed over."""
  graphs = [g for g in (spec.actor, spec.ref, spec.teacher) if g is not None]
  if any(jax.tree.leaves(g.rest) for g in graphs):
    return None
  shardings, treedef = jax.tree.flatten(out_shardings)
  graphdefs = tuple(g.graphdef for g in graphs)
  return spec.cfg, spec.temperature, graphdefs, tuple(shardings), treedef

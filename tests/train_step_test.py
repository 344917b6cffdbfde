"""The compiled StarPO train step on a tiny Qwen2: gradients, learning, filtering, compilation.

Dimensions: B episodes, T tokens, V vocabulary.
"""

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.batch import TurnBatch
from tiny import B  # pylint: disable=g-bad-import-order
from tiny import make_batch
from tiny import MODEL
from tiny import T


def clips(cfg):
  """`policy_loss`'s clip range from a PPOConfig."""
  return dict(clip_low=cfg.policy.clip_low, clip_high=cfg.policy.clip_high, clip_c=cfg.clip_c)


def ref_gae_raw(r, v, m):
  """γ = λ = 1 GAE with observation skipping (rl_math §2.1), raw advantages."""
  adv = np.zeros_like(r)
  for i in range(r.shape[0]):
    nv = g = 0.0
    for t in reversed(range(r.shape[1])):
      if m[i, t]:
        g = r[i, t] + nv - v[i, t] + g
        nv = v[i, t]
      adv[i, t] = g
  return adv


def full_logp_entropy(model, tokens, attn):
  """Full-logits reference: position t scores tokens[t] from the logits at t − 1."""
  logits = model(tokens, attn)
  lsm = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(lsm, tokens[:, 1:, None], -1)[..., 0]
  ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
  return jnp.pad(logp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))


def snapshot(tree):
  return jax.tree.map(np.array, tree)


# ---------------------------------------------------------------- gradient of the jitted step


# response_width 8: log-probs at each row's (at most 6) trained tokens alone, the trainer's way.
@pytest.mark.parametrize("response_width", [None, 8])
def test_jitted_step_gradient_equals_plain_loss_gradient(response_width):
  actor = models.create(MODEL, jax.random.key(0))
  ref = models.create(MODEL, jax.random.key(5))
  critic = models.critic_from_policy(actor)
  cfg = algos.PPOConfig(
      num_minibatches=1,
      micro_batches=2,
      shuffle=False,
      entropy_coeff=0.01,
      use_kl_loss=True,
      kl_coef=0.1,
      kl_type="k3",
      vocab_chunk=24,
  )
  sgd = optax.sgd(1.0)  # parameter delta = −gradient exactly
  state = algos.init_train_state(
      actor, critic, cfg, jax.random.key(1), ref_model=ref, actor_tx=sgd, critic_tx=sgd
  )
  step = algos.make_train_step(actor, critic, cfg, ref_model=ref, actor_tx=sgd, critic_tx=sgd)
  batch = make_batch()
  before = snapshot((state.actor_params, state.critic_params))
  leaf = jax.tree.leaves(state.actor_params)[0]
  state, metrics = step(state, batch, jax.random.key(2), response_width=response_width)
  assert leaf.is_deleted()  # make_train_step donates the state
  after = snapshot((state.actor_params, state.critic_params))

  # Plain, unjitted reference: full logits, NumPy GAE, mean of the two micro-batch losses.
  tokens, attn = batch.tokens_BxT, batch.attention_mask_BxT
  m = np.asarray(batch.loss_mask_BxT, np.float32)
  values = np.asarray(critic(tokens, attn))
  values = np.pad(values[:, :-1], ((0, 0), (1, 0))) * m
  raw = ref_gae_raw(np.asarray(batch.token_rewards_BxT, np.float64), values, m)
  valid = raw[m == 1]
  adv = (raw - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8)
  returns = raw + values
  old_logp, _ = full_logp_entropy(actor, tokens, attn)
  ref_logp, _ = full_logp_entropy(ref, tokens, attn)
  halves = [slice(0, 4), slice(4, 8)]

  def actor_loss(params):
    model = algos.actor_module(actor, state.replace(actor_params=params))
    logp, ent = full_logp_entropy(model, tokens, attn)
    total = 0.0
    for h in halves:
      pg, _ = algos.policy_loss(
          logp[h], old_logp[h], jnp.asarray(adv[h], jnp.float32), m[h], **clips(cfg)
      )
      kl = algos.kl_penalty(logp[h], ref_logp[h], "k3")
      total += pg - 0.01 * algos.agg_loss(ent[h], m[h]) + 0.1 * algos.agg_loss(kl, m[h])
    return total / 2

  def critic_loss(params):
    graphdef, _, rest = nnx.split(critic, nnx.Param, ...)
    v = nnx.merge(graphdef, params, rest)(tokens, attn)
    v = jnp.pad(v[:, :-1], ((0, 0), (1, 0)))
    total = 0.0
    for h in halves:
      total += algos.value_loss(v[h], values[h], returns[h].astype(np.float32), m[h], 0.5)[0]
    return total / 2

  g_actor = jax.grad(actor_loss)(jax.tree.map(jnp.asarray, before[0]))
  g_critic = jax.grad(critic_loss)(jax.tree.map(jnp.asarray, before[1]))
  for g_ref, b0, b1 in ((g_actor, before[0], after[0]), (g_critic, before[1], after[1])):
    flat_ref = jax.tree.leaves(g_ref)
    flat_delta = [x1 - x0 for x0, x1 in zip(jax.tree.leaves(b0), jax.tree.leaves(b1))]
    scale = max(np.abs(np.asarray(g)).max() for g in flat_ref)
    assert scale > 1e-4
    for gr, d in zip(flat_ref, flat_delta):
      np.testing.assert_allclose(-d, gr, rtol=1e-3, atol=1e-5 * scale)
  assert float(metrics["rollout/skipped"]) == 0.0
  np.testing.assert_allclose(metrics["actor/grad_norm"], optax.tree.norm(g_actor), rtol=1e-3)


def test_sampler_logprobs_value_clip_and_grad_clip_equal_a_plain_reference():
  """recompute_old_logprobs=False (the sampler's log-probs are the old ones), a value clip and
  a global-norm gradient clip that bind, through the configured AdamW over two minibatches,
  against plain unjitted losses and optax's own clip and adamw.

  The clip (1e-8) scales every gradient to |g| <= Adam's eps, where the first steps are smooth
  in g (not Adam's sign-like steps): the comparison is well conditioned, and an unclipped
  gradient would give steps of about the learning rate everywhere instead.
  """
  actor = models.create(MODEL, jax.random.key(0))
  critic = models.critic_from_policy(actor)
  lr, kappa, clip = 1e-2, 1e-3, 1e-8
  cfg = algos.PPOConfig(
      num_minibatches=2,
      micro_batches=1,
      shuffle=False,  # minibatches: episodes 0-3, then 4-7
      entropy_coeff=0.0,
      recompute_old_logprobs=False,
      value_clip=kappa,
      grad_clip=clip,
      actor_lr=lr,
      critic_lr=lr,
      vocab_chunk=24,
  )
  batch = make_batch()
  tokens, attn = batch.tokens_BxT, batch.attention_mask_BxT
  m = np.asarray(batch.loss_mask_BxT, np.float32)
  logp0, _ = full_logp_entropy(actor, tokens, attn)
  # The sampler's log-probs: off by up to 0.3, so that ratios leave [0.8, 1.28] from the start.
  noise = np.random.RandomState(4).uniform(-0.3, 0.3, m.shape).astype(np.float32)
  sampler = jnp.asarray(np.asarray(logp0) + noise * m)
  batch = batch.replace(logprobs_BxT=sampler)
  state = algos.init_train_state(actor, critic, cfg, jax.random.key(1))
  before = snapshot((state.actor_params, state.critic_params))
  step = algos.make_train_step(actor, critic, cfg)
  state, metrics = step(state, batch, jax.random.key(2))
  after = snapshot((state.actor_params, state.critic_params))
  assert float(metrics["train/num_updates"]) == 2.0
  assert float(metrics["actor/pg_clipfrac"]) > 0 and float(metrics["critic/vf_clipfrac"]) > 0

  a_graph, _, a_rest = nnx.split(actor, nnx.Param, ...)
  c_graph, _, c_rest = nnx.split(critic, nnx.Param, ...)
  params = jax.tree.map(jnp.asarray, before)
  values = np.asarray(nnx.merge(c_graph, params[1], c_rest)(tokens, attn))
  values = np.pad(values[:, :-1], ((0, 0), (1, 0))) * m
  raw = ref_gae_raw(np.asarray(batch.token_rewards_BxT, np.float64), values, m)
  valid = raw[m == 1]
  adv = jnp.asarray((raw - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8), jnp.float32)
  returns = jnp.asarray(raw + values, jnp.float32)
  values = jnp.asarray(values, jnp.float32)

  def actor_loss(p, h):
    logp, _ = full_logp_entropy(nnx.merge(a_graph, p, a_rest), tokens, attn)
    return algos.policy_loss(logp[h], sampler[h], adv[h], m[h], **clips(cfg))[0]

  def critic_loss(p, h):
    v = nnx.merge(c_graph, p, c_rest)(tokens, attn)
    v = jnp.pad(v[:, :-1], ((0, 0), (1, 0)))
    return algos.value_loss(v[h], values[h], returns[h], m[h], kappa)[0]

  tx = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr, eps=1e-8, weight_decay=0.01))
  reference = []
  for p, loss in zip(params, (actor_loss, critic_loss)):
    opt = tx.init(p)
    for h in (slice(0, 4), slice(4, 8)):  # old log-probs and values stay those of the start
      updates, opt = tx.update(jax.grad(loss)(p, h), opt, p)
      p = optax.apply_updates(p, updates)
    reference.append(p)
  for b0, b1, r in zip(before, after, reference):
    flat_ref = [np.asarray(x1) - x0 for x0, x1 in zip(jax.tree.leaves(b0), jax.tree.leaves(r))]
    flat_delta = [x1 - x0 for x0, x1 in zip(jax.tree.leaves(b0), jax.tree.leaves(b1))]
    scale = max(np.abs(d).max() for d in flat_ref)
    assert scale > 0.1 * lr
    for dr, d in zip(flat_ref, flat_delta):
      np.testing.assert_allclose(d, dr, rtol=1e-3, atol=1e-4 * scale)


# ---------------------------------------------------------------- AdamW step, shared compile


@pytest.fixture(scope="module")
def adamw_setup():
  actor = models.create(MODEL, jax.random.key(0))
  cfg = algos.PPOConfig(
      num_minibatches=2,
      micro_batches=2,
      actor_lr=3e-3,
      critic_lr=3e-3,
      filter_include_zero=False,
      vocab_chunk=32,
      ppo_epochs=2,
  )
  plain = algos.make_train_step(actor, None, cfg, jit=False)

  # Traced (and so compiled) once for all the module's tests: a retrace fails the call causing it.
  @chex.assert_max_traces(n=1)
  def traced_step(state, batch, key):
    return plain(state, batch, key)

  chex.clear_trace_counter()
  step = jax.jit(traced_step, donate_argnums=0)
  return actor, cfg, step


def test_repeated_steps_lower_the_losses_without_recompiling(adamw_setup):
  actor, cfg, step = adamw_setup
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  batch = make_batch()
  m = batch.loss_mask_BxT
  logp0, _ = full_logp_entropy(actor, batch.tokens_BxT, batch.attention_mask_BxT)
  # Fixed advantages for the surrogate: γ = λ = 1 returns minus zero initial values, whitened.
  raw = ref_gae_raw(np.asarray(batch.token_rewards_BxT), np.zeros((B, T)), np.asarray(m))
  adv = jnp.asarray(
      np.where(np.asarray(m) > 0, raw - raw[np.asarray(m) > 0].mean(), 0.0), jnp.float32
  )

  def surrogate(st):
    logp, _ = full_logp_entropy(
        algos.actor_module(actor, st), batch.tokens_BxT, batch.attention_mask_BxT
    )
    return float(-algos.masked_mean(adv * (logp - logp0), m))

  vf = []
  for i in range(6):
    state, metrics = step(state, batch, jax.random.key(i))
    vf.append(float(metrics["critic/vf_loss"]))
  assert surrogate(state) < -0.05
  assert vf[-1] < 0.7 * vf[0]
  assert int(state.step) == 6 and int(state.skipped_steps) == 0
  expected = {
      "actor/pg_loss",
      "actor/pg_clipfrac",
      "actor/pg_clipfrac_lower",
      "actor/ppo_kl",
      "actor/entropy",
      "actor/grad_norm",
      "critic/vf_loss",
      "critic/vf_clipfrac",
      "critic/vf_explained_var",
      "critic/advantages/mean",
      "critic/advantages/max",
      "critic/advantages/min",
      "critic/returns/mean",
      "critic/values/mean",
      "rollout/in_group_reward_std",
      "rollout/filter_kept_ratio",
      "rollout/skipped",
  }
  assert expected <= set(metrics)
  assert all(np.isfinite(float(v)) and np.shape(v) == () for v in metrics.values())
  # Other contents with the same shapes (and a fully filtered batch below) reuse the program
  # (the fixture's chex.assert_max_traces fails a retrace).
  state, _ = step(state, make_batch(seed=7), jax.random.key(9))


def test_turn_records_leave_a_gae_step_unchanged():
  """The rollout's per-turn records (read by GiGPO alone) change nothing in another estimator's
  step: the same parameters and metrics, bit for bit."""
  actor = models.create(MODEL, jax.random.key(0))
  cfg = algos.PPOConfig(num_minibatches=2, filter_include_zero=False, vocab_chunk=32)
  token_turns = np.where(np.asarray(make_batch().loss_mask_BxT) > 0, 0, -1).astype(np.int32)
  turns = TurnBatch(
      rewards_BxK=jnp.ones((B, 2)),
      mask_BxK=jnp.ones((B, 2), jnp.int32),
      state_keys_BxK=jnp.zeros((B, 2), jnp.int32),
      token_turns_BxT=jnp.asarray(token_turns),
  )
  results = []
  for batch in (make_batch(), make_batch().replace(turns=turns)):
    state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
    step = algos.make_train_step(actor, None, cfg)
    state, metrics = step(state, batch, jax.random.key(2))
    results.append(snapshot((state.actor_params, state.critic_params, metrics)))
  assert "gigpo/step_group_share" not in results[0][2]
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_array_equal(a, b)


def test_rollout_probs_diff_compares_sampler_and_training_probabilities(adamw_setup):
  actor, cfg, step = adamw_setup
  batch = make_batch()
  logp0, _ = full_logp_entropy(actor, batch.tokens_BxT, batch.attention_mask_BxT)
  m = np.asarray(batch.loss_mask_BxT) > 0
  # The sampler's own log-probs: no mismatch.
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  _, metrics = step(state, batch.replace(logprobs_BxT=logp0), jax.random.key(0))
  assert float(metrics["training/rollout_probs_diff_max"]) < 1e-5
  # A sampler that gave every token probability 1 (log-prob 0): |p - 1| by hand.
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  _, metrics = step(state, batch, jax.random.key(0))
  gap = 1.0 - np.exp(np.asarray(logp0))[m]
  np.testing.assert_allclose(
      float(metrics["training/rollout_probs_diff_mean"]), gap.mean(), rtol=1e-4
  )
  np.testing.assert_allclose(
      float(metrics["training/rollout_probs_diff_max"]), gap.max(), rtol=1e-4
  )


def test_filter_masks_groups_and_skips_empty_steps(adamw_setup):
  actor, cfg, step = adamw_setup
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  # Every group has equal scores: include_zero=False keeps nothing, the step is a no-op.
  flat = make_batch(scores=(1.0,) * 4 + (2.0,) * 4)
  before = snapshot(state)
  state, metrics = step(state, flat, jax.random.key(0))
  assert float(metrics["rollout/skipped"]) == 1.0
  assert float(metrics["rollout/filter_kept_ratio"]) == 0.0
  assert all(np.isfinite(float(v)) for v in metrics.values())
  for x0, x1 in zip(jax.tree.leaves(before), jax.tree.leaves(state)):
    if x0.shape == () and x0.dtype == np.int32:
      continue
    np.testing.assert_array_equal(x0, x1)
  assert int(state.skipped_steps) == 1 and int(state.step) == 1

  # Second group flat: only the first group is trained, and the dropped group's tokens have no
  # influence on the update.
  scores = (1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0)
  base = make_batch(scores=scores)
  other_tokens = base.tokens_BxT.at[4:].set((base.tokens_BxT[4:] * 7 + 3) % MODEL.vocab_size)
  results = []
  for batch in (base, base.replace(tokens_BxT=other_tokens)):
    s = jax.tree.map(jnp.array, state)
    s, metrics = step(s, batch, jax.random.key(3))
    results.append(snapshot(s.actor_params))
    assert float(metrics["rollout/filter_kept_ratio"]) == 0.5
    assert float(metrics["train/num_updates"]) == 2.0  # one minibatch per epoch, 2 epochs
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- shared trunk, config checks


def test_shared_value_head_trains_trunk_and_head():
  """The shared head's value loss (times vf_coef) reaches the trunk: with a non-zero head the
  step's update (SGD at rate 1: the delta is minus the gradient) equals the gradient of the
  plain, unjitted policy loss plus vf_coef times the value loss, at vf_coef 0 and 1, and the
  two trunk gradients differ."""
  actor = models.create(MODEL, jax.random.key(0))
  sgd = optax.sgd(1.0)
  batch = make_batch()
  tokens, attn = batch.tokens_BxT, batch.attention_mask_BxT
  m = np.asarray(batch.loss_mask_BxT, np.float32)
  rng = np.random.RandomState(3)
  head0 = {
      "value_kernel": rng.normal(0.0, 0.5, MODEL.hidden_size).astype(np.float32),
      "value_bias": np.float32(0.25),
  }
  graphdef, _, rest = nnx.split(actor, nnx.Param, ...)

  def forward(params, head):
    model = nnx.merge(graphdef, params, rest)
    hidden, _ = model.backbone(tokens, attn)
    values = jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), head["value_kernel"])
    return model, jnp.pad((values + head["value_bias"])[:, :-1], ((0, 0), (1, 0)))

  trunk_grads = []
  for vf_coef in (0.0, 1.0):
    cfg = algos.PPOConfig(
        critic="shared",
        vf_coef=vf_coef,
        num_minibatches=1,
        micro_batches=1,
        shuffle=False,
        entropy_coeff=0.0,
        vocab_chunk=64,
    )
    state = algos.init_train_state(actor, None, cfg, jax.random.key(1), actor_tx=sgd, critic_tx=sgd)
    assert not np.asarray(state.critic_params["value_kernel"]).any()  # zero at init
    head = jax.tree.map(jnp.asarray, head0)  # a copy: the step donates the state
    state = state.replace(critic_params=head, critic_opt=sgd.init(head))
    before = snapshot((state.actor_params, state.critic_params))
    step = algos.make_train_step(actor, None, cfg, actor_tx=sgd, critic_tx=sgd)
    state, metrics = step(state, batch, jax.random.key(0))
    after = snapshot((state.actor_params, state.critic_params))

    # The plain reference: old values from the head at its start, NumPy GAE, whitening.
    params0 = jax.tree.map(jnp.asarray, before[0])
    _, values = forward(params0, head0)
    values = np.asarray(values, np.float64) * m
    raw = ref_gae_raw(np.asarray(batch.token_rewards_BxT, np.float64), values, m)
    valid = raw[m == 1]
    adv = jnp.asarray((raw - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8), jnp.float32)
    returns = jnp.asarray(raw + values, jnp.float32)
    old_logp, _ = full_logp_entropy(actor, tokens, attn)

    def loss(params, head, old_values, returns, old_logp, adv, vf_coef):
      model, v = forward(params, head)
      logp, _ = full_logp_entropy(model, tokens, attn)
      pg, _ = algos.policy_loss(logp, old_logp, adv, m, **clips(cfg))
      vf, _ = algos.value_loss(v, old_values, returns, m, 0.5)
      return pg + vf_coef * vf

    g_trunk, g_head = jax.grad(loss, argnums=(0, 1))(
        params0,
        jax.tree.map(jnp.asarray, head0),
        jnp.asarray(values, jnp.float32),
        returns,
        old_logp,
        adv,
        vf_coef,
    )
    for g_ref, b0, b1 in ((g_trunk, before[0], after[0]), (g_head, before[1], after[1])):
      flat_ref = jax.tree.leaves(g_ref)
      flat_delta = [x1 - x0 for x0, x1 in zip(jax.tree.leaves(b0), jax.tree.leaves(b1))]
      scale = max(np.abs(np.asarray(g)).max() for g in flat_ref)
      for gr, d in zip(flat_ref, flat_delta):
        np.testing.assert_allclose(-d, gr, rtol=1e-3, atol=1e-5 * scale)
    head_moved = np.abs(after[1]["value_kernel"] - before[1]["value_kernel"]).max()
    assert (head_moved > 0) == (vf_coef > 0)  # vf_coef 0: the head gets no gradient either
    assert float(metrics["critic/vf_loss"]) > 0 and np.isfinite(float(metrics["actor/pg_loss"]))
    trunk_grads.append(jax.tree.leaves(g_trunk))
  # The value loss's share of the trunk gradient is far above the tolerance used above.
  for g0, g1 in zip(*trunk_grads):
    scale = np.abs(np.asarray(g1)).max()
    assert np.abs(np.asarray(g1) - np.asarray(g0)).max() > 0.05 * scale


def test_config_validation():
  with pytest.raises(ValueError, match="adv_estimator"):
    algos.PPOConfig(adv_estimator="ppo")
  with pytest.raises(ValueError, match="clip_c"):
    algos.PPOConfig(clip_c=1.0)
  with pytest.raises(ValueError, match="agg_mode"):
    algos.PPOConfig(agg_mode="mean")
  with pytest.raises(ValueError, match="filter_strategy"):
    algos.PPOConfig(filter_strategy="top_q")
  with pytest.raises(ValueError, match="num_minibatches"):
    algos.PPOConfig(num_minibatches=0)
  with pytest.raises(ValueError, match="divisible"):
    algos.PPOConfig(num_minibatches=3).check_batch(8)
  cfg = algos.PPOConfig()
  assert (cfg.policy.clip_low, cfg.policy.clip_high, cfg.entropy_coeff, cfg.weight_decay) == (
      0.2,
      0.28,
      0.001,
      0.01,
  )


def test_the_update_scores_tokens_at_the_rollouts_temperature():
  """The old log-probs are those of the sampled distribution, logits / the rollout temperature
  (`make_train_step(temperature=...)`): a batch sampled at 0.5 matches at 0.5, not at 1."""
  actor = models.create(MODEL, jax.random.key(0))
  cfg = algos.PPOConfig(num_minibatches=2, filter_include_zero=False, vocab_chunk=32)
  batch = make_batch()
  logits = actor(batch.tokens_BxT, batch.attention_mask_BxT) / 0.5
  lsm = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(lsm, batch.tokens_BxT[:, 1:, None], -1)[..., 0]
  batch = batch.replace(logprobs_BxT=jnp.pad(logp, ((0, 0), (1, 0))) * batch.loss_mask_BxT)
  diffs = {}
  for temperature in (0.5, 1.0):
    step = algos.make_train_step(actor, None, cfg, temperature=temperature)
    state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
    _, metrics = step(state, batch, jax.random.key(2))
    diffs[temperature] = float(metrics["training/rollout_probs_diff_mean"])
  assert diffs[0.5] < 1e-5 < 1e-3 < diffs[1.0], diffs

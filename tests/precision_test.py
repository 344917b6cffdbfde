"""bfloat16 parameters and optimizer moments: the optimizer (algos/optim.py), one StarPO update
against a float32 reference, and the run's models (train/policy.py).

Dimensions: B episodes, T tokens.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.algos import optim
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import policy
from ragen_jax.train import run_state
from tiny import make_batch  # pylint: disable=g-bad-import-order
from tiny import MODEL  # pylint: disable=g-bad-import-order

BF16, F32 = jnp.bfloat16, jnp.float32


def _tree(dtype, seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {"w": jax.random.normal(k1, (4, 3)).astype(dtype), "b": jax.random.normal(k2, (3,))}


def _adam_states(opt_state):
  """The ScaleByAdamState leaves inside an optax state tree."""
  return [
      s
      for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
      if isinstance(s, optax.ScaleByAdamState)
  ]


def _ulp_bf16(x):
  """The spacing of bfloat16 numbers (8 significant bits) at |x|."""
  x = np.maximum(np.abs(np.asarray(x, np.float32)), np.finfo(np.float32).tiny)
  return 2.0 ** (np.floor(np.log2(x)) - 7)


def test_float32_moments_are_optax_adamw_bit_for_bit():
  ours = optim.adamw(1e-2, weight_decay=0.01)
  theirs = optax.adamw(1e-2, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
  params = _tree(F32)
  s1, s2 = ours.init(params), theirs.init(params)
  assert jax.tree.structure(s1) == jax.tree.structure(s2)  # checkpoints of either fit the other
  for i in range(3):
    grads = _tree(F32, seed=10 + i)
    u1, s1 = ours.update(grads, s1, params)
    u2, s2 = theirs.update(grads, s2, params)
    jax.tree.map(np.testing.assert_array_equal, (u1, s1), (u2, s2))
    params = optax.apply_updates(params, u1)


@pytest.mark.parametrize("param_dtype", [F32, BF16], ids=["f32_params", "bf16_params"])
@pytest.mark.parametrize("moment_dtype", ["float32", "bfloat16"])
def test_both_moments_are_stored_in_the_moment_dtype(param_dtype, moment_dtype):
  tx = optax.chain(optax.clip_by_global_norm(1.0), optim.adamw(1e-3, moment_dtype=moment_dtype))
  params = _tree(param_dtype)
  state = tx.init(params)
  for _ in range(2):
    updates, state = jax.jit(tx.update)(_tree(param_dtype, seed=5), state, params)
    assert {u.dtype for u in jax.tree.leaves(updates)} == {jnp.dtype(F32)}  # applied once
    params = optax.apply_updates(params, updates)
  (adam,) = _adam_states(state)
  assert adam.count.dtype == jnp.int32 and int(adam.count) == 2
  for moment in (adam.mu, adam.nu):
    assert {x.dtype for x in jax.tree.leaves(moment)} == {jnp.dtype(moment_dtype)}
  assert params["w"].dtype == param_dtype  # parameters keep their storage dtype


def test_bfloat16_moments_are_the_float32_moments_rounded():
  params = _tree(BF16)
  txs = {d: optim.adamw(1e-3, moment_dtype=d) for d in ("float32", "bfloat16")}
  states = {d: tx.init(params) for d, tx in txs.items()}
  grads = _tree(BF16, seed=7)
  updates = {}
  for d, tx in txs.items():
    updates[d], states[d] = tx.update(grads, states[d], params)
  # Step 1 computes in float32 from zero moments: the same update; the stored moments are the
  # float32 ones rounded once.
  jax.tree.map(np.testing.assert_array_equal, updates["bfloat16"], updates["float32"])
  (m16,), (m32,) = _adam_states(states["bfloat16"]), _adam_states(states["float32"])
  for a, b in zip(jax.tree.leaves((m16.mu, m16.nu)), jax.tree.leaves((m32.mu, m32.nu))):
    np.testing.assert_array_equal(a, b.astype(BF16))
  # Step 2 reads them back: mu and nu off by at most half an ulp (2^-9), the update by ~2^-8 of
  # itself or, where the new gradient cancels mu, of the learning rate.
  grads = _tree(BF16, seed=8)
  for d, tx in txs.items():
    updates[d], states[d] = tx.update(grads, states[d], params)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=2**-7, atol=2**-8 * 1e-3),
      updates["bfloat16"],
      updates["float32"],
  )


def test_an_update_below_half_a_bfloat16_ulp_of_its_weight_vanishes():
  # What bfloat16 parameters lose (optim.py): near 1.0 the spacing is 2^-7, so 1e-3 rounds away
  # and 5e-3 moves the weight by one ulp; float32 keeps both.
  updates = jnp.asarray([1e-3, 5e-3], F32)
  assert optax.apply_updates(jnp.ones(2, BF16), updates).tolist() == [1.0, 1.0 + 2**-7]
  np.testing.assert_allclose(optax.apply_updates(jnp.ones(2, F32), updates), [1.001, 1.005])


def _cfg(moment_dtype):
  return algos.PPOConfig(
      adv_estimator="gae",
      num_minibatches=1,
      micro_batches=2,
      actor_lr=1e-2,  # steps well above a bfloat16 ulp of the weights: the update shows
      critic_lr=1e-2,
      use_kl_loss=True,
      kl_coef=0.1,
      vocab_chunk=32,
      shuffle=False,
      moment_dtype=moment_dtype,
  )


def _one_update(actor, moment_dtype):
  cfg = _cfg(moment_dtype)
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  before = jax.tree.map(np.asarray, state.actor_params)
  step = algos.make_train_step(actor, None, cfg)
  state, metrics = step(state, make_batch(), jax.random.key(2))
  return before, state, jax.device_get(metrics)


@pytest.fixture(scope="module")
def float32_reference():
  """One update of a float32 actor holding the bfloat16 actor's weights, float32 moments."""
  actor_bf16 = models.create(MODEL, jax.random.key(0), param_dtype=BF16)
  graphdef = nnx.graphdef(models.create(MODEL, jax.random.key(0)))
  actor = nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(F32), nnx.state(actor_bf16)))
  return actor_bf16, _one_update(actor, "float32")[1:]


@pytest.mark.parametrize("moment_dtype", ["float32", "bfloat16"])
def test_bf16_update_matches_the_float32_update_within_bfloat16_rounding(
    float32_reference, moment_dtype
):
  actor_bf16, (ref, ref_metrics) = float32_reference
  before, state, metrics = _one_update(actor_bf16, moment_dtype)
  # Actor, separate critic (a copy of the decoder) and reference policy are stored in bfloat16;
  # the critic's value head stays float32; the moments are in their own dtype.
  for params in (state.actor_params, state.ref_params, state.critic_params["decoder"]):
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(BF16)}
  assert state.critic_params["value_kernel"].dtype == F32
  for opt in (state.actor_opt, state.critic_opt):
    (adam,) = _adam_states(opt)
    assert {x.dtype for x in jax.tree.leaves((adam.mu, adam.nu))} == {jnp.dtype(moment_dtype)}
  # The same weights give the same losses; the gradient differs by its bfloat16 rounding.
  for key in ("actor/pg_loss", "critic/vf_loss", "actor/entropy"):
    assert metrics[key] == ref_metrics[key], key
  np.testing.assert_allclose(metrics["actor/grad_norm"], ref_metrics["actor/grad_norm"], rtol=1e-4)
  # Each weight is the float32 result rounded to bfloat16 (within one ulp), except where the
  # bfloat16-rounded gradients of the two micro-batches nearly cancel (or the embedding's,
  # which the gather's transpose sums over tokens in bfloat16): Adam's first step,
  # lr * g / |g|, can then take the other sign (at most 2 lr away, a few entries in a thousand).
  # The critic's decoder gets no gradient through its zero value head at the first step, and its
  # weight decay (lr * wd * w, 1e-4 w) is below half a bfloat16 ulp: it stays put, within an ulp.
  lr = _cfg(moment_dtype).actor_lr
  got = (state.actor_params, state.critic_params)
  want = (ref.actor_params, ref.critic_params)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w)
    err, ulp = np.abs(g - w), _ulp_bf16(w)
    where = jax.tree_util.keystr(path)
    assert np.all(err <= 2 * lr + ulp), where
    assert np.mean(err > ulp) < 0.01, where
  moved = [
      np.mean(a != b) for a, b in zip(jax.tree.leaves(state.actor_params), jax.tree.leaves(before))
  ]
  assert min(moved) > 0.9, moved  # the actor's updates were applied, not rounded away


def test_the_run_builds_actor_critic_and_reference_in_the_param_dtype():
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.model.param_dtype = "bfloat16"
    config.ppo.use_kl_loss, config.ppo.kl_coef = True, 0.001
  exp = schema.from_config(config)
  model, _ = policy.build(exp)  # the shipped warm start, loaded in bfloat16
  assert model.config.param_dtype == BF16
  state = run_state.new_state(model, exp.ppo, jax.random.key(0)).train
  for params in (state.actor_params, state.ref_params, state.critic_params["decoder"]):
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(BF16)}
  (adam,) = _adam_states(state.actor_opt)
  assert {x.dtype for x in jax.tree.leaves((adam.mu, adam.nu))} == {jnp.dtype(F32)}

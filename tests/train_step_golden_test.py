"""Golden numbers of one StarPO update: any change to the train step's numerics shows up here.

GAE with a separate critic, entropy bonus and a k3 KL loss to a reference policy whose weights
are the actor's perturbed (so KL is not zero), AdamW, two minibatches of two micro-batches, on a
tiny Qwen2 and a fixed batch built here. Refactors must leave every number unchanged; a
deliberate change of behaviour updates GOLDEN (print `_run()` to get the new values).

Dimensions: B episodes, T tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.batch import RolloutBatch
from tiny import B  # pylint: disable=g-bad-import-order
from tiny import MODEL
from tiny import T

CFG = algos.PPOConfig(
    num_minibatches=2,
    micro_batches=2,
    actor_lr=1e-3,
    critic_lr=1e-3,
    entropy_coeff=0.01,
    use_kl_loss=True,
    kl_coef=0.1,
    kl_type="k3",
    vocab_chunk=24,
)

# Recorded on CPU (XLA:CPU, at the test session's compile flags: tests/conftest.py).
# critic/advantages/mean is left out: whitened advantages average to float noise around 0.
GOLDEN = {
    "actor/entropy": 4.14904260635376,
    "actor/entropy_loss": 4.149069309234619,
    "actor/grad_norm": 1.8773040771484375,
    "actor/kl_loss": 0.05882043018937111,
    "actor/pg_clipfrac": 0.0,
    "actor/pg_clipfrac_lower": 0.0,
    "actor/pg_loss": 0.07964734733104706,
    "actor/ppo_kl": 0.0005100915441289544,
    "actor/update_sum": -0.1864305553764325,
    "critic/advantages/max": 1.9821525812149048,
    "critic/advantages/min": -1.5705621242523193,
    "critic/grad_norm": 7.046664237976074,
    "critic/returns/mean": 1.2666666507720947,
    "critic/update_sum": 0.3154602400609292,
    "critic/values/mean": -0.12393474578857422,
    "critic/vf_clipfrac": 0.0,
    "critic/vf_explained_var": 0.047862350940704346,
    "critic/vf_loss": 1.281265139579773,
    "rollout/filter_kept_count": 2.0,
    "rollout/filter_kept_ratio": 1.0,
    "rollout/in_group_reward_std": 0.8040633201599121,
    "rollout/skipped": 0.0,
    "rollout/skipped_steps": 0.0,
    "train/num_updates": 2.0,
    "training/rollout_probs_diff_max": 0.5658202171325684,
    "training/rollout_probs_diff_mean": 0.1052016168832779,
}


def _batch():
  """Two groups of 4, left padding on every other row, two assistant turns per episode."""
  rng = np.random.RandomState(0)
  attn_BxT = np.ones((B, T), np.int32)
  attn_BxT[::2, :2] = 0
  tokens_BxT = np.where(attn_BxT > 0, rng.randint(1, MODEL.vocab_size, (B, T)), 0)
  loss_BxT = np.zeros((B, T), np.int32)
  loss_BxT[:, 4:7] = 1
  loss_BxT[:, 9:12] = 1
  loss_BxT[3, 9:12] = 0  # one episode ended after its first turn
  scores_B = np.asarray([1.0, 0.0, 1.0, 0.0, 2.0, 0.5, 3.0, 2.0], np.float32)
  rewards_BxT = np.zeros((B, T), np.float32)
  rewards_BxT[np.arange(B), T - 1 - np.argmax(loss_BxT[:, ::-1], axis=1)] = scores_B
  sampler_logp_BxT = -rng.uniform(0.5, 5.0, (B, T)).astype(np.float32)
  return RolloutBatch(
      tokens_BxT=jnp.asarray(tokens_BxT, jnp.int32),
      attention_mask_BxT=jnp.asarray(attn_BxT),
      loss_mask_BxT=jnp.asarray(loss_BxT),
      logprobs_BxT=jnp.asarray(sampler_logp_BxT),
      token_rewards_BxT=jnp.asarray(rewards_BxT),
      group_ids_B=jnp.asarray([3, 3, 3, 3, 8, 8, 8, 8], jnp.int32),
      scores_B=jnp.asarray(scores_B),
  )


def _perturbed(tree, key, scale=0.05):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(
      treedef, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  )


def _run():
  """One update; its metrics plus the summed parameter changes of actor and critic."""
  actor = models.create(MODEL, jax.random.key(0))
  state = algos.init_train_state(actor, None, CFG, jax.random.key(1))
  # Perturbed copies of the actor: a reference with a non-zero KL, and a critic whose value
  # head is not the zero initialisation (so values, and its trunk's gradients, are non-zero).
  state = state.replace(
      ref_params=_perturbed(state.ref_params, jax.random.key(2)),
      critic_params=_perturbed(state.critic_params, jax.random.key(4)),
  )
  before = jax.tree.map(np.asarray, (state.actor_params, state.critic_params))
  step = algos.make_train_step(actor, None, CFG)
  state, metrics = step(state, _batch(), jax.random.key(3))
  after = jax.tree.map(np.asarray, (state.actor_params, state.critic_params))
  out = {k: float(v) for k, v in metrics.items()}
  for name, b0, b1 in zip(("actor", "critic"), before, after):
    out[f"{name}/update_sum"] = float(
        sum(
            np.sum(x1.astype(np.float64) - x0)
            for x0, x1 in zip(jax.tree.leaves(b0), jax.tree.leaves(b1))
        )
    )
  return out


# Float32 rounding differs across CPUs (vector widths, fused multiply-adds). ppo_kl (~5e-4) is a
# mean of differences of log-probs near -4 (2.5e-8 apart between an AMD EPYC and the machine the
# values came from). The update sums come from Adam's first step, lr * m / (sqrt(v) + eps): a
# gradient entry at float-rounding size moves its parameter by up to +-lr, so the sums differ by a
# fraction of lr between machines (5e-6 between two Xeons); a change of behaviour moves hundreds
# of entries by lr each.
_ATOL = {"actor/update_sum": 5e-5, "critic/update_sum": 5e-5}


def test_one_update_matches_golden_numbers():
  got = _run()
  changed = {
      k: (got.get(k), want)
      for k, want in GOLDEN.items()
      if k not in got or not np.isclose(got[k], want, rtol=1e-5, atol=_ATOL.get(k, 1e-7))
  }
  assert not changed, (
      "train step numbers changed: did you mean to change behaviour? If so, update the golden "
      "values in tests/train_step_golden_test.py. (name: (got, golden)) "
      + ", ".join(f"{k}: {v}" for k, v in sorted(changed.items()))
  )
  assert got["actor/kl_loss"] > 1e-4 and got["critic/vf_loss"] > 0 and got["actor/entropy"] > 0

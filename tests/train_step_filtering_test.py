"""The train step under the rollout filter and advantage clipping: the update on a filtered
batch equals the update on its kept episodes alone (micro-batches of dropped episodes skipped),
and positive-only advantages equal training on scores clipped at zero.

Dimensions: B episodes, T tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ragen_jax import algos
from ragen_jax import models
from tiny import make_batch  # pylint: disable=g-bad-import-order
from tiny import MODEL


def test_filtered_update_equals_update_on_the_kept_episodes_alone():
  """The step skips micro-batches holding only dropped episodes; the update must not change.

  The groups interleave (so kept episodes must be moved first); the kept half of an 8-episode
  batch in two minibatches (the second, all dropped, skipped) must train exactly as the 4 kept
  episodes do in one.
  """
  actor = models.create(MODEL, jax.random.key(0))
  sgd = optax.sgd(0.1)
  ids = jnp.asarray([3, 8] * 4, jnp.int32)
  full = make_batch(scores=(1.0, 2.0, 0.0, 2.0, 1.0, 2.0, 0.0, 2.0)).replace(group_ids_B=ids)
  kept = jax.tree.map(lambda x: x[::2], full)  # group 3; group 8 is flat
  results = []
  for batch, n_mb in ((full, 2), (kept, 1)):
    cfg = algos.PPOConfig(
        num_minibatches=n_mb,
        micro_batches=1,
        shuffle=False,
        filter_include_zero=False,
        vocab_chunk=32,
    )
    state = algos.init_train_state(actor, None, cfg, jax.random.key(1), actor_tx=sgd, critic_tx=sgd)
    step = algos.make_train_step(actor, None, cfg, actor_tx=sgd, critic_tx=sgd)
    state, metrics = step(state, batch, jax.random.key(2))
    assert float(metrics["train/num_updates"]) == 1.0
    results.append((jax.tree.map(np.array, (state.actor_params, state.critic_params)), metrics))
  (p_full, m_full), (p_kept, m_kept) = results
  assert float(m_full["rollout/filter_kept_ratio"]) == 0.5
  for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_kept)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  for name in ("actor/pg_loss", "critic/vf_loss", "actor/entropy", "critic/advantages/max"):
    np.testing.assert_allclose(m_full[name], m_kept[name], rtol=1e-5, atol=1e-7)


def test_positive_advantages_only_equals_training_on_clipped_scores():
  """Raw-score advantages (arpo) of (1, -2, ...) with negatives zeroed train exactly as the
  scores (1, 0, ...) do without the flag; without it the negative scores change the update."""
  actor = models.create(MODEL, jax.random.key(0))
  sgd = optax.sgd(0.1)
  scores = (1.0, -2.0, 0.5, -1.0, 2.0, -0.5, 3.0, -3.0)
  params = []
  for flag, s, adv_min in (
      (True, scores, 0.0),
      (False, np.maximum(scores, 0.0), 0.0),
      (False, scores, -3.0),
  ):
    cfg = algos.PPOConfig(
        adv_estimator="arpo",
        num_minibatches=1,
        shuffle=False,
        positive_advantages_only=flag,
        vocab_chunk=32,
    )
    state = algos.init_train_state(actor, None, cfg, jax.random.key(1), actor_tx=sgd)
    step = algos.make_train_step(actor, None, cfg, actor_tx=sgd)
    state, metrics = step(state, make_batch(scores=s), jax.random.key(2))
    assert float(metrics["critic/advantages/min"]) == adv_min
    params.append(jax.tree.leaves(jax.tree.map(np.array, state.actor_params)))
  for a, b in zip(params[0], params[1]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
  assert max(float(np.max(np.abs(a - c))) for a, c in zip(params[0], params[2])) > 1e-4

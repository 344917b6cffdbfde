"""A jitted train step is reused by a later run of the same program in the same process
(`algos.make_train_step`): it computes that run's update exactly, is traced once, and keeps no
run's weights alive; any change to what the program is made of gets a step of its own."""

import dataclasses
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.algos.train_state import optimizer
from tiny import make_batch  # pylint: disable=g-bad-import-order
from tiny import MODEL

CFG = algos.PPOConfig(adv_estimator="gae", num_minibatches=2, ppo_epochs=1)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_later_run_of_the_same_program_reuses_the_step_and_computes_its_own_update():
  first, later = models.create(MODEL, jax.random.key(0)), models.create(MODEL, jax.random.key(1))
  step = algos.make_train_step(first, None, CFG)
  assert algos.make_train_step(later, None, CFG) is step
  # The same update from a step of its own (optimizers passed in are never shared).
  own = algos.make_train_step(
      later,
      None,
      CFG,
      actor_tx=optimizer(CFG.actor_lr, CFG),
      critic_tx=optimizer(CFG.critic_lr, CFG),
  )
  assert own is not step

  batch, key = make_batch(), jax.random.key(2)
  state_a = algos.init_train_state(later, None, CFG, jax.random.key(3))
  state_b = algos.init_train_state(later, None, CFG, jax.random.key(3))
  state_a, metrics_a = step(state_a, batch, key)
  state_b, metrics_b = own(state_b, batch, key)
  assert float(metrics_a["train/num_updates"]) == 2.0
  for a, b in zip(_leaves((state_a, metrics_a)), _leaves((state_b, metrics_b))):
    np.testing.assert_array_equal(a, b)
  # The first run's state goes through the same compiled program: one trace for both.
  step(algos.init_train_state(first, None, CFG, jax.random.key(4)), batch, key)
  assert step._cache_size() == 1  # pylint: disable=protected-access


def test_another_program_gets_its_own_step():
  actor = models.create(MODEL, jax.random.key(0))
  step = algos.make_train_step(actor, None, CFG)
  assert algos.make_train_step(actor, None, CFG) is step
  others = [
      algos.make_train_step(actor, None, dataclasses.replace(CFG, clip_high=0.3)),
      algos.make_train_step(actor, None, dataclasses.replace(CFG, adv_estimator="grpo")),
      algos.make_train_step(actor, None, CFG, temperature=0.7),
      algos.make_train_step(
          models.create(MODEL, jax.random.key(0), param_dtype=jnp.bfloat16), None, CFG
      ),
      algos.make_train_step(
          models.create(MODEL.replace(num_layers=1), jax.random.key(0)), None, CFG
      ),
  ]
  assert len({id(s) for s in (step, *others)}) == 1 + len(others)
  # A few are kept, the most recently made: the first of these six programs was let go.
  assert algos.make_train_step(actor, None, CFG) is not step
  assert algos.make_train_step(actor, None, CFG) is algos.make_train_step(actor, None, CFG)


def test_a_kept_step_holds_no_weights():
  actor = models.create(MODEL, jax.random.key(5))
  step = algos.make_train_step(actor, None, CFG)  # a separate critic, initialised from the actor
  alive = weakref.ref(actor)
  del actor
  gc.collect()
  assert alive() is None
  assert step is not None

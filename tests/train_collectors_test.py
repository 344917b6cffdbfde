"""The trainer's cadence rule (trainer.due) and its collectors' contracts (train/collectors.py,
train/pipeline.py), without training. The runs they drive are checked end to end, bit for bit,
in train_test.py and async_rollout_test.py."""

import types

import jax
import pytest

from ragen_jax import models
from ragen_jax import sharding
from ragen_jax.algos.step_records import param_dict
from ragen_jax.train import collectors
from ragen_jax.train import pipeline
from ragen_jax.train import run_state
from ragen_jax.train import trainer


def test_an_event_every_n_steps_falls_on_each_nth_step_and_the_last_or_first():
  assert [s for s in range(1, 11) if trainer.due(s, 4, 10)] == [4, 8, 10]
  assert [s for s in range(1, 4) if trainer.due(s, 1, 3)] == [1, 2, 3]
  assert [s for s in range(1, 4) if trainer.due(s, 10, 3)] == [3]
  assert not any(trainer.due(s, 0, 3) for s in range(1, 4))  # never
  # The collapse diagnostics' use: step 1 and every N, not the last step (RAGEN-2's rule).
  assert [s for s in range(1, 13) if trainer.due(s, 5, first=True)] == [1, 5, 10]
  assert not any(trainer.due(s, 0, first=True) for s in range(1, 4))


def test_the_synchronous_collector_is_the_identity_around_the_step():
  collector = collectors.Synchronous({}, exp=None, model=None)
  state, host = object(), types.SimpleNamespace(behaviour_step=7)
  assert collector.checkpoint(state, host) is state
  assert collector.restore_target(state) is state
  assert collector.restored(state, host) is state
  assert host.behaviour_step == 7
  collector.start("warm-started model", state)
  assert collector.model == "warm-started model"  # the weights it plays from now on
  collector.after_dispatch(1)


def _one_step_ahead():
  model = models.create("tiny", jax.random.key(0))
  exp = types.SimpleNamespace(trainer=types.SimpleNamespace(max_staleness=1, total_steps=4))
  return pipeline.OneStepAhead({}, exp, model, sharding.Sharder(sharding.MeshSpec()))


def test_one_step_ahead_refuses_a_rollout_of_another_step():
  collector = _one_step_ahead()
  collector.in_flight = pipeline.Played(step=3, results={}, version=1, seconds=0.0)
  state = types.SimpleNamespace(train=types.SimpleNamespace(actor_params=None))
  with pytest.raises(RuntimeError, match="step 2: the rollout of step 3 is out of order"):
    collector.take(state, 2, inspect=lambda policy, results: {})


def test_one_step_ahead_checkpoints_the_weights_of_the_next_rollout():
  collector = _one_step_ahead()
  collector.weights.load(param_dict(collector.model), version=3)
  host = types.SimpleNamespace(behaviour_step=0)
  saved = collector.checkpoint("state", host)
  assert isinstance(saved, run_state.PipelinedState)
  assert saved.run == "state" and saved.behaviour is collector.weights.trainable
  assert host.behaviour_step == 3

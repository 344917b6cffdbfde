"""The trainer's cadence rule (trainer.due) and its collectors' contracts (train/collectors.py,
train/pipeline.py), without training: one step ahead at staleness 0 plays the synchronous
batches, dynamic sampling's refills included. The runs they drive are checked end to end, bit
for bit, in train_test.py and async_rollout_test.py."""

import os
import types

import jax
import numpy as np
import pytest

from ragen_jax import keys
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sharding
from ragen_jax.algos.step_records import param_dict
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import collectors
from ragen_jax.train import dynamic_sampling
from ragen_jax.train import pipeline
from ragen_jax.train import policy as policy_lib
from ragen_jax.train import run_state
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# ---------------------------------------------------------------- with dynamic sampling


def _dynamic_exp():
  """The `:smoke` run (the warm-started tiny model, 2 Sokoban groups of 2) with up to 2 sampling
  rounds a step; max_staleness 0 for the one-step-ahead collector."""
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke")
  with config.unlocked():
    config.trainer.total_steps = 2
    config.trainer.max_staleness = 0
    config.rollout.dynamic_sampling = True
    config.rollout.max_sampling_rounds = 2
  return schema.from_config(config)


def _played(taken):
  """{tag: (the batch's arrays, the trained episodes' (level, group), the summary without wall
  times)} of a Taken."""
  return {
      tag: (
          [np.asarray(x) for x in jax.tree.leaves(result.batch)],
          [(ep.seed, ep.group_id) for ep in result.episodes],
          {k: v for k, v in result.summary.items() if not k.endswith("_s")},
      )
      for tag, result in taken.results.items()
  }


def test_one_step_ahead_at_staleness_zero_plays_the_synchronous_refilled_batches():
  """Two steps with the weights changed between them (as an update changes them): the
  rollout-side collector plays each step's rounds with the newest weights, the step's keys and
  its refill levels, bit for bit the synchronous collector's batches."""
  exp = _dynamic_exp()
  sharder = sharding.Sharder(sharding.MeshSpec())
  model, tok = policy_lib.build(exp, sharder)  # one device: both collectors share programs
  engines = {
      e.tag: rollout.Rollout(e.make(), tok, e.rollout_config(exp.rollout, False), sharder)
      for e in exp.envs
  }
  state = run_state.new_state(model, exp.ppo, keys.base(exp.seed))
  state = jax.device_put(state, sharder.tree(state))  # as the trainer places it
  sync = collectors.Synchronous(engines, exp, model)
  ahead = pipeline.OneStepAhead(engines, exp, model, sharder)
  for collector in (sync, ahead):
    collector.start(model, state)
  # What `inspect` sees: the weights that played the batch.
  inspect = lambda policy, results: {
      "weights": float(sum(x.sum() for x in jax.tree.leaves(param_dict(policy))))
  }
  rounds, refills_trained = [], []
  try:
    for step in (1, 2):
      if step == 2:  # an update's new weights
        moved = jax.tree.map(lambda x: x * 1.01, state.train.actor_params)
        state = state.replace(train=state.train.replace(actor_params=moved))
      want = sync.take(state, step, inspect)
      got = ahead.take(state, step, inspect)
      ahead.after_dispatch(step)
      assert ahead.in_flight is None  # staleness 0: nothing is played ahead
      assert got.metrics["async/staleness"] == 0.0 and got.diagnostics == want.diagnostics
      mine, theirs = _played(got), _played(want)
      assert mine.keys() == theirs.keys() == {"sokoban"}
      arrays, levels, summary = mine["sokoban"]
      for a, b in zip(arrays, theirs["sokoban"][0], strict=True):
        np.testing.assert_array_equal(a, b)
      assert (levels, summary) == theirs["sokoban"][1:]
      rounds.append(dynamic_sampling.metrics(got.results)["rollout/sampling_rounds"])
      refill = keys.level_seeds_of_round(exp, step, 1)["sokoban"]
      refills_trained.append(any(refill <= seed < refill + 2 for seed, _ in levels))
  finally:
    for engine in engines.values():
      engine.close()
  assert max(rounds) == 2  # refill rounds were played,
  assert any(refills_trained)  # and the batch of a step trained a refill round's group

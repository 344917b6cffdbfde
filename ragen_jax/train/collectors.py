"""Where each training step's batch comes from: the collector interface and its synchronous mode.

    collector = collectors.Synchronous(engines, exp, model)  # or pipeline.OneStepAhead(...)
    collector.start(model, state)                  # a fresh run's starting point
    taken = collector.take(state, s, inspect)      # the batch step s trains on
    train_state, metrics = train_step(...)         # dispatched, not awaited
    collector.after_dispatch(s)                    # what runs while the update computes
    ckpt.save(s, collector.checkpoint(state, host), ...)

The mode is chosen once, when the trainer is built; the trainer calls the same methods whatever
it is, so its loop does not branch on it:

  Synchronous            plays each step's rollout when the step asks for it, with the weights
                         being trained; the identity at the after-dispatch hook, in checkpoints
                         and in restores.
  pipeline.OneStepAhead  plays the rollout of step s+1 on devices of its own while step s trains
                         (trainer.async_rollout).
"""

import dataclasses
import time
from typing import Any, Callable, Dict

from ragen_jax import algos
from ragen_jax import keys
from ragen_jax import rollout as rollout_lib
from ragen_jax.train import batching
from ragen_jax.train import dynamic_sampling
from ragen_jax.train import run_state

# (the policy that played a batch, the batch's {tag: RolloutResult}) -> the step's diagnostics,
# after any checks on the batch (the trainer's, run under the policy that sampled it).
Inspect = Callable[[Any, Dict[str, rollout_lib.RolloutResult]], Dict[str, float]]


@dataclasses.dataclass
class Taken:
  """The batch one training step trains on."""

  results: Dict[str, rollout_lib.RolloutResult]  # {tag: the tag's rollout}
  diagnostics: Dict[str, float]  # what `inspect` found, under the policy that played it
  seconds: float  # the rollout's wall time (timing_s/gen)
  metrics: Dict[str, float]  # the mode's own metrics (async/*, weight copies)


def play(engines, exp, policy, step_key, step: int) -> Dict[str, rollout_lib.RolloutResult]:
  """Every tag's rollout of training step `step` by `policy`, its environment metrics added:
  one round of the step's levels, or with `rollout.dynamic_sampling` refill rounds of fresh
  levels until the batch holds groups with reward spread (train/dynamic_sampling.py)."""
  results = {
      tag: dynamic_sampling.play_groups(
          engine,
          rollout_lib.ModelPolicy(policy),
          exp.rollout.sampling_rounds,
          lambda r, i=i: keys.rollout(keys.sampling_round(step_key, r), i),
          lambda r, tag=tag: keys.level_seeds_of_round(exp, step, r)[tag],
      )
      for i, (tag, engine) in enumerate(engines.items())
  }
  for tag, result in results.items():
    batching.add_env_metrics(engines[tag].env, result)
  return results


class Collector:
  """Synchronous collection; also the interface every collector implements.

  The batch of a step is played when the step asks for it, with the weights being trained;
  every other method is an identity here.
  """

  def __init__(self, engines: Dict[str, rollout_lib.Rollout], exp, model):
    self.engines, self.exp, self.model = engines, exp, model

  def start(self, model, state: run_state.RunState) -> None:
    """A fresh run's starting point: `model` (after any warm start) carrying `state`."""
    del state
    self.model = model

  def take(self, state: run_state.RunState, step: int, inspect: Inspect) -> Taken:
    """The batch step `step` trains on, inspected under the policy that played it."""
    tic = time.perf_counter()
    policy = algos.actor_module(self.model, state.train)
    results = play(self.engines, self.exp, policy, keys.step(state.key, step), step)
    seconds = time.perf_counter() - tic
    return Taken(results, inspect(policy, results), seconds, {})

  def after_dispatch(self, step: int) -> None:
    """Runs once the update of `step` is dispatched, while the devices compute it."""
    del step

  def checkpoint(self, state: run_state.RunState, host: run_state.HostState) -> Any:
    """What a checkpoint after `state` holds (noting in `host` what its metadata needs)."""
    del host
    return state

  def restore_target(self, like) -> Any:
    """The arrays a checkpoint restores into, given `like`, the RunState's (placed)."""
    return like

  def restored(self, restored, host: run_state.HostState) -> run_state.RunState:
    """The RunState of a restored checkpoint, whatever else it held put in place."""
    del host
    return restored


class Synchronous(Collector):
  """Each step's rollout played when the step asks for it, on the training devices."""

"""Rollouts one step ahead on their own devices (`trainer.async_rollout`).

    ahead = pipeline.Pipeline(model, rollout_sharder, max_staleness=1)
    played, _ = ahead.take(s, actor_params, new_collect)    # the batch of step s
    ahead.advance(actor_params, s)                          # the weights after s-1 go over
    train_state, metrics = train_step(...)                  # dispatched, not awaited
    ahead.launch(s + 1, collect)                            # the next rollout, meanwhile
    metrics = jax.device_get(metrics)                       # only now wait for the update

`mesh.rollout_devices` = N splits the devices (sharding.split_devices): the first N play the
rollouts on a mesh of their own (episodes over data, the training mesh's tensor split), the rest
train on the configured mesh. One process drives both: JAX dispatches the update of step s and
returns at once, the host then plays the rollout of step s+1 on the rollout devices (its
environments stepping while the training devices compute) with the weights of step s-1, and
only then fetches the update's metrics. The new weights reach the rollout devices at the start
of the next step; under LoRA only the adapters travel (the frozen base is placed once).

Staleness: a batch played with the weights after step v and trained at step s (from the weights
after step s-1) is s-1-v steps stale, logged as `async/staleness`. One step ahead it is 1 (0 at
step 1); `trainer.max_staleness` = 0 makes each rollout wait for the newest weights, which is
the synchronous schedule on separate devices. The update uses the sampler's log-probs as the
behaviour policy of `ppo.rollout_correction` (the PPO ratio against the recomputed old
log-probs).

Resume: a checkpoint after step s also holds the weights that play the rollout of step s+1
(`run_state.PipelinedState.behaviour`, their step in the metadata), so a resumed run replays
that rollout exactly as the uninterrupted run played it.
"""

import dataclasses
import time
from typing import Any, Callable, Dict, Optional

import jax

from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.models import lora
from ragen_jax.train import run_state


@dataclasses.dataclass
class Played:
  """A rollout of one training step, and what it was played with."""

  step: int  # the training step whose batch it is
  results: Dict[str, Any]  # {tag: rollout.RolloutResult}
  version: int  # the step whose weights played it (0: the starting point)
  seconds: float  # the host loop's wall time

  def staleness(self) -> int:
    """Steps between the weights that played the batch and those it is trained from."""
    return self.step - 1 - self.version


class RolloutWeights:
  """The actor's parameters on the rollout devices, and the step they come from."""

  def __init__(self, model, sharder):
    graph = ModelGraph.of(model)  # its non-parameter state on the rollout devices too
    self.graph = ModelGraph(graph.graphdef, jax.device_put(graph.rest, sharder.replicated))
    self.sharder = sharder
    self.frozen = None  # LoRA: the base weights, placed once
    self.trainable = None  # what each load copies (everything without LoRA)
    self.version = -1

  def shardings(self, trainable_like) -> Any:
    """The rollout devices' shardings of the trainable part (also the checkpoint's)."""
    return self.sharder.tree(trainable_like)

  def load(self, actor_params, version: int, trainable=None) -> float:
    """Copies the actor's trainable parameters (all, or the adapters under LoRA) to the rollout
    devices, or places `trainable` (restored from a checkpoint) there; returns the seconds the
    copy took (waited for: the update about to be dispatched donates `actor_params`)."""
    tic = time.perf_counter()
    part, frozen = lora.partition(actor_params)
    if self.frozen is None:
      self.frozen = jax.device_put(frozen, self.shardings(frozen))
    source = part if trainable is None else trainable
    self.trainable = jax.block_until_ready(jax.device_put(source, self.shardings(source)))
    self.version = version
    return time.perf_counter() - tic

  def policy(self):
    """The actor module carrying these weights (its programs run on the rollout devices)."""
    return self.graph.merge(lora.combine(self.trainable, self.frozen))


def play(
    weights: RolloutWeights, step: int, collect: Callable[[Any, int], Dict[str, Any]]
) -> Played:
  """The rollout of `step` with `weights` (`collect(policy, step)`: the trainer's rollout)."""
  tic = time.perf_counter()
  results = collect(weights.policy(), step)
  return Played(step, results, weights.version, time.perf_counter() - tic)


class Pipeline:
  """The rollout devices' weights and the rollout in flight, as the trainer's loop uses them."""

  def __init__(self, model, sharder, max_staleness: int):
    self.weights = RolloutWeights(model, sharder)
    self.max_staleness = max_staleness
    self.in_flight: Optional[Played] = None

  def player(self, step_key, play_fn: Callable[[Any, Any, int], Dict[str, Any]]):
    """`collect(policy, step)`: `play_fn(policy, key, step)` with `step_key` placed on the
    rollout devices now. Derived later, on the training devices, the key would queue behind the
    update dispatched meanwhile, and the rollout would wait for the update instead of
    overlapping it."""
    key = jax.device_put(step_key, self.weights.sharder.replicated)
    return lambda policy, step: play_fn(policy, key, step)

  def take(self, step: int, actor_params, new_collect: Callable[[], Callable]) -> tuple:
    """(the rollout that step `step` trains on, seconds spent copying weights): the one in
    flight, or, with none (the run's first step here, or max_staleness 0), one played now by
    `new_collect()` with the newest weights."""
    played, self.in_flight, seconds = self.in_flight, None, 0.0
    if played is None:
      if not self.max_staleness:
        seconds = self.weights.load(actor_params, version=step - 1)
      played = play(self.weights, step, new_collect())
    if played.step != step or played.staleness() > self.max_staleness:
      raise RuntimeError(f"step {step}: the rollout of step {played.step} is out of order")
    return played, seconds

  def advance(self, actor_params, step: int) -> float:
    """One step ahead, once the batch of `step` has been diagnosed under the policy that played
    it: the weights after step - 1 go to the rollout devices for the rollout of step + 1.
    Returns the copy's seconds."""
    if not self.max_staleness:
      return 0.0
    return self.weights.load(actor_params, version=step - 1)

  def launch(self, step: int, collect) -> None:
    """Plays the rollout of `step` now, while the update dispatched before trains."""
    self.in_flight = play(self.weights, step, collect)

  def checkpoint(self, state: run_state.RunState) -> run_state.PipelinedState:
    """What a checkpoint holds: `state` and the weights that play the next rollout."""
    return run_state.PipelinedState(state, self.weights.trainable)

  def restore_target(self, like, behaviour_shapes) -> run_state.PipelinedState:
    """The arrays a checkpoint restores into: `like` (the RunState's, placed) and the behaviour
    weights placed on the rollout devices."""
    return run_state.PipelinedState(
        like, run_state.placed(behaviour_shapes, self.weights.shardings(behaviour_shapes))
    )

  def restored(self, state: run_state.PipelinedState, behaviour_step: int) -> run_state.RunState:
    """Places a restored checkpoint's behaviour weights; returns its RunState."""
    self.weights.load(state.run.train.actor_params, behaviour_step, trainable=state.behaviour)
    return state.run

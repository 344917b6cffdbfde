"""Rollouts one step ahead on their own devices (`trainer.async_rollout`).

    ahead = pipeline.OneStepAhead(engines, exp, model, rollout_sharder)   # a train.collectors mode
    taken = ahead.take(state, s, inspect)    # the batch of step s; the weights after s-1 go over
    train_state, metrics = train_step(...)   # dispatched, not awaited
    ahead.after_dispatch(s)                  # the rollout of step s+1, meanwhile
    metrics = jax.device_get(metrics)        # only now wait for the update

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

from ragen_jax import keys
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.models import lora
from ragen_jax.train import collectors
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


def play(weights: RolloutWeights, step: int, collect: Callable[[Any], Dict[str, Any]]) -> Played:
  """The rollout of `step` with `weights` (`collect(policy)`: every tag's rollout of it)."""
  tic = time.perf_counter()
  results = collect(weights.policy())
  return Played(step, results, weights.version, time.perf_counter() - tic)


class OneStepAhead(collectors.Collector):
  """The collector of `trainer.async_rollout`: the rollout devices' weights and the rollout in
  flight."""

  def __init__(self, engines, exp, model, sharder):
    super().__init__(engines, exp, model)
    self.weights = RolloutWeights(model, sharder)
    self.max_staleness = exp.trainer.max_staleness
    self.in_flight: Optional[Played] = None
    self.next_rollout: Optional[Callable] = None  # launched once the update is dispatched

  def start(self, model, state: run_state.RunState) -> None:
    super().start(model, state)
    self.weights.load(state.train.actor_params, version=0)

  def _collect(self, state: run_state.RunState, step: int) -> Callable[[Any], Dict[str, Any]]:
    """`collect(policy)`: the rollout of `step`, its key placed on the rollout devices now.
    Derived later, on the training devices, the key would queue behind the update dispatched
    meanwhile, and the rollout would wait for the update instead of overlapping it."""
    key = jax.device_put(keys.step(state.key, step), self.weights.sharder.replicated)
    return lambda policy: collectors.play(self.engines, self.exp, policy, key, step)

  def take(
      self, state: run_state.RunState, step: int, inspect: collectors.Inspect
  ) -> collectors.Taken:
    """The rollout in flight, or, with none (the run's first step here, or max_staleness 0),
    one played now with the newest weights; inspected under the weights that played it, after
    which (one step ahead) the weights after step - 1 go over for the rollout of step + 1."""
    params = state.train.actor_params
    played, self.in_flight, seconds = self.in_flight, None, 0.0
    if played is None:
      if not self.max_staleness:
        seconds = self.weights.load(params, version=step - 1)
      played = play(self.weights, step, self._collect(state, step))
    if played.step != step or played.staleness() > self.max_staleness:
      raise RuntimeError(f"step {step}: the rollout of step {played.step} is out of order")
    diagnostics = inspect(self.weights.policy(), played.results)  # before newer weights come
    if self.max_staleness:
      # Copied now: the update about to be dispatched donates `params`.
      seconds += self.weights.load(params, version=step - 1)
      if step < self.exp.trainer.total_steps:
        self.next_rollout = self._collect(state, step + 1)
    metrics = {"async/staleness": float(played.staleness()), "timing_s/weight_sync": seconds}
    return collectors.Taken(played.results, diagnostics, played.seconds, metrics)

  def after_dispatch(self, step: int) -> None:
    """Plays the rollout of `step` + 1 now, while the update dispatched before trains."""
    if self.next_rollout is not None:
      self.in_flight = play(self.weights, step + 1, self.next_rollout)
      self.next_rollout = None

  def checkpoint(self, state: run_state.RunState, host: run_state.HostState) -> Any:
    """`state` and the weights that play the next rollout (their step in `host`)."""
    host.behaviour_step = self.weights.version
    return run_state.PipelinedState(state, self.weights.trainable)

  def restore_target(self, like) -> run_state.PipelinedState:
    """`like` and the behaviour weights placed on the rollout devices."""
    behaviour = run_state.abstract(self.model, self.exp).behaviour
    return run_state.PipelinedState(
        like, run_state.placed(behaviour, self.weights.shardings(behaviour))
    )

  def restored(self, restored, host: run_state.HostState) -> run_state.RunState:
    """Places a restored checkpoint's behaviour weights; returns its RunState."""
    run = restored.run
    self.weights.load(run.train.actor_params, host.behaviour_step, trainable=restored.behaviour)
    return run

"""Rollouts one step ahead on their own devices (`trainer.async_rollout`).

    weights = pipeline.RolloutWeights(model, rollout_sharder)
    weights.load(state.train.actor_params, version=s - 1)   # copied to the rollout devices
    train_state, metrics = train_step(...)                  # dispatched, not awaited
    ahead = pipeline.play(weights, s + 1, collect)          # the next rollout, meanwhile
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
from typing import Any, Callable, Dict

import jax

from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.models import lora


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

"""What a run carries from step to step and stores in its checkpoints.

`RunState` is the device pytree (the update's `algos.TrainState` and the run's base key), saved
as arrays (with `trainer.async_rollout` inside a `PipelinedState`, beside the weights that play
the next rollout); `HostState` is the host-side rest (stopping-rule streaks, the MI z-score EMA,
an early stop), saved as JSON in the checkpoint's metadata with the config and the seed counters.
"""

import dataclasses
from typing import Any, Dict, Optional

import flax
import jax

from ragen_jax import algos
from ragen_jax.diagnostics import early_stop as early_stop_lib
from ragen_jax import keys
from ragen_jax.models import lora


@flax.struct.dataclass
class RunState:
  """What a checkpoint's arrays hold: the update's state and the run's base PRNG key."""

  train: algos.TrainState
  key: jax.Array


def new_state(model, ppo: algos.PPOConfig, base_key: jax.Array) -> RunState:
  """A fresh TrainState for `model` (a separate critic initialised from it, as RAGEN does)."""
  return RunState(algos.init_train_state(model, None, ppo, keys.state_init(base_key)), base_key)


@flax.struct.dataclass
class PipelinedState:
  """An asynchronous run's checkpoint (train/pipeline.py): the RunState, and the actor's
  trainable parameters (the adapters under LoRA) that play the rollout of the next step."""

  run: RunState
  behaviour: Any


def placed(shapes, shardings) -> Any:
  """`shapes` (ShapeDtypeStructs) carrying `shardings`: where a checkpoint restores them."""
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
  )


def abstract(model, exp) -> Any:
  """Shapes and dtypes of what a checkpoint of the run `exp` holds (nothing is computed)."""
  run = jax.eval_shape(lambda: new_state(model, exp.ppo, jax.random.key(0)))
  if not exp.trainer.async_rollout:
    return run
  return PipelinedState(run, lora.partition(run.train.actor_params)[0])


@dataclasses.dataclass
class HostState:
  """Host-side run state, kept in checkpoint metadata so a resumed run continues it."""

  monitor: early_stop_lib.Monitor
  collapse_ema: Dict[str, float] = dataclasses.field(default_factory=dict)
  stopped: Optional[Dict[str, Any]] = None  # the stopping rule that ended the run
  behaviour_step: int = 0  # async: the step whose weights play the next rollout
  episodes_played: int = 0  # training episodes played so far, refills included

  @classmethod
  def new(cls, exp) -> "HostState":
    return cls(early_stop_lib.Monitor(exp.early_stop))

  @classmethod
  def from_meta(cls, exp, meta: Dict[str, Any]) -> "HostState":
    return cls(
        early_stop_lib.Monitor(exp.early_stop, meta.get("early_stop")),
        dict(meta.get("collapse_std_ema", {})),
        meta.get("early_stopped"),
        int(meta.get("behaviour_step", 0)),
        # A checkpoint without the count was trained without refills.
        int(meta.get("episodes_played", int(meta["step"]) * exp.train_episodes)),
    )

  def meta(self, exp, step: int, config_json: str) -> Dict[str, Any]:
    out = {
        "step": step,
        "config": config_json,
        "next_train_seed": keys.next_train_seed(exp, step),
        "val_seed": exp.seed.val,
        "early_stop": self.monitor.state,
        "collapse_std_ema": self.collapse_ema,
        "episodes_played": self.episodes_played,
    }
    if self.stopped:
      out["early_stopped"] = self.stopped
    if exp.trainer.async_rollout:
      out["behaviour_step"] = self.behaviour_step
    return out

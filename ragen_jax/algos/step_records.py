"""The StarPO train step's static spec and the typed records its stages pass (`train_step.py`).

Absent parts are None (no critic, no KL loss): None is an empty pytree, so they cost nothing
inside `lax.map`, `lax.scan` and `lax.cond`.

Dimensions:
  B: episodes.  T: tokens.  M: micro-batches per minibatch.  U: episodes per micro-batch.
"""

import dataclasses
from typing import Any, NamedTuple

import flax
from flax import nnx
import jax
import optax

from ragen_jax.algos.config import PPOConfig


@dataclasses.dataclass(frozen=True)
class ModelGraph:
  """A module's structure without its parameters: what the step closes over, never updates."""

  graphdef: Any
  rest: Any  # non-parameter state (nnx.State)

  @classmethod
  def of(cls, model):
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    return cls(graphdef, rest)

  def merge(self, params):
    """The module carrying `params` (a pure dict, as in the TrainState)."""
    return nnx.merge(self.graphdef, params, self.rest)


def param_dict(model):
  """The module's parameters as a pure nested dict (sharing the module's buffers)."""
  return nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1])


def optimizer_step(tx, grads, opt, params):
  """One optax step: (new params, new optimizer state).

  The updates are float32 (`optim.adamw`); `apply_updates` adds them to the weights in float32
  and rounds once to the parameters' dtype, so with bfloat16 parameters an update below half a
  bfloat16 ulp of its weight is lost (`optim` module doc).
  """
  updates, opt = tx.update(grads, opt, params)
  return optax.apply_updates(params, updates), opt


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """What the step closes over: settings and model structure, no parameters."""

  cfg: PPOConfig
  actor: ModelGraph
  ref: ModelGraph
  critic: Any  # critic.Critic, the strategy of the configured critic mode
  actor_tx: optax.GradientTransformation
  critic_tx: optax.GradientTransformation
  temperature: float = 1.0  # the rollout's: log-probs of the sampled distribution
  # The distillation teacher's structure (ppo.distill_teacher); its parameters are an argument
  # of each step, never part of the state (no optimizer, no gradient, not checkpointed).
  teacher: ModelGraph | None = None
  # R: the positions per row at which log-probs are computed (the loss mask's, `logprobs.
  # response_positions`); None computes them everywhere. Set per call (`train_step`).
  width: int | None = None


@flax.struct.dataclass
class Selection:
  """The batch after the rollout filter, kept episodes first."""

  batch: Any  # RolloutBatch, episodes in the new order
  tokens_BxT: jax.Array  # int32
  attn_BxT: jax.Array  # int32
  keep_B: jax.Array  # bool, per row
  mask_BxT: jax.Array  # bool: loss tokens of kept episodes
  stats: dict[str, jax.Array]  # filter statistics (scalars)
  keep_episodes_B: jax.Array  # bool, per episode in the batch's episode order (= keep_B when
  # rows are episodes)
  row_order_R: jax.Array | None = None  # one row per turn: the rollout's row of each row here


@flax.struct.dataclass
class OldPass:
  """No-gradient pass of the current parameters; absent parts are None."""

  logp_BxT: jax.Array
  entropy_BxT: jax.Array
  values_BxT: jax.Array | None  # None without a critic
  ref_logp_BxT: jax.Array | None  # None unless use_kl_loss
  teacher_logp_BxT: jax.Array | None = None  # None without a distillation teacher


@flax.struct.dataclass
class Advantages:
  """Advantages and returns (for outcome estimators the returns are the raw advantages)."""

  adv_BxT: jax.Array
  returns_BxT: jax.Array
  values_BxT: jax.Array | None  # the critic's values, 0 at masked positions; None without one
  skipped: jax.Array  # bool: nothing to train on, the step is a no-op
  step_group_share: jax.Array | None = None  # GiGPO: share of turns in step groups of 2+
  distill_metrics: dict[str, jax.Array] | None = None  # distill/* (algos.distill)


@flax.struct.dataclass
class UpdateData:
  """Per-episode inputs of the PPO update (in minibatch slices the leading B is [M, U])."""

  tokens_BxT: jax.Array
  attn_BxT: jax.Array
  mask_BxT: jax.Array  # float32 loss mask
  old_logp_BxT: jax.Array
  adv_BxT: jax.Array
  old_values_BxT: jax.Array | None  # None without a critic
  returns_BxT: jax.Array | None  # None without a critic
  ref_logp_BxT: jax.Array | None  # None unless use_kl_loss
  # Rollout-correction weights of the policy loss (losses.rollout_correction_weights); None
  # when ppo.rollout_correction is "none".
  pg_weights_BxT: jax.Array | None = None
  # Qwen2.5-VL: each row's frames (RolloutBatch.frames_BxNxHxWx3); None without images.
  frames_BxNxHxWx3: jax.Array | None = None


class Learner(NamedTuple):
  """What the optimizer steps change (the update's scan carry)."""

  actor_params: Any
  actor_opt: Any
  critic_params: Any
  critic_opt: Any

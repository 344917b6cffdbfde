"""Critic strategies of the StarPO update: none, a separate critic model, or a shared value head.

The mode is chosen once from the config (`make_critic`); the train step calls the same methods
whatever it is, so none of its stages branches on the critic:

  NoCritic         critic-free estimators (GRPO, ...): no values, no critic parameters.
  SeparateCritic   GAE with its own Qwen2Critic (RAGEN): the value loss has its own gradient.
  SharedValueHead  GAE with a linear value head on the actor's final hidden states: the value
                   loss (times vf_coef) joins the actor loss, so it also trains the actor's trunk.

Values are shifted right: the value of token t is read at position t − 1 (the state before the
token), as in veRL.

Dimensions:
  B: episodes.  T: tokens.  D: hidden size.
"""

import abc
from typing import Callable

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import optimizer_step
from ragen_jax.algos.step_records import param_dict
from ragen_jax.models.build import copy_tree

# values_BxT -> (value loss, metrics) of one micro-batch.
ValueLossFn = Callable[[jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def shift_right(x_BxT):
  """Value for token t is read at position t − 1 (the state before the token), as in veRL."""
  return jnp.pad(x_BxT[:, :-1], ((0, 0), (1, 0)))


class Critic:
  """No critic; also the interface every strategy implements.

  Attributes:
    has_values: whether `values` gives the GAE baseline (else advantages are outcome-based).
    shares_trunk: whether the value loss is part of the actor loss (one backward pass) rather
      than a loss with its own gradient.
  """

  has_values = False
  shares_trunk = False

  def init(self, tx, key):
    """(critic params, optimizer state) of a fresh TrainState; None, None without a critic."""
    del tx, key
    return None, None

  def values(self, params, tokens_BxT, attn_BxT, hidden_BxTxD):
    """Shifted float32 values_BxT from the critic params and the actor's hidden states; or None."""
    del params, tokens_BxT, attn_BxT, hidden_BxTxD
    return None

  def actor_loss_params(self, params):
    """The critic parameters differentiated together with the actor loss (None: none)."""
    del params
    return None

  def add_to_actor_loss(self, loss, metrics, head, hidden_BxTxD, value_loss: ValueLossFn):
    """The actor loss and metrics, with the value loss added when the trunk is shared."""
    del head, hidden_BxTxD, value_loss
    return loss, metrics

  def grads(self, params, actor_loss_grads, tokens_BxT, attn_BxT, value_loss: ValueLossFn):
    """(critic gradients, value metrics) of one micro-batch.

    Args:
      params: critic params.
      actor_loss_grads: gradients of the actor loss w.r.t. `actor_loss_params(params)`.
      tokens_BxT, attn_BxT: the micro-batch.
      value_loss: the micro-batch's value loss as a function of values_BxT.
    """
    del params, actor_loss_grads, tokens_BxT, attn_BxT, value_loss
    return None, {}

  def grad_metrics(self, grads):
    del grads
    return {}

  def apply(self, tx, grads, opt, params):
    """One optimizer step: (params, opt)."""
    del tx, grads
    return params, opt


class NoCritic(Critic):
  """Critic-free estimators (GRPO, Dr.GRPO, BRPO, ARPO): nothing to compute or train."""


class _TrainedCritic(Critic, abc.ABC):
  """A critic with parameters of its own and an optimizer."""

  has_values = True

  @abc.abstractmethod
  def _init_params(self, key):
    """The critic's fresh parameters (a pure dict)."""

  def init(self, tx, key):
    params = self._init_params(key)
    return params, tx.init(params)

  def grad_metrics(self, grads):
    return {"critic/grad_norm": optax.tree.norm(grads)}

  def apply(self, tx, grads, opt, params):
    return optimizer_step(tx, grads, opt, params)


def _critic_model(actor_model, critic_model, key):
  if critic_model is not None:
    return critic_model
  from ragen_jax import models  # pylint: disable=g-import-not-at-top

  return models.critic_from_policy(actor_model, key)


class SeparateCritic(_TrainedCritic):
  """A Qwen2Critic of its own (RAGEN), by default initialised from the policy's weights."""

  def __init__(self, actor_model, critic_model=None, initialises=True):
    # What the initial weights come from; none for the update's copy, which only traces (and a
    # jitted step kept for a later run must not keep this run's weights alive).
    self._init_from = (actor_model, critic_model) if initialises else None
    abstract = (
        critic_model
        if critic_model is not None
        else nnx.eval_shape(lambda: _critic_model(actor_model, None, jax.random.key(0)))
    )
    self.graph = ModelGraph.of(abstract)

  def _init_params(self, key):
    model = _critic_model(*self._init_from, key)
    return copy_tree(param_dict(model))

  def values(self, params, tokens_BxT, attn_BxT, hidden_BxTxD):
    del hidden_BxTxD
    return shift_right(self.graph.merge(params)(tokens_BxT, attn_BxT))

  def grads(self, params, actor_loss_grads, tokens_BxT, attn_BxT, value_loss):
    del actor_loss_grads  # the value loss is not in the actor loss

    def loss(critic_params):
      return value_loss(self.values(critic_params, tokens_BxT, attn_BxT, None))

    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return grads, metrics


class SharedValueHead(_TrainedCritic):
  """A linear value head (kernel_D, bias) on the actor's final hidden states."""

  shares_trunk = True

  def __init__(self, hidden_size, vf_coef):
    self.hidden_size, self.vf_coef = hidden_size, vf_coef

  def _init_params(self, key):
    del key
    return {
        "value_kernel": jnp.zeros((self.hidden_size,), jnp.float32),
        "value_bias": jnp.zeros((), jnp.float32),
    }

  def values(self, params, tokens_BxT, attn_BxT, hidden_BxTxD):
    del tokens_BxT, attn_BxT
    values_BxT = jnp.einsum("btd,d->bt", hidden_BxTxD.astype(jnp.float32), params["value_kernel"])
    return shift_right(values_BxT + params["value_bias"])

  def actor_loss_params(self, params):
    return params

  def add_to_actor_loss(self, loss, metrics, head, hidden_BxTxD, value_loss):
    # One trunk: the value loss also trains the actor's decoder.
    vf, value_metrics = value_loss(self.values(head, None, None, hidden_BxTxD))
    return loss + self.vf_coef * vf, {**metrics, **value_metrics}

  def grads(self, params, actor_loss_grads, tokens_BxT, attn_BxT, value_loss):
    del params, tokens_BxT, attn_BxT, value_loss  # already in the actor loss
    return actor_loss_grads, {}


def make_critic(cfg, actor_model, critic_model=None, initialises=True) -> Critic:
  """The strategy for `cfg` (a PPOConfig).

  Args:
    cfg: PPOConfig; its adv_estimator and critic fields choose the strategy.
    actor_model: the policy (hidden size; the separate critic's initial weights).
    critic_model: a separate critic, or None to initialise one from the policy (RAGEN).
    initialises: False for a strategy that only computes (the train step's): it keeps no
      reference to the models' weights and cannot `init`.
  """
  if not cfg.uses_critic:
    return NoCritic()
  if cfg.critic == "shared":
    return SharedValueHead(actor_model.config.hidden_size, cfg.vf_coef)
  return SeparateCritic(actor_model, critic_model, initialises)

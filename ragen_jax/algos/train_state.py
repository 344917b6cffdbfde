"""The state the StarPO update carries between steps, and the optimizer that updates it.

    state = init_train_state(actor, critic_or_None, ppo_config, key)
    actor = actor_module(actor, state)        # the actor with the state's current parameters

The step that updates it is `train_step.make_train_step`; both build the same configured optimizer
(`optimizer`) unless given their own.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from ragen_jax.algos import critic as critic_lib
from ragen_jax.algos import optim
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import param_dict
from ragen_jax.models import lora
from ragen_jax.models.build import copy_tree


@flax.struct.dataclass
class TrainState:
  """Everything the update carries between steps (a pytree; donated to the step).

  Parameters are pure nested dicts of arrays (`nnx.to_pure_dict`), owned by the state: they
  are copies, so donating the state never invalidates the modules they came from. With LoRA
  adapters in the actor only they are trained: `actor_opt` holds adapter-shaped moments
  (`lora.partition`), and the KL reference is the actor with its adapters at zero.
  """

  actor_params: Any
  actor_opt: Any
  critic_params: Any  # None for critic-free estimators
  critic_opt: Any
  ref_params: Any  # None unless use_kl_loss (and None with LoRA: the base is the reference)
  step: jax.Array  # int32, train_step calls so far
  skipped_steps: jax.Array  # int32, steps whose filter kept nothing (no update)


def optimizer(lr, cfg: PPOConfig):
  """The configured AdamW (betas 0.9 / 0.999, decoupled weight decay) after a global-norm clip."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optim.adamw(
          lr,
          b1=0.9,
          b2=0.999,
          eps=1e-8,
          weight_decay=cfg.weight_decay,
          moment_dtype=cfg.moment_dtype,
      ),
  )


def init_train_state(
    actor_model, critic_model, cfg: PPOConfig, key, ref_model=None, actor_tx=None, critic_tx=None
):
  """Builds the TrainState.

  Args:
    actor_model: models.Qwen2 policy.
    critic_model: models.Qwen2Critic, or None: for "gae" with a separate critic one is then
      initialised from the policy weights (RAGEN); ignored by critic-free estimators.
    cfg: PPOConfig.
    key: PRNG key (critic construction).
    ref_model: frozen reference policy for the KL loss (default: a copy of the actor; with
      LoRA adapters, no copy: the actor's own base weights, adapters off).
    actor_tx, critic_tx: optional optax transformations replacing the configured AdamW
      (schedules, tests); pass the same ones to make_train_step.
  """
  actor_tx = actor_tx or optimizer(cfg.actor_lr, cfg)
  critic_tx = critic_tx or optimizer(cfg.critic_lr, cfg)
  actor_params = copy_tree(param_dict(actor_model))
  critic = critic_lib.make_critic(cfg, actor_model, critic_model)
  critic_params, critic_opt = critic.init(critic_tx, key)
  ref_params = None
  if cfg.use_kl_loss and ref_model is not None:
    ref_params = copy_tree(param_dict(ref_model))
  elif cfg.use_kl_loss and not lora.has_adapters(actor_params):
    ref_params = copy_tree(actor_params)
  return TrainState(
      actor_params=actor_params,
      actor_opt=actor_tx.init(lora.partition(actor_params)[0]),  # only what is trained
      critic_params=critic_params,
      critic_opt=critic_opt,
      ref_params=ref_params,
      step=jnp.zeros((), jnp.int32),
      skipped_steps=jnp.zeros((), jnp.int32),
  )


def actor_module(actor_model, state: TrainState):
  """The actor module carrying the state's current parameters (e.g. for the next rollout)."""
  return ModelGraph.of(actor_model).merge(state.actor_params)

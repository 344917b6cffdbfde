"""Building models: the class a config needs, random initialisation (`create`) and a critic
from a policy's weights.

Dimension legend: D model dim.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from ragen_jax.models.config import get_config
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.qwen2 import Qwen2
from ragen_jax.models.qwen2 import Qwen2Critic
from ragen_jax.models.qwen2_5_vl import Qwen2_5_VL


def model_class(config: ModelConfig, *, critic: bool = False) -> type:
  """The module class of `config`: the critic (the decoder and a value head, for every family;
  the vision tower is the policy's alone), Qwen2_5_VL when it has a vision tower, else Qwen2."""
  if critic:
    return Qwen2Critic
  return Qwen2 if config.vision is None else Qwen2_5_VL


def create(
    name_or_config: str | ModelConfig,
    key: jax.Array,
    *,
    critic: bool = False,
    sharding=None,
    **overrides,
) -> Qwen2 | Qwen2Critic:
  """Builds a randomly initialised model (a Qwen2_5_VL for a config with `vision`).

  Args:
    name_or_config: a preset name (see `PRESETS`) or a ModelConfig.
    key: PRNG key for the parameters.
    critic: build a Qwen2Critic instead of the causal LM (`model_class`).
    sharding: optional `logical axes -> jax Sharding` (e.g. `sharding.Sharder.named`): each
      parameter is created directly in its sharding, never whole on one device.
    **overrides: ModelConfig fields to replace (e.g. dtype=jnp.bfloat16).

  Returns:
    The module.
  """
  config = get_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
  if overrides:
    config = config.replace(**overrides)
  graphdef, init = _initialiser(model_class(config, critic=critic), config, sharding)
  return nnx.merge(graphdef, init(key))


def variable_shardings(abstract_state, sharding):
  """The state's tree with each Variable's value replaced by `sharding(its logical axes)`."""
  return jax.tree.map(
      lambda v: v.replace(sharding(tuple(v.get_metadata().get("out_sharding") or ()))),
      abstract_state,
      is_leaf=lambda x: isinstance(x, nnx.Variable),
  )


@functools.lru_cache(maxsize=16)
def _initialiser(cls, config: ModelConfig, sharding=None):
  """(graphdef, jitted key -> state), cached so repeated creates never recompile."""
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))))
  out = None if sharding is None else variable_shardings(abstract, sharding)
  init = jax.jit(lambda k: nnx.state(cls(config, rngs=nnx.Rngs(params=k))), out_shardings=out)
  return graphdef, init


@jax.jit
def copy_tree(tree):
  """Fresh buffers for every array of `tree`: a donated state must not invalidate the module its
  arrays came from. One program for the whole tree (each leaf's eager copy compiled a program of
  its own in every new process)."""
  return jax.tree.map(jnp.copy, tree)


def critic_from_policy(policy: Qwen2, key: jax.Array | None = None) -> Qwen2Critic:
  """A critic whose decoder starts from a copy of the policy's weights.

  The copy is real (new buffers), so donating the policy's state in a jitted
  train step never deletes the critic's arrays.

  Args:
    policy: the causal LM.
    key: unused by the zero value head; accepted for a uniform signature.

  Returns:
    The Qwen2Critic.
  """
  del key
  config = policy.config
  # Build abstractly: a random decoder for a 7B model would cost seconds and
  # a second full copy of the weights.
  critic = nnx.eval_shape(lambda: Qwen2Critic(config, rngs=nnx.Rngs(0)))
  nnx.update(critic.decoder, copy_tree(nnx.state(policy.decoder)))
  critic.value_kernel.set_value(jnp.zeros((config.hidden_size,), jnp.float32))
  critic.value_bias.set_value(jnp.zeros((), jnp.float32))
  return critic

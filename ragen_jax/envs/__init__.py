"""Environments: RAGEN's three as pure JAX functions, and any Python text environment.

from ragen_jax import envs
env = envs.make("sokoban", dim_room=(6, 6), num_boxes=1, max_steps=100)
state = env.reset(key)                                    # pure; vmap over keys
state, reward, done, info = env.step(key, state, action)  # pure; int32 action index
text = env.render(state)                                  # host side, RAGEN's grid text
state = env.from_text(text)                               # inverse of render (grid format)

Text environments (`envs.TextEnv`: reset(seed) -> str, step(str) -> obs, reward, done, info)
are stepped on the host, one instance per episode (`envs.text`, `envs.host_pool`);
`envs.register(name, factory)` or an entry `package.module:Name` makes one available
(`envs.registry`), `envs.gymnasium_adapter` and `envs.reasoning_gym_adapter` wrap other
packages' environments, and `python -m ragen_jax.envs.serve` serves one over HTTP.
"""

from ragen_jax.envs import base
from ragen_jax.envs.bandit import Bandit, BanditState
from ragen_jax.envs.base import Env
from ragen_jax.envs.frozenlake import FrozenLake, FrozenLakeState
from ragen_jax.envs.registry import HostEnv
from ragen_jax.envs.registry import is_jax
from ragen_jax.envs.registry import make
from ragen_jax.envs.registry import register
from ragen_jax.envs.registry import REGISTRY
from ragen_jax.envs.sokoban import Sokoban, SokobanState
from ragen_jax.envs.text import TextEnv


def from_gymnasium(*args, **kwargs):
  """`envs.gymnasium_adapter.from_gymnasium` (imported on use: gymnasium is optional)."""
  from ragen_jax.envs import gymnasium_adapter  # pylint: disable=import-outside-toplevel

  return gymnasium_adapter.from_gymnasium(*args, **kwargs)

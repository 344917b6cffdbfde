"""RAGEN's environments as pure JAX functions.

from ragen_jax import envs
env = envs.make("sokoban", dim_room=(6, 6), num_boxes=1, max_steps=100)
state = env.reset(key)                                    # pure; vmap over keys
state, reward, done, info = env.step(key, state, action)  # pure; int32 action index
text = env.render(state)                                  # host side, RAGEN's grid text
state = env.from_text(text)                               # inverse of render (grid format)
"""

from typing import Any, Dict, Type

from ragen_jax.envs import base
from ragen_jax.envs.bandit import Bandit, BanditState
from ragen_jax.envs.base import Env
from ragen_jax.envs.frozenlake import FrozenLake, FrozenLakeState
from ragen_jax.envs.sokoban import Sokoban, SokobanState

REGISTRY: Dict[str, Type[Env]] = {
    "sokoban": Sokoban,
    "frozenlake": FrozenLake,
    "bandit": Bandit,
}


def make(name: str, **options: Any) -> Env:
  """Builds an environment by name; unknown names or options raise a ValueError."""
  if name not in REGISTRY:
    raise ValueError(f"Unknown environment {name!r}; valid names: {sorted(REGISTRY)}.")
  cls = REGISTRY[name]
  base.check_options(cls, options)
  return cls(**options)

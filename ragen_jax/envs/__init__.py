"""Environments: RAGEN's grid games as pure JAX functions, and any Python text environment.

from ragen_jax import envs
env = envs.make("sokoban", dim_room=(6, 6), num_boxes=1, max_steps=100)
state = env.reset(key)                                    # pure; vmap over keys
state, reward, done, info = env.step(key, state, action)  # pure; int32 action index
text = env.render(state)                                  # host side, RAGEN's grid text
image = envs.make("visual_sokoban").render_image(state)   # uint8 [84, 84, 3], jnp; vmap it
state = env.from_text(text)                               # inverse of render (grid format)

Text environments (`envs.TextEnv`: reset(seed) -> str, step(str) -> obs, reward, done, info)
are stepped on the host, one instance per episode. `envs.register(name, factory)` or an entry
`package.module:Name` makes one available (`envs.registry`). The parts:
  device/   the pure-JAX environments that run on the accelerator: the `Env` contract (base),
            Sokoban (and its level generator), FrozenLake, Bandit, 2048 (`envs.game2048`: its
            move rule `slide` as a pure function), and Sokoban and FrozenLake drawn as images
            (visual: sprites painted in jax.numpy)
  text/     the `TextEnv` contract (`envs.text`) and RAGEN's text environments: Countdown,
            Sudoku, math (with its question generator), code (DeepCoder; its problem formats and
            task generator, and the sandbox its tests run in: untrusted Python in namespaces under
            limits, started by sandbox_launcher), SearchQA (its retrievers, the generated
            encyclopedia it ships, and `python -m ragen_jax.envs.text.retrieval_server`: BM25
            over HTTP)
  tools     the tools an environment may declare (`envs.Tool`) and the structured action a
            reply's tool call becomes (`envs.ToolCall`)
  host/     stepping text environments on the host: `host.pool.HostPool` (threads or worker
            processes), its episode actors, and the records it returns (`host.records`)
  serve/    the environment server, one text environment over HTTP: `python -m
            ragen_jax.envs.serve` (serve.server) and the client `serve.client.HttpEnv`
  bridges/  other packages' environments as text environments: gymnasium (`envs.from_gymnasium`)
            and reasoning-gym
"""

from ragen_jax.envs.device import base
from ragen_jax.envs.device import game2048
from ragen_jax.envs.device.bandit import Bandit, BanditState
from ragen_jax.envs.device.base import Env
from ragen_jax.envs.device.frozenlake import FrozenLake, FrozenLakeState
from ragen_jax.envs.device.game2048 import Game2048, Game2048State
from ragen_jax.envs.device.sokoban import Sokoban, SokobanState
from ragen_jax.envs.device.visual import VisualFrozenLake, VisualSokoban
from ragen_jax.envs.registry import HostEnv
from ragen_jax.envs.registry import is_jax
from ragen_jax.envs.registry import make
from ragen_jax.envs.registry import register
from ragen_jax.envs.registry import REGISTRY
from ragen_jax.envs.text import TextEnv
from ragen_jax.envs.tools import Tool
from ragen_jax.envs.tools import ToolCall


def from_gymnasium(*args, **kwargs):
  """`envs.bridges.gymnasium.from_gymnasium` (imported on use: gymnasium is optional)."""
  from ragen_jax.envs.bridges import gymnasium as bridge  # pylint: disable=import-outside-toplevel

  return bridge.from_gymnasium(*args, **kwargs)

"""The host pool's records and shared declarations, used by its modules and its callers.

`Start` (a reset), `Outcome` (a turn's actions), `Plan` (the env's expert) and `EnvFault` (the
episode failed; the kinds, FAULT_KINDS, are documented in ragen_jax.envs.host.pool) are what
`ragen_jax.envs.host.pool.HostPool` returns per episode. `MODES` are the pool's modes (also a
config's `envs.<tag>.pool`, checked by ragen_jax.envs.registry.HostEnv) and `log` the pool's one
logger.
"""

import dataclasses
import logging
from typing import Optional

log = logging.getLogger("ragen_jax.envs.host")  # the pool's one logger

MODES = ("thread", "process")

FAULT_KINDS = ("raised", "timeout", "bad_output", "bad_observation", "bad_reward", "pool")

_MAX_MESSAGE_CHARS = 500


@dataclasses.dataclass(frozen=True)
class EnvFault:
  """An episode's environment failed; the episode ends. Kinds: see ragen_jax.envs.host.pool."""

  kind: str
  message: str  # one line: what failed
  traceback: str = ""  # the formatted traceback when an exception was raised


@dataclasses.dataclass(frozen=True)
class Start:
  """A successful reset, with the instance's optional attributes read right after it."""

  observation: str
  instruction: str  # "" when the env has none
  action_names: Optional[tuple[str, ...]]
  max_actions_per_turn: Optional[int]
  tools: tuple = ()  # the env's ragen_jax.envs.tools.Tool records (none: no tool calls)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A turn's actions, stepped in order until done."""

  observation: str  # the last observation (the previous one when nothing was executed)
  reward: float  # sum of the executed actions' rewards
  done: bool
  success: bool  # any executed step's info["success"]
  executed: int  # actions executed (stops at done)
  effective: int  # executed actions with info.get("action_is_effective", True)
  valid: bool  # every executed step had info.get("action_is_valid", True)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the environment's own expert (`env.expert()`) would answer this turn."""

  answers: Optional[tuple[str, ...]]  # as `step` takes them; None: no plan from here
  thought: str  # a short reasoning text


def one_line(text: str) -> str:
  """`text` on one line, cut to a fault message's length."""
  text = " ".join(str(text).split())
  return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."

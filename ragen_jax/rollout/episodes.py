"""What a rollout is made of: its knobs, the host record of an episode, the result, and the
jitted batch step of the environments (ragen_jax.rollout.engine plays them).

Dimension legend: B episodes, A max actions per turn.
"""

import dataclasses
import functools
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.batch import RolloutBatch


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Knobs of the agent loop, RAGEN's defaults (its config/base.yaml and agent_proxy).

  The config's `rollout` section holds every field but `env_groups`, `instruction` and
  `PER_TAG`, which each environment tag sets (its `envs.<tag>` section). The `val_*` fields are
  read by validation (`for_validation`), not by the engine.
  """

  env_groups: int = 8  # groups; each shares one start state
  group_size: int = 16  # episodes per group (sharing a start state)
  max_turns: int = 5  # agent turns per episode (agent_proxy.max_turn)
  max_actions_per_turn: int = 2  # answer words kept per turn
  max_actions_per_traj: int = 10  # action budget of an episode
  action_sep: str = "||"  # separator between actions in <answer>
  format_penalty: float = -0.1  # per turn with a missing tag, unknown or no action
  unchanged_penalty: float = 0.0  # per training turn after which the state reads as before
  # (not RAGEN; validation rewards never carry it)
  enable_think: bool = True  # <think>...</think><answer>...</answer> format
  max_new_tokens: int = 400  # sampled tokens per turn (RAGEN response_length)
  max_context: int = 3600  # tokens of a whole conversation (RAGEN max_model_len)
  max_turn_tokens: int = 512  # longest appended user turn (sizes the KV cache slack)
  temperature: float = 1.0  # training rollout temperature
  top_p: float = 1.0  # nucleus mass (1 = off)
  top_k: int = 0  # top-k (0 = off)
  render_format: str = "grid"  # grid | coord | grid_coord
  max_tokens_hint: int = 100  # the prompt's "Max response length: N words (tokens)."
  use_turn_scores: bool = False  # also put each turn's reward on its last token
  instruction: str | None = None  # None: RAGEN's instruction for the env
  val_group_size: int = 1  # validation episodes per group (pass@k, k = this)
  val_temperature: float = 0.5  # RAGEN's evaluation temperature
  val_batch_groups: int = 64  # validation groups played per batch (memory bound)

  PER_TAG = ("render_format", "max_actions_per_traj", "max_tokens_hint")

  def __post_init__(self):
    for name in (
        "env_groups",
        "group_size",
        "max_turns",
        "max_actions_per_turn",
        "max_actions_per_traj",
        "max_tokens_hint",
        "max_new_tokens",
        "max_turn_tokens",
        "val_group_size",
        "val_batch_groups",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"rollout.{name} must be an integer >= 1, got {value!r}")
    if self.max_context <= self.max_new_tokens:
      raise ValueError("rollout.max_context must exceed rollout.max_new_tokens")
    if self.temperature <= 0 or self.val_temperature < 0:
      raise ValueError("rollout.temperature must be > 0 and rollout.val_temperature >= 0")

  def for_validation(self) -> "RolloutConfig":
    """Validation plays `val_group_size` episodes per group at `val_temperature`, with RAGEN's
    rewards (no training-only shaping)."""
    return dataclasses.replace(
        self,
        group_size=self.val_group_size,
        temperature=self.val_temperature,
        unchanged_penalty=0.0,
    )


@dataclasses.dataclass
class Episode:
  """Host record of one episode."""

  tokens: List[int]
  loss: List[int]
  logprobs: List[float]
  rewards: List[float]
  messages: List[Dict[str, str]]
  action_names: tuple
  actions_left: int
  turns: int = 0
  done: bool = False
  success: bool = False
  env_return: float = 0.0
  penalty: float = 0.0  # format penalties
  shaping: float = 0.0  # unchanged-turn penalties (RolloutConfig.unchanged_penalty)
  num_actions: int = 0
  num_effective: int = 0
  unchanged_turns: int = 0  # turns after which the rendered state equals the one before
  valid_turns: int = 0
  context_truncated: bool = False
  last_reply_end: int = -1  # index in tokens of the last sampled token
  reply_starts: List[int] = dataclasses.field(default_factory=list)  # first sampled token per turn
  turn_rewards: List[float] = dataclasses.field(default_factory=list)  # env reward + penalties

  @property
  def score(self) -> float:
    """The episode's training return: env rewards plus format and unchanged-turn penalties."""
    return self.env_return + self.penalty + self.shaping


@dataclasses.dataclass
class RolloutResult:
  batch: RolloutBatch
  metrics: Dict[str, np.ndarray]  # per episode, [B]
  summary: Dict[str, float]  # batch means, pass@group_size, cost counters, timings
  episodes: List[Dict[str, Any]]  # messages, success, reward, turns (for JSON logs)


def step_batch(env, states, actions_BxA, key, offset=0, total=None):
  """Plays each episode's actions in order until done; -1 slots are skipped.

  The rows are episodes offset .. offset + b - 1 of a batch of `total` (default b): their keys
  are those rows of the whole batch's keys, whichever process steps them.
  """
  b, a = actions_BxA.shape
  total = b if total is None else total
  keys_BxA = jax.random.split(key, total * a).reshape(total, a)[offset : offset + b]

  def one(state, actions_A, keys_A):
    def body(carry, x):
      state, reward, n_exec, n_eff, success = carry
      action, k = x
      take = (action >= 0) & ~state.done
      new, r, _, info = env.step(k, state, jnp.maximum(action, 0))
      state = jax.tree.map(lambda n, o: jnp.where(take, n, o), new, state)
      return (
          state,
          reward + jnp.where(take, r, 0.0),
          n_exec + take,
          n_eff + (take & info["action_is_effective"]),
          success | (take & info["success"]),
      ), None

    zero = jnp.zeros((), jnp.int32)
    carry, _ = jax.lax.scan(
        body, (state, jnp.float32(0.0), zero, zero, jnp.bool_(False)), (actions_A, keys_A)
    )
    return carry

  return jax.vmap(one)(states, actions_BxA, keys_BxA)


@functools.lru_cache(maxsize=None)
def env_functions(env):
  """Jitted (reset over keys, step over the batch), shared by every Rollout of `env`."""
  return jax.jit(env.reset_batch), jax.jit(
      functools.partial(step_batch, env), static_argnames=("offset", "total")
  )

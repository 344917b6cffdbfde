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
  """Knobs of one rollout (RAGEN's defaults)."""
  env_groups: int = 8              # groups; each shares one start state
  group_size: int = 16             # episodes per group
  max_turns: int = 5               # agent_proxy.max_turn
  max_actions_per_turn: int = 2    # answer words kept per turn
  max_actions_per_traj: int = 10   # action budget of an episode
  action_sep: str = "||"
  format_penalty: float = -0.1     # per turn with a missing tag, unknown or no action
  unchanged_penalty: float = 0.0   # per turn after which the state reads as before (not RAGEN)
  enable_think: bool = True        # <think>...</think><answer>...</answer> format
  max_new_tokens: int = 400        # per turn (RAGEN response_length)
  max_context: int = 3600          # tokens of a whole conversation (RAGEN max_model_len)
  max_turn_tokens: int = 512       # longest appended user turn (sizes the cache slack)
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  render_format: str = "grid"      # grid | coord | grid_coord
  max_tokens_hint: int = 100       # the prompt's "Max response length: N words (tokens)."
  use_turn_scores: bool = False    # also put each turn's reward on its last token
  instruction: str | None = None   # None: RAGEN's instruction for the env

  def __post_init__(self):
    for name in ("env_groups", "group_size", "max_turns", "max_actions_per_turn",
                 "max_actions_per_traj", "max_new_tokens", "max_turn_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout {name} must be positive, got {getattr(self, name)}")
    if self.max_context <= self.max_new_tokens:
      raise ValueError("rollout max_context must exceed max_new_tokens")


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
  penalty: float = 0.0      # format penalties
  shaping: float = 0.0      # unchanged-turn penalties (RolloutConfig.unchanged_penalty)
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
  metrics: Dict[str, np.ndarray]   # per episode, [B]
  summary: Dict[str, float]        # batch means, pass@group_size, cost counters, timings
  episodes: List[Dict[str, Any]]   # messages, success, reward, turns (for JSON logs)


def step_batch(env, states, actions_BxA, key, offset=0, total=None):
  """Plays each episode's actions in order until done; -1 slots are skipped.

  The rows are episodes offset .. offset + b - 1 of a batch of `total` (default b): their keys
  are those rows of the whole batch's keys, whichever process steps them.
  """
  b, a = actions_BxA.shape
  total = b if total is None else total
  keys_BxA = jax.random.split(key, total * a).reshape(total, a)[offset:offset + b]

  def one(state, actions_A, keys_A):
    def body(carry, x):
      state, reward, n_exec, n_eff, success = carry
      action, k = x
      take = (action >= 0) & ~state.done
      new, r, _, info = env.step(k, state, jnp.maximum(action, 0))
      state = jax.tree.map(lambda n, o: jnp.where(take, n, o), new, state)
      return (state, reward + jnp.where(take, r, 0.0), n_exec + take,
              n_eff + (take & info["action_is_effective"]),
              success | (take & info["success"])), None
    zero = jnp.zeros((), jnp.int32)
    carry, _ = jax.lax.scan(body, (state, jnp.float32(0.0), zero, zero, jnp.bool_(False)),
                            (actions_A, keys_A))
    return carry

  return jax.vmap(one)(states, actions_BxA, keys_BxA)


@functools.lru_cache(maxsize=None)
def env_functions(env):
  """Jitted (reset over keys, step over the batch), shared by every Rollout of `env`."""
  return jax.jit(env.reset_batch), jax.jit(functools.partial(step_batch, env),
                                            static_argnames=("offset", "total"))

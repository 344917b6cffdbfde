"""The rollout's view of an environment: a batch of episodes, strings in and strings out.

    envs_ = env_batch.make(env, config, batch_size)   # a JaxBatch or a HostBatch
    starts = envs_.reset(seed, rows)                  # per local row: Start | EnvFault
    keys = envs_.state_keys([0, 1])                   # per row: the state's 64-bit key
    outcomes = envs_.step({i: ["Up", "Left"]}, key)   # per stepped row: Outcome | EnvFault

`JaxBatch` plays a pure-JAX environment: every row reset and stepped in one jitted, vmapped
call (the names are matched back to action indices), the states rendered on the host.
`HostBatch` plays a text environment (envs.TextEnv), one instance per episode, stepped
concurrently by `envs.host.pool.HostPool` with a timeout; a failing instance comes back as an
`EnvFault` for its row only. Group g of a batch starts from the level of seed `seed + g`.

Dimension legend: B episodes of the whole batch, b this process's rows, A actions per turn.
"""

import dataclasses
import functools
from typing import Any, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import distributed
from ragen_jax.envs import registry
from ragen_jax.envs.device import base as env_base
from ragen_jax.envs.host.pool import HostPool
from ragen_jax.envs.host.records import Outcome
from ragen_jax.envs.host.records import Plan
from ragen_jax.envs.host.records import Start
from ragen_jax.rollout import state_keys as keys_lib


def make(env, config, batch_size: int, sharder=None):
  """The batch for `env`: a pure-JAX environment or an `envs.HostEnv`."""
  env_base.check_render_format(env, config.render_format)
  if isinstance(env, registry.HostEnv):
    return HostBatch(env, config, batch_size)
  return JaxBatch(env, config, batch_size, sharder)


def row(tree, i: int):
  """Episode i of a host pytree of batched arrays."""
  return jax.tree.map(lambda x: x[i], tree)


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
  """Jitted (reset over keys, step over the batch), shared by every rollout of `env`."""
  return jax.jit(env.reset_batch), jax.jit(
      functools.partial(step_batch, env), static_argnames=("offset", "total")
  )


@functools.partial(jax.jit, static_argnames=("groups", "group_size", "lo", "hi"))
def _episode_keys(seed, *, groups: int, group_size: int, lo: int, hi: int) -> jax.Array:
  """Rows lo..hi of the batch's keys: group g's level comes from key `seed + g`, shared by its
  `group_size` episodes. One program (run eagerly, each of these operations compiled its own)."""
  group_keys = jax.vmap(jax.random.key)(seed + jnp.arange(groups))
  return jnp.repeat(group_keys, group_size, axis=0)[lo:hi]


class JaxBatch:
  """A pure-JAX environment's episodes (see the module doc)."""

  def __init__(self, env, config, batch_size: int, sharder=None):
    self.env, self.config, self.batch_size = env, config, batch_size
    self._reset, self._step = env_functions(env)
    # The environments are host-sized work: on a mesh they stay on this process's first device,
    # and their keys are copied there (jit refuses arguments committed to different devices).
    self._to_env = (lambda k: k) if sharder is None else distributed.local_copy
    # The text legend where the text shows symbols (an image's are in the instruction).
    self.legend = env.grid_vocab if config.render_format in env_base.SYMBOL_FORMATS else {}
    self._states = self._host = None
    self._names: List[tuple] = []
    self._offset = 0

  def _render(self, rows: Sequence[int]) -> List[str]:
    """The rows' texts from the host states, in one call for the turn (NumPy only)."""
    return self.env.render_batch(self._host, rows, self.config.render_format)

  def reset(self, seed: int, rows: Sequence[int]) -> List[Start]:
    c, (lo, hi) = self.config, rows
    keys = _episode_keys(seed, groups=c.env_groups, group_size=c.group_size, lo=lo, hi=hi)
    self._states = self._reset(keys)
    self._host, self._offset = jax.device_get(self._states), lo
    instruction = self.env.instruction(c.render_format)
    self._names = [tuple(self.env.action_names_for(row(self._host, i))) for i in range(hi - lo)]
    texts = self._render(range(hi - lo))
    return [Start(text, instruction, names, None) for text, names in zip(texts, self._names)]

  @property
  def device_states(self):
    """The batched states on the device (what a visual environment's frames are drawn from)."""
    return self._states

  def states(self, indices: Sequence[int]) -> Dict[int, Any]:
    """The episodes' unbatched host states (what scripted experts plan from)."""
    return {i: row(self._host, i) for i in indices}

  def state_keys(self, indices: Sequence[int]) -> Dict[int, int]:
    """Keys of the episodes' current states, hashed on the device in one call (`state_keys`)."""
    keys = keys_lib.combine(jax.device_get(keys_lib.device_keys_jit(self._states)))
    return {i: keys[i] for i in indices}

  def step(self, actions: Dict[int, List[str]], key) -> Dict[int, Outcome]:
    b = len(self._names)
    actions_BxA = np.full((b, self.config.max_actions_per_turn), -1, np.int32)
    for i, names in actions.items():
      actions_BxA[i, : len(names)] = [self._names[i].index(name) for name in names]
    self._states, reward_B, n_exec_B, n_eff_B, success_B = self._step(
        self._states, actions_BxA, self._to_env(key), offset=self._offset, total=self.batch_size
    )
    self._host, reward_B, n_exec_B, n_eff_B, success_B = jax.device_get(
        (self._states, reward_B, n_exec_B, n_eff_B, success_B)
    )
    done_B = np.asarray(self._host.done)
    texts = dict(zip(actions, self._render(list(actions))))
    return {
        i: Outcome(
            texts[i],
            float(reward_B[i]),
            bool(done_B[i]),
            bool(success_B[i]),
            int(n_exec_B[i]),
            int(n_eff_B[i]),
            True,
        )
        for i in actions
    }

  def close(self) -> None:
    pass


def has_expert(env) -> bool:
  """Whether `env`'s episodes can demonstrate: its class (a text environment's factory)
  defines `expert`."""
  owner = env.factory if isinstance(env, registry.HostEnv) else env
  return callable(getattr(owner, "expert", None))


class HostBatch:
  """A text environment's episodes, one instance each, in a `ragen_jax.envs.host.pool.HostPool`."""

  legend: Dict[str, str] = {}

  def __init__(self, env: registry.HostEnv, config, batch_size: int):
    self.env, self.config, self.batch_size = env, config, batch_size
    self.pool = HostPool(
        env.bound(), mode=env.pool, workers=env.workers, step_timeout_s=env.step_timeout_s
    )
    self._observations: Dict[int, str] = {}

  def reset(self, seed: int, rows: Sequence[int]) -> List[Any]:
    lo, hi = rows
    seeds = [seed + (lo + i) // self.config.group_size for i in range(hi - lo)]
    starts = self.pool.reset(seeds)
    self._observations = {i: s.observation for i, s in enumerate(starts) if isinstance(s, Start)}
    return starts

  def states(self, indices: Sequence[int]) -> Dict[int, Any]:
    """What a scripted policy of a text environment reads: each episode's `Plan` from the
    environment's own `expert()` when its class has one (a failed call: `None`), else its
    last observation."""
    if not has_expert(self.env):
      return {i: self._observations.get(i, "") for i in indices}
    plans = self.pool.expert(list(indices))
    return {i: plan if isinstance(plan, Plan) else None for i, plan in plans.items()}

  def state_keys(self, indices: Sequence[int]) -> Dict[int, int]:
    """Keys of the episodes' current observations (a text environment's state)."""
    return {i: keys_lib.text_key(self._observations.get(i, "")) for i in indices}

  def step(self, actions: Dict[int, List[str]], key) -> Dict[int, Any]:
    del key  # host environments draw from their own seeded generators
    outcomes = self.pool.step({i: names for i, names in actions.items() if names})
    for i, out in outcomes.items():
      if isinstance(out, Outcome):
        self._observations[i] = out.observation
    # A turn without a valid action leaves the environment untouched (RAGEN steps nothing).
    unchanged = Outcome("", 0.0, False, False, 0, 0, True)
    for i in actions:
      if i not in outcomes:
        outcomes[i] = dataclasses.replace(unchanged, observation=self._observations[i])
    return outcomes

  def close(self) -> None:
    self.pool.close()

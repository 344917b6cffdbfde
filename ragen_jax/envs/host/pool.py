"""Fault-isolated, concurrent stepping of host text environments, one instance per episode.

The rollout resets a batch of episodes, then once per turn steps each live episode's parsed
actions. Every env call runs concurrently across episodes and under a deadline, and whatever one
env does (raise, hang, return garbage, crash its process) ends only its own episode:

    pool = HostPool(functools.partial(MyEnv, size=6), step_timeout_s=30)
    starts = pool.reset([seed_0, seed_1, ...])        # [Start | EnvFault]; episode i: seeds[i]
    results = pool.step({0: ["Up", "Left"], 2: ["Down"]})  # {episode: Outcome | EnvFault}
    ...
    pool.close()                                      # also runs at interpreter exit

`factory` (zero arguments) makes one fresh instance per episode; `reset` closes the previous
episodes' instances first. `step` runs an episode's actions in order and stops at done (the rest
of the list is not executed).

Modes:
  "thread"   one daemon thread (an "episode actor") per episode owns its instance and runs its
             calls in order, so envs that keep thread-local state stay on one thread. For envs
             that wait or release the GIL (I/O, subprocesses, NumPy).
  "process"  `workers` processes (default: os.cpu_count()), started with "spawn" (the parent
             runs JAX threads: never fork), episodes assigned round-robin, with the same
             per-episode actors inside each worker. For CPU-bound envs; the factory must pickle
             (a module-level class or function, or functools.partial of one). Workers run JAX,
             if an env uses it, on the CPU (the parent holds the accelerators) unless
             JAX_PLATFORMS says otherwise.

Fault kinds (EnvFault.kind); the episode ends and its instance is never called again:
  raised           the factory, reset, step or an attribute read raised (traceback attached)
  timeout          one call (an episode's reset, or its actions of one turn) ran past
                   step_timeout_s from its start; the instance is abandoned (not even closed)
  bad_output       step's result is not a 4-sequence, done is not a bool, info is not a dict or
                   None, or instruction / action_names / max_actions_per_turn are malformed
  bad_observation  reset or step returned an observation that is not a str
  bad_reward       a reward that is not a finite real number (NaN, inf, a str, ...)
  pool             the pool lost the episode (its worker process died, or could not unpickle
                   the factory), or the episode was stepped after it had already failed

This module holds thread mode and the HostPool handle; ragen_jax.envs.host.records the records,
actor the checks of env outputs and the per-episode actor, core the logic both modes share, and
workers the process mode.
"""

from collections.abc import Sequence
import functools
import os
import pickle
import queue
import time
from typing import Any, Callable, Optional
import weakref

from ragen_jax.envs.host.actor import Actor
from ragen_jax.envs.host.core import Core
from ragen_jax.envs.host.core import Episode
from ragen_jax.envs.host.records import EnvFault
from ragen_jax.envs.host.records import MODES
from ragen_jax.envs.host.records import Outcome
from ragen_jax.envs.host.records import Plan
from ragen_jax.envs.host.records import Start
from ragen_jax.envs.host.workers import ProcessCore

__all__ = ["HostPool"]


class _ThreadCore(Core):
  """mode="thread": an actor thread per episode, in this process."""

  def _place(self, episode_index: int, episode: Episode) -> None:
    episode.actor = Actor(self.factory, f"host-env-{episode_index}")

  def _run(self, calls: dict[int, tuple[str, Any]]) -> dict[int, Any]:
    replies = queue.SimpleQueue()
    for i, (op, payload) in calls.items():
      self.episodes[i].actor.submit(op, payload, functools.partial(_put_pair, replies, i))
    deadline = time.monotonic() + self.timeout_s
    arrived = {}
    while len(arrived) < len(calls):
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        break
      try:
        i, result = replies.get(timeout=remaining)
      except queue.Empty:
        break
      arrived[i] = result
    return arrived


def _put_pair(replies: queue.SimpleQueue, i: int, result: Any) -> None:
  replies.put((i, result))


class HostPool:
  """Runs one host text env instance per episode, concurrently and fault-isolated.

  Args:
    factory: zero-argument callable returning a fresh env (bind options with functools.partial).
    mode: "thread" or "process" (see the module doc).
    workers: worker processes of mode="process" (default os.cpu_count()); unused by "thread".
    step_timeout_s: the limit of each call: one episode's reset, or its actions of one turn.
  """

  def __init__(
      self,
      factory: Callable[[], Any],
      *,
      mode: str = "thread",
      workers: Optional[int] = None,
      step_timeout_s: float = 60.0,
  ):
    if not callable(factory):
      raise TypeError(f"factory must be a zero-argument callable, got {factory!r}")
    if mode not in MODES:
      raise ValueError(f"Unknown mode {mode!r}; valid modes: {MODES}.")
    if not step_timeout_s > 0:
      raise ValueError(f"step_timeout_s must be positive, got {step_timeout_s!r}")
    self.mode = mode
    if mode == "thread":
      core = _ThreadCore(factory, float(step_timeout_s))
    else:
      workers = (os.cpu_count() or 1) if workers is None else int(workers)
      if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
      try:
        blob = pickle.dumps(factory)
      except Exception as exc:
        raise ValueError(
            f"mode='process' sends the factory to worker processes, but {factory!r} does not "
            f"pickle ({type(exc).__name__}: {exc}). Use mode='thread', or a module-level "
            "factory (a class or function, or functools.partial of one)."
        ) from exc
      core = ProcessCore(factory, float(step_timeout_s), workers, blob)
    self._core = core
    # Runs close() once: on close(), on garbage collection, or at interpreter exit.
    self._finalizer = weakref.finalize(self, core.close)

  def reset(self, seeds: Sequence[int]) -> list[Start | EnvFault]:
    """Closes the previous episodes, then starts len(seeds) fresh ones; episode i: seeds[i]."""
    return self._core.reset(seeds)

  def step(self, actions: dict[int, Sequence[str]]) -> dict[int, Outcome | EnvFault]:
    """Steps each episode's actions in order until done; one result per key of `actions`.

    A finished episode (done) executes nothing: Outcome(executed=0, done=True).
    """
    return self._core.step(actions)

  def expert(self, indices: Sequence[int]) -> dict[int, Plan | EnvFault]:
    """Each episode's `env.expert()` (the scripted demonstrator's plan for this turn)."""
    return self._core.expert(indices)

  def close(self) -> None:
    """Closes the live instances and stops the workers; idempotent."""
    self._finalizer()

  def worker_pids(self) -> list[int]:
    """The worker processes' pids, worker k at index k ([] before the first reset, or in
    mode="thread"); for tests and diagnostics."""
    return self._core.worker_pids()

  def __enter__(self) -> "HostPool":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

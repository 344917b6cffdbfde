"""The host pool's state and logic shared by its modes: a batch of episodes, their calls, faults.

`Core` resets and steps a batch of episodes and records timeouts and faults; a subclass runs the
calls: `_ThreadCore` in ragen_jax.envs.host.pool (actor threads in this process) and
`ProcessCore` in ragen_jax.envs.host.workers (actor threads in worker processes).
"""

from collections.abc import Sequence
import itertools
import threading
from typing import Any, Callable, Optional

from ragen_jax.envs.host import records
from ragen_jax.envs.host.actor import Actor
from ragen_jax.envs.host.records import log as _log


class Episode:
  """One episode of the batch: where it runs, and its fault once it failed."""

  __slots__ = ("uid", "actor", "worker", "fault", "closable")

  def __init__(self, uid: int):
    self.uid = uid
    self.actor: Optional[Actor] = None
    self.worker: Any = None  # mode="process": its ragen_jax.envs.host.workers worker
    self.fault: Optional[records.EnvFault] = None
    self.closable = True  # has an instance that may still be called (to close it)


class Core:
  """The pool's state and logic, apart from the HostPool handle so a finalizer can close it.

  Subclasses run calls: `_run({episode: (op, payload)})` returns the results that arrived before
  the deadline; a missing episode timed out.
  """

  def __init__(self, factory: Callable[[], Any], step_timeout_s: float):
    self.factory = factory
    self.timeout_s = step_timeout_s
    self.episodes: list[Episode] = []
    self.closed = False
    self.lock = threading.Lock()
    self._uids = itertools.count()

  def _prepare(self) -> None:
    """Gets ready for a new batch of episodes (the previous ones are closed)."""

  def _place(self, episode_index: int, episode: Episode) -> None:
    raise NotImplementedError

  def _run(self, calls: dict[int, tuple[str, Any]]) -> dict[int, Any]:
    raise NotImplementedError

  def _abandon(self, episode: Episode) -> None:
    episode.closable = False

  def _shutdown(self) -> None:
    """Stops whatever runs the episodes (the episodes are closed)."""

  def worker_pids(self) -> list[int]:
    return []

  def _check_open(self) -> None:
    if self.closed:
      raise RuntimeError("the HostPool is closed")

  def _record(self, i: int, result: Any, what: str) -> Any:
    episode = self.episodes[i]
    if result is None:
      result = records.EnvFault(
          "timeout",
          f"{what} did not return within {self.timeout_s:g} s; the instance is abandoned",
      )
      self._abandon(episode)
    if isinstance(result, records.EnvFault) and episode.fault is None:
      episode.fault = result
    return result

  def reset(self, seeds: Sequence[int]) -> list[Any]:
    seeds = [int(seed) for seed in seeds]
    with self.lock:
      self._check_open()
      self._close_episodes()
      self._prepare()
      self.episodes = [Episode(next(self._uids)) for _ in seeds]
      for i, episode in enumerate(self.episodes):
        self._place(i, episode)
      results = self._run({i: ("reset", seed) for i, seed in enumerate(seeds)})
      return [self._record(i, results.get(i), "reset") for i in range(len(seeds))]

  def step(self, actions: dict[int, Sequence[str]]) -> dict[int, Any]:
    for i, episode_actions in actions.items():
      if isinstance(episode_actions, (str, bytes)):
        raise TypeError(f"episode {i}'s actions are a str; pass a list of actions")
    calls = {i: ("step", list(episode_actions)) for i, episode_actions in actions.items()}
    return self._call_live(calls, lambda payload: f"step ({len(payload)} actions)")

  def expert(self, indices: Sequence[int]) -> dict[int, Any]:
    return self._call_live({i: ("expert", None) for i in indices}, lambda payload: "expert")

  def _call_live(self, calls: dict[int, tuple[str, Any]], what) -> dict[int, Any]:
    """Runs `calls` on the episodes that have not failed; a failed one gets a "pool" fault."""
    with self.lock:
      self._check_open()
      for i in calls:
        if not 0 <= i < len(self.episodes):
          raise IndexError(f"episode {i} is not one of this batch's {len(self.episodes)}")
      results, live = {}, {}
      for i, call in calls.items():
        fault = self.episodes[i].fault
        if fault is None:
          live[i] = call
        else:
          message = records.one_line(f"episode {i} already failed ({fault.kind}): {fault.message}")
          results[i] = records.EnvFault("pool", message)
      arrived = self._run(live)
      for i, (_, payload) in live.items():
        results[i] = self._record(i, arrived.get(i), what(payload))
      return {i: results[i] for i in calls}

  def _close_episodes(self) -> None:
    calls = {i: ("close", None) for i, ep in enumerate(self.episodes) if ep.closable}
    arrived = self._run(calls)
    for i in calls:
      if i not in arrived:
        _log.debug(f"host pool: episode {i}'s close() did not return; abandoned")
        self._abandon(self.episodes[i])
    self.episodes = []

  def close(self) -> None:
    with self.lock:
      if self.closed:
        return
      self.closed = True
      try:
        self._close_episodes()
      finally:
        self._shutdown()

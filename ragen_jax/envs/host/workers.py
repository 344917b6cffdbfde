"""mode="process" of ragen_jax.envs.host.pool: spawned worker processes running episode actors.

`ProcessCore` starts `workers` processes with "spawn" (the parent runs JAX threads: never fork),
sends each one its episodes' calls in one message per batch, and waits for the replies under the
pool's deadline; a worker that dies, or never starts, fails only its own episodes. Inside a worker,
`_worker_main` runs each episode in a `ragen_jax.envs.host.actor.Actor`. Workers that abandoned a
hung call are replaced at the next reset.
"""

import functools
import multiprocessing
from multiprocessing import connection as mp_connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback as traceback_lib
from typing import Any, Callable, Optional

from ragen_jax.envs.host import core
from ragen_jax.envs.host import records
from ragen_jax.envs.host.actor import Actor
from ragen_jax.envs.host.records import log as _log

# A new worker imports this package and the factory's module before it can serve. That is not
# an env call, so it has its own generous limit instead of step_timeout_s.
_WORKER_START_TIMEOUT_S = 120.0
# A worker exits as soon as its pipe closes; only a wedged one (a thread holding the GIL) waits
# this long before it is terminated.
_WORKER_EXIT_GRACE_S = 2.0


def _worker_main(conn: mp_connection.Connection, factory_blob: bytes) -> None:
  """A worker: per-episode actors serving the parent's batches of calls.

  Parent -> worker: ("run", [(uid, op, payload), ...]); closing the pipe stops the worker.
  Worker -> parent: ("ready", pid) once, then ("result", uid, result) per call.
  """
  # Ctrl-C and a scheduler's SIGTERM (sent to every process of the job) are the parent's to
  # handle: it finishes the step, which needs these workers, then closes their pipes.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  if "jax" in sys.modules and "JAX_PLATFORMS" not in os.environ:
    try:  # the parent holds the accelerators; an env that uses JAX runs it on the CPU here
      sys.modules["jax"].config.update("jax_platforms", "cpu")
    except Exception:
      pass
  send_lock = threading.Lock()

  def send(message: Any) -> None:
    with send_lock:  # actors reply from their own threads
      try:
        conn.send(message)
      except (OSError, ValueError):  # the parent is gone: nothing left to serve
        os._exit(0)

  def reply(uid: int, result: Any) -> None:
    send(("result", uid, result))

  try:
    factory, load_fault = pickle.loads(factory_blob), None
  except BaseException as exc:
    factory = None
    load_fault = records.EnvFault(
        "pool",
        records.one_line(f"the worker could not unpickle the factory: {type(exc).__name__}: {exc}"),
        "".join(traceback_lib.format_exception(exc)),
    )
  send(("ready", os.getpid()))
  actors = {}
  while True:
    try:
      message = conn.recv()
    except (EOFError, OSError):
      break
    for uid, op, payload in message[1]:
      if load_fault is not None:
        reply(uid, None if op == "close" else load_fault)
        continue
      if op == "reset":
        actors[uid] = Actor(factory, f"host-env-{uid}")
      actor = actors.pop(uid, None) if op == "close" else actors.get(uid)
      if actor is None:
        reply(
            uid,
            None if op == "close" else records.EnvFault("pool", f"no episode {uid} on the worker"),
        )
      else:
        actor.submit(op, payload, functools.partial(reply, uid))
  os._exit(0)  # at once: abandoned actors may never return


class _Worker:
  """The parent's handle on one worker process."""

  def __init__(self, context: Any, index: int, factory_blob: bytes):
    self.conn, child_conn = context.Pipe()
    self.process = context.Process(
        target=_worker_main,
        args=(child_conn, factory_blob),
        name=f"host-pool-worker-{index}",
        daemon=True,
    )
    self.process.start()
    child_conn.close()  # the worker holds the other end: its exit reads here as end of file
    self.pid = self.process.pid
    self.ready = False
    self.dead: Optional[records.EnvFault] = None  # why the worker is gone, once it is
    self.hung = False  # it has abandoned actors: replaced at the next reset


class ProcessCore(core.Core):
  """mode="process": spawned workers, each with an actor thread per episode it holds."""

  def __init__(
      self, factory: Callable[[], Any], step_timeout_s: float, workers: int, factory_blob: bytes
  ):
    super().__init__(factory, step_timeout_s)
    self.factory_blob = factory_blob
    self.num_workers = workers
    self.workers: list[_Worker] = []
    self._context = multiprocessing.get_context("spawn")
    # During _run: uid -> (episode index, worker) of the calls not answered yet, and the answers.
    self._awaited: dict[int, tuple[int, _Worker]] = {}
    self._arrived: dict[int, Any] = {}

  def worker_pids(self) -> list[int]:
    return [worker.pid for worker in self.workers]

  def _abandon(self, episode: core.Episode) -> None:
    super()._abandon(episode)
    episode.worker.hung = True

  def _prepare(self) -> None:
    stale = [w for w in self.workers if w.dead is not None or w.hung]
    _stop_workers(stale)
    fresh = []
    for k in range(self.num_workers):
      if k >= len(self.workers) or self.workers[k] in stale:
        worker = _Worker(self._context, k, self.factory_blob)
        if k < len(self.workers):
          self.workers[k] = worker
        else:
          self.workers.append(worker)
        fresh.append(worker)
    self._pump(time.monotonic() + _WORKER_START_TIMEOUT_S, lambda: _starting(fresh))
    for worker in _starting(fresh):
      message = f"worker process {worker.pid} did not start in {_WORKER_START_TIMEOUT_S:g} s"
      self._lose(worker, message)
      _stop_workers([worker])

  def _place(self, episode_index: int, episode: core.Episode) -> None:
    episode.worker = self.workers[episode_index % len(self.workers)]

  def _run(self, calls: dict[int, tuple[str, Any]]) -> dict[int, Any]:
    self._awaited, self._arrived = {}, {}
    batches: dict[_Worker, list[tuple[int, str, Any]]] = {}
    for i, (op, payload) in calls.items():
      episode = self.episodes[i]
      if episode.worker.dead is not None:
        self._arrived[i] = episode.worker.dead
        continue
      batches.setdefault(episode.worker, []).append((episode.uid, op, payload))
      self._awaited[episode.uid] = (i, episode.worker)
    try:
      for worker, batch in batches.items():  # one message per worker per call
        try:
          worker.conn.send(("run", batch))
        except (OSError, ValueError):
          self._drain(worker, gone=True)
      deadline = time.monotonic() + self.timeout_s
      self._pump(deadline, lambda: {worker for _, worker in self._awaited.values()})
      return self._arrived
    finally:
      self._awaited, self._arrived = {}, {}

  def _pump(self, deadline: float, busy: Callable[[], Any]) -> None:
    """Receives messages until no worker in busy() owes one, or the deadline passes."""
    while True:
      workers = busy()
      remaining = deadline - time.monotonic()
      if not workers or remaining <= 0:
        return
      handles = {}
      for worker in workers:
        handles[worker.conn] = worker
        handles[worker.process.sentinel] = worker
      for handle in mp_connection.wait(list(handles), remaining):
        worker = handles[handle]
        if worker.dead is None:
          self._drain(worker, gone=handle == worker.process.sentinel)

  def _drain(self, worker: _Worker, gone: bool) -> None:
    """Takes the worker's pending messages; a worker found gone loses its episodes."""
    try:
      while worker.conn.poll():
        message = worker.conn.recv()
        if message[0] == "ready":
          worker.ready = True
        else:
          _, uid, result = message
          entry = self._awaited.pop(uid, None)
          if entry is not None:  # else a late reply of an abandoned call
            self._arrived[entry[0]] = result
    except (EOFError, OSError):
      gone = True
    if gone:
      worker.process.join(1.0)
      code = worker.process.exitcode
      status = "is unresponsive" if code is None else f"exited with code {code}"
      self._lose(worker, f"the episode's worker process {worker.pid} {status}")

  def _lose(self, worker: _Worker, message: str) -> None:
    """Fails the worker's outstanding calls and its episodes."""
    if worker.dead is not None:
      return
    _log.warning(f"host pool: {message}")
    worker.dead = records.EnvFault("pool", message)
    for uid, (i, owner) in list(self._awaited.items()):
      if owner is worker:
        del self._awaited[uid]
        self._arrived[i] = worker.dead
    for episode in self.episodes:
      if episode.worker is worker and episode.closable:
        episode.closable = False
        if episode.fault is None:
          episode.fault = worker.dead

  def _shutdown(self) -> None:
    _stop_workers(self.workers)
    self.workers = []


def _starting(workers: list[_Worker]) -> list[_Worker]:
  return [w for w in workers if not w.ready and w.dead is None]


def _stop_workers(workers: list[_Worker]) -> None:
  """Closes the pipes (a worker then exits at once), then kills those that do not (workers
  ignore SIGTERM)."""
  for worker in workers:
    try:
      worker.conn.close()
    except OSError:
      pass
  deadline = time.monotonic() + _WORKER_EXIT_GRACE_S
  for worker in workers:
    worker.process.join(max(0.0, deadline - time.monotonic()))
  for worker in workers:
    if worker.process.is_alive():
      worker.process.kill()
      worker.process.join()

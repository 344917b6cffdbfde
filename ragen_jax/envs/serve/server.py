"""Serve any text environment (ragen_jax.envs.text) over HTTP, one instance per episode.

  python -m ragen_jax.envs.serve my_pkg.my_env:MyEnv --port 8000 [--host 127.0.0.1] \
      [--options '{"k": 1}'] [--max-episodes 4096] [--max-body-bytes 1048576] \
      [--token-env ENV_TOKEN | --token TOKEN]

`module.path:Name` names a factory (a class or function, imported by
ragen_jax.envs.registry.load_entry; a URL is refused); every episode calls it with the options as
keyword arguments. A run plays the served environment with
`ragen_jax.envs.serve.client.HttpEnv("http://host:8000")`. In a test or notebook:

  server = serve(MyEnv, "127.0.0.1", 0, {"k": 1}, background=True)  # port 0: a free port
  env = HttpEnv(server.url)
  ...
  server.close()

Beyond 127.0.0.1 (a cluster network: `--host 0.0.0.0`), give the server a bearer token: every
request must then carry `Authorization: Bearer <token>` or gets 401 (compared in constant time).
`--token-env NAME` reads it from the environment variable NAME (kept out of the process list);
`--token` takes it directly. The client reads it from the environment variable its `token_env`
option names (`HttpEnv(url, token_env="ENV_TOKEN")`; in a config,
`envs.<tag>.options.token_env`), so the token never sits in a config or a log.

Protocol (JSON bodies, JSON answers, one connection per request):
  POST   /episodes            {"seed": int} -> {"episode": id, "observation": str,
                              "instruction": str|null, "action_names": [str]|null,
                              "max_actions_per_turn": int|null}   (attributes read after reset)
  POST   /episodes/<id>/step  {"action": str} -> {"observation", "reward", "done", "info"}
  DELETE /episodes/<id>       closes the instance and forgets it -> {"ok": true}
  GET    /health              -> {"ok": true, "episodes": <live episodes>}
Errors answer {"error": message}: 401 a missing or wrong token; 400 malformed JSON, a body that
is not an object, a missing field or one of the wrong type (a bool is not a seed); 404 an unknown path or episode id; 405 a
method the path does not take (any other method too, rather than http.server's 501); 408 a body
that stops arriving (60 s); 411 a body without Content-Length; 413 a body over --max-body-bytes
(decided from the header before reading; a body up to 8 times the limit is then read and dropped,
so a client still sending it gets the 413 rather than a connection reset); 503 when the episode
cap is reached and every episode is busy. An exception inside the environment (its factory,
reset, step or close) answers 500 with {"error", "exception" (the type's name), "message"}; after
a step raised the episode stays (the client may delete it), a failed reset leaves none.

What the environment returns is passed through as far as JSON allows: numpy scalars and arrays
become numbers and lists, tuples and sets lists, non-string dict keys str(key), anything else
str(value); a non-string observation or a reward of the wrong type is not corrected, the
rollout checks them. Non-finite floats use Python json's NaN, Infinity and -Infinity tokens
(json's allow_nan default; not strict JSON, a non-Python client needs a lenient parser) so a NaN
or infinite reward arrives as one and the rollout can flag it.

Live episodes are capped (--max-episodes): beyond the cap the least recently used idle episodes
are closed, so clients that die without DELETE do not leak instances forever; a client whose
episode was closed that way gets 404. Requests on one episode hold its lock (they never
interleave), different episodes step concurrently (a thread per connection). Requests are logged
at debug level, environment exceptions at warning level. SIGTERM or Ctrl-C closes the live
episodes and exits.

This module holds the episodes (EnvServer, a declaration on ragen_jax.json_http, which handles
the requests, their limits and the token) and the command line.
"""

import argparse
import collections
import dataclasses
import json
import logging
import secrets
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from ragen_jax import json_http
from ragen_jax.envs import registry

logger = logging.getLogger("ragen_jax.envs.serve")  # the environment server's one logger

DEFAULT_MAX_EPISODES = 4096
DEFAULT_MAX_BODY_BYTES = json_http.DEFAULT_MAX_BODY_BYTES
DEFAULT_REQUEST_TIMEOUT_S = json_http.DEFAULT_REQUEST_TIMEOUT_S


def _env_error(what: str, exc: BaseException) -> json_http.HttpError:
  logger.warning("%s raised %s: %s", what, type(exc).__name__, exc, exc_info=exc)
  return json_http.HttpError(
      500,
      f"{what} raised {type(exc).__name__}: {exc}",
      exception=type(exc).__name__,
      message=str(exc),
  )


def jsonable(value: Any) -> Any:
  """`value` as JSON-encodable Python (see the module doc); floats, NaN included, unchanged."""
  if value is None or isinstance(value, (str, bool, int, float)):
    return value
  if isinstance(value, Mapping):
    return {k if isinstance(k, str) else str(k): jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple, set, frozenset)):
    return [jsonable(v) for v in value]
  if callable(getattr(value, "tolist", None)):  # numpy and jax scalars and arrays
    try:
      return jsonable(value.tolist())
    except Exception:
      pass
  return str(value)


@dataclasses.dataclass(eq=False)
class _Episode:
  env: Any
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  closed: bool = False  # set under `lock` once the instance is closed (deleted or evicted)


def _close_env(episode_id: str, env: Any) -> None:
  close = getattr(env, "close", None)
  if callable(close):
    close()
  logger.debug("episode %s closed", episode_id)


class EnvServer(json_http.JsonServer):
  """The environment server: the protocol's routes (module doc) over the live episodes, keyed by
  unguessable ids. close() also closes every live episode."""

  SERVER_VERSION = "ragen-jax-env/1"

  def __init__(
      self,
      factory: Callable[..., Any],
      host: str = "127.0.0.1",
      port: int = 0,
      options: Optional[Mapping[str, Any]] = None,
      *,
      max_episodes: int = DEFAULT_MAX_EPISODES,
      max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
      request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
      token: str = "",
  ):
    if max_episodes < 1:
      raise ValueError("max_episodes must be positive")
    self.factory = factory
    self.options = dict(options or {})
    self.max_episodes = max_episodes
    self._episodes: "collections.OrderedDict[str, _Episode]" = collections.OrderedDict()
    self._lock = threading.Lock()  # guards _episodes; never held while an environment runs
    super().__init__(
        host,
        port,
        token=token,
        max_body_bytes=max_body_bytes,
        request_timeout_s=request_timeout_s,
    )

  # The routes.

  def _health(self, request: json_http.Request) -> Dict[str, Any]:
    del request
    return {"ok": True, "episodes": self.num_episodes}

  def _create(self, request: json_http.Request) -> Dict[str, Any]:
    return self.create_episode(json_http.field(request.json(), "seed", int))

  def _step(self, request: json_http.Request) -> Dict[str, Any]:
    action = json_http.field(request.json(), "action", str)
    return self.step_episode(request.params["episode"], action)

  def _delete(self, request: json_http.Request) -> Dict[str, Any]:
    self.delete_episode(request.params["episode"])
    return {"ok": True}

  ROUTES = (
      json_http.Route("GET", "/health", _health),
      json_http.Route("POST", "/episodes", _create),
      json_http.Route("DELETE", "/episodes/{episode}", _delete),
      json_http.Route("POST", "/episodes/{episode}/step", _step),
  )

  @property
  def num_episodes(self) -> int:
    with self._lock:
      return len(self._episodes)

  def server_close(self) -> None:
    super().server_close()
    with self._lock:
      episodes = list(self._episodes.items())
      self._episodes.clear()
    # Episodes still busy after a short grace period (stuck in their environment) are left to
    # their daemon threads.
    deadline = time.monotonic() + 2.0
    for episode_id, episode in episodes:
      if episode.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        try:
          episode.closed = True
          _close_env(episode_id, episode.env)
        except Exception as exc:
          logger.warning("closing episode %s raised %r", episode_id, exc)
        finally:
          episode.lock.release()

  # The episodes. Environments run outside `_lock`, under their episode's lock.

  def create_episode(self, seed: int) -> Dict[str, Any]:
    try:
      env = self.factory(**self.options)
    except Exception as exc:
      raise _env_error("the environment factory", exc) from exc
    try:
      observation = env.reset(seed)
      answer = {
          "observation": observation,
          "instruction": getattr(env, "instruction", None),
          "action_names": getattr(env, "action_names", None),
          "max_actions_per_turn": getattr(env, "max_actions_per_turn", None),
      }
      answer = jsonable(answer)
    except Exception as exc:
      self._try_close("(new)", env)
      raise _env_error("reset", exc) from exc
    episode_id = secrets.token_hex(16)
    episode = _Episode(env)
    with self._lock:
      self._episodes[episode_id] = episode
      evicted = self._pop_idle_beyond_cap(keep=episode_id)
      refused = len(self._episodes) > self.max_episodes
      if refused:
        del self._episodes[episode_id]
    for old_id, old in evicted:
      try:
        self._try_close(old_id, old.env)
      finally:
        old.lock.release()
    if refused:
      self._try_close(episode_id, env)
      raise json_http.HttpError(503, f"all {self.max_episodes} episodes are busy; retry later")
    logger.debug("episode %s created with seed %d", episode_id, seed)
    return {"episode": episode_id, **answer}

  def _pop_idle_beyond_cap(self, keep: str) -> list:
    """Under `_lock`: removes the least recently used idle episodes beyond the cap; they come
    back marked closed with their locks held, to be closed and released outside `_lock`."""
    evicted = []
    for episode_id, episode in list(self._episodes.items()):
      if len(self._episodes) <= self.max_episodes:
        break
      if episode_id != keep and episode.lock.acquire(blocking=False):
        episode.closed = True
        del self._episodes[episode_id]
        evicted.append((episode_id, episode))
    if evicted:
      logger.info("closed %d idle episodes beyond the cap of %d", len(evicted), self.max_episodes)
    return evicted

  def _get(self, episode_id: str) -> _Episode:
    with self._lock:
      episode = self._episodes.get(episode_id)
      if episode is not None:
        self._episodes.move_to_end(episode_id)  # most recently used last
    if episode is None:
      raise json_http.HttpError(
          404, "unknown episode (never created, deleted, or closed beyond the cap)"
      )
    return episode

  def step_episode(self, episode_id: str, action: str) -> Dict[str, Any]:
    episode = self._get(episode_id)
    with episode.lock:
      if episode.closed:  # deleted or evicted while this request waited for the lock
        raise json_http.HttpError(404, "unknown episode (deleted meanwhile)")
      try:
        result = episode.env.step(action)
        if not isinstance(result, (tuple, list)) or len(result) != 4:
          raise TypeError(f"step returned {str(result)[:100]}, not (obs, reward, done, info)")
        observation, reward, done, info = result
        return jsonable({"observation": observation, "reward": reward, "done": done, "info": info})
      except Exception as exc:
        raise _env_error("step", exc) from exc

  def delete_episode(self, episode_id: str) -> None:
    with self._lock:
      episode = self._episodes.pop(episode_id, None)
    if episode is None:
      raise json_http.HttpError(404, "unknown episode")
    with episode.lock:
      episode.closed = True
      try:
        _close_env(episode_id, episode.env)
      except Exception as exc:
        raise _env_error("close", exc) from exc

  def _try_close(self, episode_id: str, env: Any) -> None:
    try:
      _close_env(episode_id, env)
    except Exception as exc:
      logger.warning("closing episode %s raised %r", episode_id, exc)


def serve(
    factory: Callable[..., Any],
    host: str = "127.0.0.1",
    port: int = 0,
    options: Optional[Mapping[str, Any]] = None,
    *,
    background: bool = False,
    **server_options: Any,
) -> EnvServer:
  """A bound EnvServer (port 0: a free one, read `server.port`). background=True serves in a
  daemon thread; otherwise call `serve_forever()`. `close()` stops it either way."""
  server = EnvServer(factory, host, port, options, **server_options)
  if background:
    server.start()
  return server


def _interrupt(signum: int, frame: Any) -> None:
  raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m ragen_jax.envs.serve", description=__doc__.splitlines()[0]
  )
  parser.add_argument("entry", help="module.path:Name, the environment class or factory")
  parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
  parser.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
  parser.add_argument("--options", default="{}", help="JSON object of keyword arguments")
  parser.add_argument("--max-episodes", type=int, default=DEFAULT_MAX_EPISODES)
  parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
  json_http.add_token_arguments(parser)
  parser.add_argument(
      "--log-level",
      default="INFO",
      type=str.upper,
      choices=["DEBUG", "INFO", "WARNING", "ERROR"],
      help="DEBUG logs every request",
  )
  args = parser.parse_args(argv)
  token = json_http.token_from_arguments(parser, args)
  try:
    options = json.loads(args.options)
  except ValueError as exc:
    parser.error(f"--options is not JSON: {exc}")
  if not isinstance(options, dict):
    parser.error("--options must be a JSON object")
  if args.entry.startswith(("http://", "https://")):
    parser.exit(
        2,
        f"{parser.prog}: error: {args.entry!r} is the URL of an environment served already; "
        "serve a module.path:Name\n",
    )
  try:
    factory = registry.load_entry(args.entry)
    # Fail now on options the factory cannot take, not at the first episode.
    registry.check_options(factory, options, args.entry)
  except ValueError as exc:
    parser.exit(2, f"{parser.prog}: error: {exc}\n")
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
  server = serve(
      factory,
      args.host,
      args.port,
      options,
      max_episodes=args.max_episodes,
      max_body_bytes=args.max_body_bytes,
      token=token,
  )
  # The first stdout line names the bound port (useful with --port 0).
  print(f"serving {args.entry} at {server.url}", flush=True)
  # SIGTERM ends serving like Ctrl-C, so the live episodes are closed on the way out.
  signal.signal(signal.SIGTERM, _interrupt)
  server.serve_until_interrupted()


if __name__ == "__main__":
  sys.exit(main())

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

This module holds the episodes (EnvServer) and the command line; ragen_jax.envs.serve.http the
request handler.
"""

import argparse
import collections
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
from http import server as http_server
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from ragen_jax.envs import registry
from ragen_jax.envs.serve import http as serve_http

logger = serve_http.logger  # serve's one logger (declared in serve.http)

DEFAULT_MAX_EPISODES = 4096
DEFAULT_MAX_BODY_BYTES = 1 << 20
# A client that stops sending mid-request frees its thread after this long.
DEFAULT_REQUEST_TIMEOUT_S = 60.0


def _env_error(what: str, exc: BaseException) -> serve_http.HttpError:
  logger.warning("%s raised %s: %s", what, type(exc).__name__, exc, exc_info=exc)
  return serve_http.HttpError(
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


class EnvServer(http_server.ThreadingHTTPServer):
  """The HTTP server: its handler's routes plus the live episodes, keyed by unguessable ids."""

  daemon_threads = True  # a step stuck in an environment must not block shutdown
  # Rollouts open many connections at once; socketserver's backlog of 5 would refuse them.
  request_queue_size = 1024

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
    if max_episodes < 1 or max_body_bytes < 1:
      raise ValueError("max_episodes and max_body_bytes must be positive")
    self.factory = factory
    self.options = dict(options or {})
    self.max_episodes = max_episodes
    self.max_body_bytes = max_body_bytes
    self.request_timeout_s = request_timeout_s
    self.token = token  # non-empty: requests need `Authorization: Bearer <token>` (serve.http)
    self._episodes: "collections.OrderedDict[str, _Episode]" = collections.OrderedDict()
    self._lock = threading.Lock()  # guards _episodes; never held while an environment runs
    self._thread: Optional[threading.Thread] = None
    if ":" in host:
      self.address_family = socket.AF_INET6
    super().__init__((host, port), serve_http.Handler)

  def server_bind(self) -> None:
    # HTTPServer.server_bind resolves the host's FQDN, a reverse DNS look-up that can stall.
    socketserver.TCPServer.server_bind(self)
    self.server_name, self.server_port = self.server_address[:2]

  def handle_error(self, request: Any, client_address: Any) -> None:
    # What escapes a handler is a connection failure (a client reset mid-request): log it at
    # debug level instead of socketserver's traceback on stderr; the server goes on.
    logger.debug("request from %s failed", client_address, exc_info=True)

  @property
  def port(self) -> int:
    return self.server_address[1]

  @property
  def url(self) -> str:
    host = self.server_address[0]
    return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

  @property
  def num_episodes(self) -> int:
    with self._lock:
      return len(self._episodes)

  def start(self) -> threading.Thread:
    """Serves in a daemon thread; `close` stops it."""
    if self._thread is None:
      # A short poll interval: `close` (shutdown) waits up to one interval.
      self._thread = threading.Thread(
          target=self.serve_forever, args=(0.05,), name=f"env-server-{self.port}", daemon=True
      )
      self._thread.start()
    return self._thread

  def close(self) -> None:
    """Stops serving (a `start` thread), closes the socket and every live episode."""
    if self._thread is not None:
      self.shutdown()
      self._thread.join()
      self._thread = None
    self.server_close()

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

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
      raise serve_http.HttpError(503, f"all {self.max_episodes} episodes are busy; retry later")
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
      raise serve_http.HttpError(
          404, "unknown episode (never created, deleted, or closed beyond the cap)"
      )
    return episode

  def step_episode(self, episode_id: str, action: str) -> Dict[str, Any]:
    episode = self._get(episode_id)
    with episode.lock:
      if episode.closed:  # deleted or evicted while this request waited for the lock
        raise serve_http.HttpError(404, "unknown episode (deleted meanwhile)")
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
      raise serve_http.HttpError(404, "unknown episode")
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


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
  """`--token-env NAME` and `--token TOKEN`: the bearer token requests must carry (module doc)."""
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--token-env", default="", help="environment variable holding the token")
  group.add_argument("--token", default="", help="the token itself (visible in the process list)")


def token_from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
  """The token `add_token_arguments` declared ("" for none); exits naming an unset variable,
  and warns when a server binds beyond the loopback interface without one."""
  token = args.token
  if args.token_env:
    token = os.environ.get(args.token_env, "")
    if not token:
      parser.error(f"--token-env {args.token_env}: that environment variable is unset or empty")
  if not token and args.host not in ("127.0.0.1", "localhost", "::1"):
    print(
        f"{parser.prog}: warning: {args.host} is reachable from other hosts and no token is "
        "set (--token-env): anyone who can reach it can use it",
        file=sys.stderr,
    )
  return token


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
  add_token_arguments(parser)
  parser.add_argument(
      "--log-level",
      default="INFO",
      type=str.upper,
      choices=["DEBUG", "INFO", "WARNING", "ERROR"],
      help="DEBUG logs every request",
  )
  args = parser.parse_args(argv)
  token = token_from_arguments(parser, args)
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
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.close()


if __name__ == "__main__":
  sys.exit(main())

"""The one HTTP layer of the package's servers: routes, body limits, the bearer check, JSON errors.

A server is a declaration on `JsonServer`: its routes (method, path, handler), the error class
its answers take, and whether connections are kept alive:

  class Echo(json_http.JsonServer):
    def _echo(self, request):
      return {"echo": request.json()}
    ROUTES = (json_http.Route("POST", "/echo", _echo),)

  server = Echo(port=0, token="")   # 127.0.0.1 unless told otherwise
  server.start(); server.url; server.close()

The environment server (ragen_jax.envs.serve.server), the retrieval server
(ragen_jax.envs.text.retrieval_server) and the model server (ragen_jax.model_server.server) are
such declarations. What each of them gets here, once:
  routes        a path segment `{name}` matches any non-empty segment and reaches the handler
                as `request.params[name]`; an unknown path answers 404, a known path asked with
                another method (any method, invented ones too, rather than http.server's 501)
                405 with `Allow`
  the token     with one, every request except on a route declared `public` must carry
                `Authorization: Bearer <token>` (compared in constant time), else 401 with
                `WWW-Authenticate: Bearer`, before its path is looked at
  body limits   `request.json()` needs a Content-Length (411; 400 when it is not a number) of at
                most `max_body_bytes` (413, decided from the header before reading), a body that
                arrives whole (408 when it stops arriving within the socket timeout, 400 when it
                is short) and is a JSON object (400). A body left unread (an error before the
                handler read it) closes the connection; up to 8 times the limit of it is read
                and dropped after the answer (for at most 5 s), so a client still sending gets
                the answer rather than a connection reset.
  JSON answers  every outcome, errors included, is a JSON object in the server's error form
                (`HttpError`'s {"error": message}, or a subclass's); an exception in a handler
                answers 500 and the server goes on; requests that http.server itself refuses (a
                bad request line) get JSON too. Non-finite floats use Python json's NaN and
                Infinity tokens.
`add_token_arguments` and `token_from_arguments` give a command line its `--token-env` and
`--token` options, and the warning when it binds beyond the loopback interface without a token.
"""

import argparse
import dataclasses
import hmac
import json
import logging
import os
import re
import select
import socket
import socketserver
import sys
import threading
import time
from http import server as http_server
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

logger = logging.getLogger("ragen_jax.json_http")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_MAX_BODY_BYTES = 1 << 20
# A client that stops sending mid-request frees its thread after this long.
DEFAULT_REQUEST_TIMEOUT_S = 60.0
_DIGITS = re.compile(r"[0-9]+")
# Unread bodies up to this many times the limit are read and dropped after the answer, for at
# most _DISCARD_TIME_S; larger ones are cut off.
_MAX_DISCARD_FACTOR = 8
_DISCARD_TIME_S = 5.0


def bearer_matches(headers: Mapping[str, str], token: str) -> bool:
  """Whether a request's headers carry `Authorization: Bearer <token>` (constant time)."""
  sent = headers.get("Authorization", "").encode("utf-8", "replace")
  return hmac.compare_digest(sent, f"Bearer {token}".encode("utf-8"))


class HttpError(Exception):
  """An answer other than 200, raised inside a request: {"error": error, **extra}.

  A server whose errors take another form declares a subclass as its `JsonServer.ERROR`; the
  layer builds its own errors (401, 404, 405, the body's) as `ERROR(status, text)`.
  """

  def __init__(self, status: int, error: str, **extra: Any):
    super().__init__(error)
    self.status = status
    self.answer: Dict[str, Any] = {"error": error, **extra}
    self.headers: Dict[str, str] = {}


def field(body: Dict[str, Any], key: str, kind: type) -> Any:
  """`body[key]` when it is a `kind` (a bool is no int), else HttpError 400."""
  value = body.get(key)
  if not isinstance(value, kind) or isinstance(value, bool):
    raise HttpError(400, f"{key!r} must be a {kind.__name__}, got {type(value).__name__}")
  return value


@dataclasses.dataclass(frozen=True)
class Route:
  """`method` on `path` answers `handler(server, request)`: the answer, or None for none (the
  client left). `public`: answered without the token."""

  method: str
  path: str
  handler: Callable[..., Optional[Dict[str, Any]]]
  public: bool = False

  def match(self, segments: Sequence[str]) -> Optional[Dict[str, str]]:
    """The path's parameters when `segments` (the request path split at "/") match, else None."""
    pattern = self.path.split("/")
    if len(pattern) != len(segments):
      return None
    params = {}
    for want, got in zip(pattern, segments):
      if want.startswith("{") and want.endswith("}"):
        if not got:
          return None
        params[want[1:-1]] = got
      elif want != got:
        return None
    return params


class Request:
  """What a handler sees of its request: path parameters, headers, the JSON body."""

  def __init__(self, handler: "_Handler", params: Dict[str, str]):
    self._handler = handler
    self.params = params
    self.headers = handler.headers

  def json(self) -> Dict[str, Any]:
    """The body, a JSON object, read within the server's limits (see the module doc)."""
    return self._handler.read_json()

  def hung_up(self) -> bool:
    """Whether the client closed its connection (readable, and reading would return EOF)."""
    sock = self._handler.connection
    try:
      readable, _, _ = select.select([sock], [], [], 0)
      return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
      return True


class _Handler(http_server.BaseHTTPRequestHandler):
  """Answers one request of a JsonServer with its routes (see the module doc)."""

  server: "JsonServer"
  _discard = 0  # bytes of an unread body to drop after answering
  _body_read = False

  def setup(self) -> None:
    self.protocol_version = "HTTP/1.1" if self.server.KEEP_ALIVE else "HTTP/1.0"
    self.server_version = self.server.SERVER_VERSION
    self.timeout = self.server.request_timeout_s  # the socket's, set by StreamRequestHandler
    super().setup()

  def finish(self) -> None:
    super().finish()
    if 0 < self._discard <= _MAX_DISCARD_FACTOR * self.server.max_body_bytes:
      self._drop_body()

  def _drop_body(self) -> None:
    # A client still sending a body would get a connection reset instead of the answer if the
    # socket closed with unread data; read and drop it (bounded in time).
    try:
      self.connection.shutdown(socket.SHUT_WR)
      self.connection.settimeout(1.0)
      deadline = time.monotonic() + _DISCARD_TIME_S
      left = self._discard
      while left > 0 and time.monotonic() < deadline:
        chunk = self.connection.recv(min(left, 1 << 16))
        if not chunk:
          break
        left -= len(chunk)
    except OSError:
      pass

  def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
    logger.debug("%s " + format, self.address_string(), *args)  # never the headers (the token)

  def __getattr__(self, name: str) -> Any:
    # Every method (GET, PUT, HEAD, an invented one) is routed: 405 rather than a 501.
    if name.startswith("do_"):
      return self._dispatch
    raise AttributeError(name)

  def send_error(self, code: int, message: Optional[str] = None, explain: Any = None) -> None:
    # http.server's own answers to malformed requests (bad request line, headers too long).
    self.log_error("code %d, message %s", code, message)
    self.close_connection = True
    error = self.server.ERROR(code, message or self.responses.get(code, ("error",))[0])
    self._answer(error.status, error.answer, error.headers)

  def _dispatch(self) -> None:
    self._body_read = False
    headers: Dict[str, str] = {}
    try:
      status, answer = 200, self._route()
    except HttpError as err:
      status, answer, headers = err.status, err.answer, err.headers
    except Exception as exc:  # a bug here: answer it and keep serving
      logger.exception("internal error on %s %s", self.command, self.path)
      error = self.server.ERROR(500, f"internal server error: {type(exc).__name__}: {exc}")
      status, answer = error.status, error.answer
    if answer is None:  # the client left: nothing to answer on this connection
      self.close_connection = True
      return
    length = self.headers.get("Content-Length", "")
    if not self._body_read and _DIGITS.fullmatch(length.strip()) and int(length) > 0:
      self.close_connection = True  # the unread body must not be parsed as the next request
      self._discard = int(length)
    self._answer(status, answer, headers)

  def _route(self) -> Optional[Dict[str, Any]]:
    segments = self.path.split("?", 1)[0].split("/")
    matched = [(r, params) for r in self.server.ROUTES if (params := r.match(segments)) is not None]
    if not any(route.public for route, _ in matched):
      self._authorize()
    if not matched:
      raise self.server.ERROR(404, f"no such path: {self.path[:200]!r}")
    for route, params in matched:
      if route.method == self.command:
        return route.handler(self.server, Request(self, params))
    allowed = ", ".join(route.method for route, _ in matched)
    err = self.server.ERROR(405, f"{self.command[:20]!r} not allowed here; use {allowed}")
    err.headers["Allow"] = allowed
    raise err

  def _authorize(self) -> None:
    token = self.server.token
    if token and not bearer_matches(self.headers, token):
      err = self.server.ERROR(401, "a valid 'Authorization: Bearer <token>' header is required")
      err.headers["WWW-Authenticate"] = "Bearer"
      raise err

  def read_json(self) -> Dict[str, Any]:
    """The request's body as a JSON object (Request.json)."""
    error = self.server.ERROR
    header = self.headers.get("Content-Length")
    if header is None or not _DIGITS.fullmatch(header.strip()):
      self.close_connection = True  # where the next request starts is unknown (chunked?)
      if header is None:
        raise error(411, "a JSON body with a Content-Length header is required")
      raise error(400, f"bad Content-Length {header[:40]!r}")
    length = int(header)
    if length > self.server.max_body_bytes:
      raise error(413, f"a body of {length} bytes is over {self.server.max_body_bytes}")
    self._body_read = True
    try:
      body = self.rfile.read(length)
    except OSError as exc:  # a timeout: the client stopped sending
      self.close_connection = True
      raise error(408, f"reading the body failed: {exc}") from exc
    if len(body) < length:
      self.close_connection = True
      raise error(400, "the body is shorter than its Content-Length")
    try:
      value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 and huge ints are ValueErrors too
      raise error(400, f"the body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(value, dict):
      raise error(400, f"the body must be a JSON object, not {type(value).__name__}")
    return value

  def _answer(self, status: int, answer: Dict[str, Any], headers: Mapping[str, str] = ()) -> None:
    try:
      body = json.dumps(answer).encode("ascii")  # allow_nan: NaN and Infinity tokens
    except (TypeError, ValueError, RecursionError) as exc:
      error = self.server.ERROR(500, f"cannot encode the answer: {exc}")
      status, body = error.status, json.dumps(error.answer).encode("ascii")
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      for key, value in dict(headers).items():
        self.send_header(key, value)
      if self.close_connection:
        self.send_header("Connection", "close")
      self.end_headers()
      if self.command != "HEAD":
        self.wfile.write(body)
    except OSError as exc:  # the client left; nothing to answer
      self.close_connection = True
      logger.debug("answering %s failed: %r", getattr(self, "path", ""), exc)


class JsonServer(http_server.ThreadingHTTPServer):
  """A threaded HTTP server answering its declared `ROUTES` with JSON (see the module doc).

  Declarations (class attributes): ROUTES; ERROR, the HttpError class of its error answers;
  KEEP_ALIVE, HTTP/1.1 connections kept open between requests (else one request each);
  SERVER_VERSION, the Server header; URL_PATH, appended to `url` (the model server's "/v1").
  Settings (arguments): the address, the token ("" or None: none), max_body_bytes and
  request_timeout_s, the socket timeout that frees the thread of a client that stops sending
  (None: none).
  """

  ROUTES: Tuple[Route, ...] = ()
  ERROR = HttpError
  KEEP_ALIVE = False
  SERVER_VERSION = "ragen-jax/1"
  URL_PATH = ""

  daemon_threads = True  # a request stuck in a handler must not block shutdown
  # Rollouts open many connections at once; socketserver's backlog of 5 would refuse them.
  request_queue_size = 1024

  def __init__(
      self,
      host: str = "127.0.0.1",
      port: int = 0,
      *,
      token: Optional[str] = "",
      max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
      request_timeout_s: Optional[float] = DEFAULT_REQUEST_TIMEOUT_S,
  ):
    if max_body_bytes < 1:
      raise ValueError("max_body_bytes must be positive")
    self.token = token or ""  # non-empty: requests need `Authorization: Bearer <token>`
    self.max_body_bytes = max_body_bytes
    self.request_timeout_s = request_timeout_s
    self._thread: Optional[threading.Thread] = None
    if ":" in host:
      self.address_family = socket.AF_INET6
    super().__init__((host, port), _Handler)

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
    base = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
    return base + self.URL_PATH

  def start(self) -> threading.Thread:
    """Serves in a daemon thread; `close` stops it."""
    if self._thread is None:
      # A short poll interval: `close` (shutdown) waits up to one interval.
      self._thread = threading.Thread(
          target=self.serve_forever, args=(0.05,), name=f"http-{self.port}", daemon=True
      )
      self._thread.start()
    return self._thread

  def serve_until_interrupted(self) -> None:
    """A command's server: serves in this thread until Ctrl-C (KeyboardInterrupt), then closes."""
    try:
      self.serve_forever()
    except KeyboardInterrupt:
      pass
    finally:
      self.close()

  def close(self) -> None:
    """Stops serving (a `start` thread) and closes the socket (`server_close`)."""
    if self._thread is not None:
      self.shutdown()
      self._thread.join()
      self._thread = None
    self.server_close()

  def __exit__(self, *exc_info: Any) -> None:
    self.close()


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
  """`--token-env NAME` and `--token TOKEN`: the bearer token requests must carry."""
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
  if not token and args.host not in LOOPBACK:
    print(
        f"{parser.prog}: warning: {args.host} is reachable from other hosts and no token is "
        "set (--token-env): anyone who can reach it can use it",
        file=sys.stderr,
    )
  return token

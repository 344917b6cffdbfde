"""The HTTP side of ragen_jax.envs.serve: the request handler, its body parsing and JSON answers.

`Handler` routes one request to its server's episodes (`ragen_jax.envs.serve.server.EnvServer`:
create_episode, step_episode, delete_episode, num_episodes), reads and checks the JSON body, and
answers every outcome, errors included, with a JSON object. `HttpError` is an answer other than
200, raised by the handler or the server. The protocol and status codes: see server's module doc.
"""

import hmac
import json
import logging
import re
import socket
import time
from http import server as http_server
from typing import Any, Dict, Mapping, Optional

logger = logging.getLogger("ragen_jax.envs.serve")  # serve's one logger

_DIGITS = re.compile(r"[0-9]+")
# Oversized bodies up to this many times the limit are read and dropped after the 413, for at most
# _DISCARD_TIME_S; larger ones are cut off.
_MAX_DISCARD_FACTOR = 8
_DISCARD_TIME_S = 5.0


def bearer_matches(headers: Mapping[str, str], token: str) -> bool:
  """Whether a request's headers carry `Authorization: Bearer <token>` (compared in constant
  time): the one check of every server here that takes a token."""
  sent = headers.get("Authorization", "").encode("utf-8", "replace")
  return hmac.compare_digest(sent, f"Bearer {token}".encode("utf-8"))


class HttpError(Exception):
  """An answer other than 200, raised inside a request and answered by the handler."""

  def __init__(self, status: int, error: str, **extra: Any):
    super().__init__(error)
    self.status = status
    self.answer: Dict[str, Any] = {"error": error, **extra}
    self.headers: Dict[str, str] = {}


class Handler(http_server.BaseHTTPRequestHandler):
  """Routes one request; every answer, errors included, is a JSON object."""

  server: Any  # the server.EnvServer whose episodes it serves
  server_version = "ragen-jax-env/1"
  _discard = 0  # bytes of an unread body (413, 401) to drop after answering

  def setup(self) -> None:
    self.timeout = self.server.request_timeout_s  # socket timeout, set by StreamRequestHandler
    super().setup()

  def finish(self) -> None:
    super().finish()
    if 0 < self._discard <= _MAX_DISCARD_FACTOR * self.server.max_body_bytes:
      self._drop_body()

  def _drop_body(self) -> None:
    # A client still sending a moderately oversized body would get a connection reset instead
    # of the 413 if the socket closed with unread data; read and drop it (bounded in time).
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
    logger.debug("%s " + format, self.address_string(), *args)

  def do_GET(self) -> None:
    self._dispatch()

  def do_POST(self) -> None:
    self._dispatch()

  def do_DELETE(self) -> None:
    self._dispatch()

  def __getattr__(self, name: str) -> Any:
    # Any other method (PUT, HEAD, an invented one) gets 405 from the routes, not a 501.
    if name.startswith("do_"):
      return self._dispatch
    raise AttributeError(name)

  def send_error(self, code: int, message: Optional[str] = None, explain: Any = None) -> None:
    # http.server's own answers to malformed requests (bad request line, headers too long).
    self.log_error("code %d, message %s", code, message)
    self.close_connection = True
    default = self.responses.get(code, ("error",))[0]
    self._answer(code, {"error": message or default})

  def _dispatch(self) -> None:
    headers: Dict[str, str] = {}
    try:
      self._authorize()
      status, answer = 200, self._route()
    except HttpError as err:
      status, answer, headers = err.status, err.answer, err.headers
    except Exception as exc:  # a bug here: answer it and keep serving
      logger.exception("internal error on %s %s", self.command, self.path)
      status, answer = 500, {"error": f"internal server error: {type(exc).__name__}: {exc}"}
    self._answer(status, answer, headers)

  def _authorize(self) -> None:
    """With a server `token`, a request must carry `Authorization: Bearer <token>` (401)."""
    token = getattr(self.server, "token", "")
    if not token:
      return
    if bearer_matches(self.headers, token):
      return
    length = self.headers.get("Content-Length", "")
    if _DIGITS.fullmatch(length.strip()):  # its unread body: dropped after the answer
      self._discard = int(length)
    self.close_connection = True
    err = HttpError(401, "a valid 'Authorization: Bearer <token>' header is required")
    err.headers["WWW-Authenticate"] = "Bearer"
    raise err

  def _route(self) -> Dict[str, Any]:
    parts = self.path.split("?", 1)[0].split("/")
    if parts == ["", "health"]:
      self._allow("GET")
      return {"ok": True, "episodes": self.server.num_episodes}
    if parts == ["", "episodes"]:
      self._allow("POST")
      seed = self._field(self._read_json(), "seed", int)
      return self.server.create_episode(seed)
    if len(parts) == 3 and parts[1] == "episodes" and parts[2]:
      self._allow("DELETE")
      self.server.delete_episode(parts[2])
      return {"ok": True}
    if len(parts) == 4 and parts[1] == "episodes" and parts[2] and parts[3] == "step":
      self._allow("POST")
      action = self._field(self._read_json(), "action", str)
      return self.server.step_episode(parts[2], action)
    raise HttpError(404, f"no such path: {self.path[:200]!r}")

  def _allow(self, method: str) -> None:
    if self.command != method:
      err = HttpError(405, f"{self.command[:20]!r} not allowed here; use {method}")
      err.headers["Allow"] = method
      raise err

  def _read_json(self) -> Dict[str, Any]:
    header = self.headers.get("Content-Length")
    if header is None:
      raise HttpError(411, "a JSON body with a Content-Length header is required")
    if not _DIGITS.fullmatch(header.strip()):
      raise HttpError(400, f"bad Content-Length {header[:40]!r}")
    length = int(header)
    if length > self.server.max_body_bytes:
      self.close_connection = True  # the unread body must not be parsed as the next request
      self._discard = length
      raise HttpError(413, f"a body of {length} bytes is over {self.server.max_body_bytes}")
    try:
      body = self.rfile.read(length)
    except OSError as exc:  # a timeout: the client stopped sending
      self.close_connection = True
      raise HttpError(408, f"reading the body failed: {exc}") from exc
    if len(body) < length:
      self.close_connection = True
      raise HttpError(400, "the body is shorter than its Content-Length")
    try:
      value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 and huge ints are ValueErrors too
      raise HttpError(400, f"the body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(value, dict):
      raise HttpError(400, f"the body must be a JSON object, not {type(value).__name__}")
    return value

  @staticmethod
  def _field(body: Dict[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
      raise HttpError(400, f"{key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value

  def _answer(
      self, status: int, answer: Dict[str, Any], headers: Optional[Mapping[str, str]] = None
  ) -> None:
    try:
      body = json.dumps(answer).encode("ascii")  # allow_nan: NaN and Infinity tokens
    except (TypeError, ValueError, RecursionError) as exc:
      status, body = 500, json.dumps({"error": f"cannot encode the answer: {exc}"}).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      for key, value in (headers or {}).items():
        self.send_header(key, value)
      if self.close_connection:
        self.send_header("Connection", "close")
      self.end_headers()
      if self.command != "HEAD":
        self.wfile.write(body)
    except OSError as exc:  # the client left; nothing to answer
      self.close_connection = True
      logger.debug("answering %s failed: %r", self.path, exc)

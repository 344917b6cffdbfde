"""The OpenAI-compatible HTTP server of a policy (standard library only).

    server = ChatServer(batcher, model_name="tiny", port=0, token=None)
    server.start(); server.url  # http://127.0.0.1:PORT/v1

Routes: `POST /v1/chat/completions` (serving.requests for the fields), `GET /v1/models`,
`GET /health` (no token needed; says nothing but that the server is up and what it has done).
With a token every other route needs `Authorization: Bearer <token>` (401 otherwise). Every
answer is JSON; errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 bad
fields or a body that is not JSON, 401, 404 unknown model or route, 405, 413 body too large,
500 a failed sampler call (the server keeps serving). While a request waits for its reply the
handler watches its socket: a client that hangs up gets its job cancelled (`Batcher.cancel`).
"""

import json
import logging
import select
import socket
import threading
import time
import uuid
from http import server as http_server
from typing import Any, Dict, Optional

from ragen_jax.envs.serve import http as serve_http
from ragen_jax.serving import batcher as batcher_lib
from ragen_jax.serving import requests as requests_lib
from ragen_jax.serving.requests import ApiError

logger = logging.getLogger("ragen_jax.serve_model")
MAX_BODY_BYTES = 4 << 20
_POLL_S = 0.05  # how often a waiting handler checks whether its client hung up


def _hung_up(sock: socket.socket) -> bool:
  """True when the peer closed the connection (readable, and reading would return EOF)."""
  try:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
      return False
    return sock.recv(1, socket.MSG_PEEK) == b""
  except (OSError, ValueError):
    return True


class Handler(http_server.BaseHTTPRequestHandler):
  """Routes one request of a ChatServer."""

  server: "ChatServer"
  protocol_version = "HTTP/1.1"  # keep-alive: the openai client reuses its connections
  server_version = "ragen-jax-serve/1"

  def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
    logger.debug("%s " + format, self.address_string(), *args)  # never the headers (the token)

  def do_GET(self) -> None:
    self._dispatch("GET")

  def do_POST(self) -> None:
    self._dispatch("POST")

  def _dispatch(self, method: str) -> None:
    try:
      status, answer = 200, self._route(method)
    except ApiError as e:
      status, answer = e.status, e.body
    except Exception as e:  # a server bug fails this request only
      logger.exception("request failed")
      status, answer = 500, ApiError(500, f"internal error: {e}", kind="server_error").body
    if answer is not None:
      self._answer(status, answer)

  def _route(self, method: str) -> Optional[Dict[str, Any]]:
    path = self.path.split("?", 1)[0].rstrip("/")
    routes = {
        "/health": ("GET", self._health),
        "/v1/models": ("GET", self._models),
        "/v1/chat/completions": ("POST", self._chat),
    }
    if path not in routes:
      self._drain()
      raise ApiError(404, f"no route {path}", code="not_found")
    allowed, fn = routes[path]
    if method != allowed:
      self._drain()
      raise ApiError(405, f"{path} takes {allowed}", code="method_not_allowed")
    if path != "/health":
      self._authorize()
    return fn()

  def _drain(self) -> None:
    """Reads an unused body, so that a kept-alive connection stays in step."""
    try:
      length = int(self.headers.get("Content-Length") or 0)
    except ValueError:
      length = MAX_BODY_BYTES + 1  # unreadable: the connection closes after the answer
    if 0 < length <= MAX_BODY_BYTES:
      self.rfile.read(length)
    elif length:
      self.close_connection = True

  def _authorize(self) -> None:
    token = self.server.token
    if token is None:
      return
    if not serve_http.bearer_matches(self.headers, token):
      self._drain()
      raise ApiError(401, "missing or wrong bearer token", kind="authentication_error")

  def _health(self) -> Dict[str, Any]:
    b = self.server.batcher
    return {"status": "ok", "sampler_calls": b.sampler_calls, "queued": b.pending()}

  def _models(self) -> Dict[str, Any]:
    card = {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "ragen_jax"}
    return {"object": "list", "data": [card]}

  def _read_json(self) -> Any:
    try:
      length = int(self.headers.get("Content-Length") or -1)
    except ValueError:
      length = -1
    if length < 0:
      self.close_connection = True
      raise ApiError(411, "a Content-Length header is required")
    if length > MAX_BODY_BYTES:
      self.close_connection = True
      raise ApiError(413, f"the body has {length} bytes; the limit is {MAX_BODY_BYTES}")
    raw = self.rfile.read(length)
    try:
      return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ApiError(400, f"the body is not JSON: {e}") from None

  def _chat(self) -> Optional[Dict[str, Any]]:
    request = requests_lib.parse_chat(self._read_json(), self.server.limits)
    tok = self.server.batcher.tok
    try:
      prompt_ids = tok.encode(request.prompt(tok))
    except ValueError as e:
      raise ApiError(400, str(e), param="messages") from None
    job = self.server.batcher.submit(prompt_ids, request)
    while not job.done.wait(_POLL_S):
      if _hung_up(self.connection):
        self.server.batcher.cancel(job)
        self.close_connection = True
        return None
    if job.error is not None:
      if isinstance(job.error, ApiError):
        raise job.error
      raise ApiError(500, f"sampling failed: {job.error}", kind="server_error")
    choices, used = [], 0
    for i, row in enumerate(job.rows):
      text, count, finish = batcher_lib.finish_choice(tok, row, request.stop)
      used += count
      message = {"role": "assistant", "content": text}
      choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": self.server.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": used,
            "total_tokens": len(prompt_ids) + used,
        },
    }

  def _answer(self, status: int, answer: Dict[str, Any]) -> None:
    data = json.dumps(answer).encode("utf-8")
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      if status == 401:
        self.send_header("WWW-Authenticate", "Bearer")
      self.end_headers()
      self.wfile.write(data)
    except OSError:  # the client went away
      self.close_connection = True


class ChatServer(http_server.ThreadingHTTPServer):
  """The HTTP server: one thread per connection, one Batcher behind them all."""

  daemon_threads = True
  request_queue_size = 256  # the listen backlog: socketserver's 5 resets a burst of clients

  def __init__(
      self,
      batcher: batcher_lib.Batcher,
      model_name: str,
      host: str = "127.0.0.1",
      port: int = 0,
      token: Optional[str] = None,
      max_tokens: int = 256,
      max_n: int = 8,
  ):
    self.batcher = batcher
    self.model_name = model_name
    self.token = token or None
    self.limits = requests_lib.Limits(model_name, max_tokens, min(max_n, batcher.config.max_batch))
    self._thread: Optional[threading.Thread] = None
    super().__init__((host, port), Handler)

  @property
  def port(self) -> int:
    return self.server_address[1]

  @property
  def url(self) -> str:
    """The OpenAI base URL (what `openai.OpenAI(base_url=...)` takes)."""
    return f"http://{self.server_address[0]}:{self.port}/v1"

  def start(self) -> threading.Thread:
    """Serves in a background thread."""
    self._thread = threading.Thread(target=self.serve_forever, name="serve-http", daemon=True)
    self._thread.start()
    return self._thread

  def close(self) -> None:
    self.shutdown()
    self.server_close()
    self.batcher.close()

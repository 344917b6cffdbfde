"""The model server's routes: a policy behind OpenAI's chat-completions API.

    server = ChatServer(batcher, model_name="tiny", port=0, token=None)
    server.start(); server.url  # http://127.0.0.1:PORT/v1

Routes: `POST /v1/chat/completions` (model_server.requests for the fields), `GET /v1/models`,
`GET /health` (no token needed; says nothing but that the server is up and what it has done).
A declaration on ragen_jax.json_http, which checks the token (401), the body (411, 413, 400 not
JSON) and the routes (404, 405). Every answer is JSON; errors are OpenAI's `{"error": {"message",
"type", "param", "code"}}`: 400 bad fields, 404 an unknown model, 500 a failed sampler call (the
server keeps serving). Connections are kept alive (the openai client reuses them). While a
request waits for its reply the handler watches its socket: a client that hangs up gets its job
cancelled (`Batcher.cancel`).
"""

import time
import uuid
from typing import Any, Dict, Optional

from ragen_jax import json_http
from ragen_jax.model_server import batcher as batcher_lib
from ragen_jax.model_server import requests as requests_lib
from ragen_jax.model_server.requests import ApiError

MAX_BODY_BYTES = 4 << 20
_POLL_S = 0.05  # how often a waiting handler checks whether its client hung up


class ChatServer(json_http.JsonServer):
  """The model server: one thread per connection, one Batcher behind them all."""

  ERROR = ApiError
  KEEP_ALIVE = True
  SERVER_VERSION = "ragen-jax-model/1"
  URL_PATH = "/v1"  # the OpenAI base URL (what `openai.OpenAI(base_url=...)` takes)

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
    self.limits = requests_lib.Limits(model_name, max_tokens, min(max_n, batcher.config.max_batch))
    # No socket timeout: a kept-alive connection may idle between a client's requests.
    super().__init__(host, port, token=token, max_body_bytes=MAX_BODY_BYTES, request_timeout_s=None)

  def server_close(self) -> None:
    super().server_close()
    self.batcher.close()

  def _health(self, request: json_http.Request) -> Dict[str, Any]:
    del request
    return {
        "status": "ok",
        "sampler_calls": self.batcher.sampler_calls,
        "queued": self.batcher.pending(),
    }

  def _models(self, request: json_http.Request) -> Dict[str, Any]:
    del request
    card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "ragen_jax"}
    return {"object": "list", "data": [card]}

  def _chat(self, request: json_http.Request) -> Optional[Dict[str, Any]]:
    chat = requests_lib.parse_chat(request.json(), self.limits)
    tok = self.batcher.tok
    try:
      prompt_ids = tok.encode(chat.prompt(tok))
    except ValueError as e:
      raise ApiError(400, str(e), param="messages") from None
    job = self.batcher.submit(prompt_ids, chat)
    while not job.done.wait(_POLL_S):
      if request.hung_up():
        self.batcher.cancel(job)
        return None
    if job.error is not None:
      if isinstance(job.error, ApiError):
        raise job.error
      raise ApiError(500, f"sampling failed: {job.error}")
    choices, used = [], 0
    for i, row in enumerate(job.rows):
      text, count, finish = batcher_lib.finish_choice(tok, row, chat.stop)
      used += count
      message = {"role": "assistant", "content": text}
      choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": self.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": used,
            "total_tokens": len(prompt_ids) + used,
        },
    }

  ROUTES = (
      json_http.Route("GET", "/health", _health, public=True),
      json_http.Route("GET", "/v1/models", _models),
      json_http.Route("POST", "/v1/chat/completions", _chat),
  )

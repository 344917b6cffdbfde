"""The chat-completions request of the model server: parsed and checked before any work.

`parse_chat(body, limits)` turns a decoded JSON body into a `ChatRequest` or raises `ApiError`
(an HTTP status and an OpenAI-style error object naming the field). Fields: model, messages,
max_tokens (or max_completion_tokens), temperature, top_p, stop, n, seed, and vLLM's
`continue_final_message` (the reply continues the last, assistant, message instead of opening a
new one: a generation prefix); `stream` is refused; other OpenAI fields (user, metadata, ...) are
accepted and ignored.
"""

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

from ragen_jax import json_http

ROLES = ("system", "user", "assistant", "tool")
MAX_STOPS = 4  # OpenAI's own limit on stop strings


class ApiError(json_http.HttpError):
  """An answer other than 200 in OpenAI's form, {"error": {"message", "type", "param", "code"}}
  (`body`). The type defaults by status: authentication_error (401), server_error (5xx), else
  invalid_request_error."""

  def __init__(
      self,
      status: int,
      message: str,
      param: Optional[str] = None,
      code: Optional[str] = None,
      kind: Optional[str] = None,
  ):
    super().__init__(status, message)
    if kind is None:
      kind = "invalid_request_error" if status < 500 else "server_error"
      kind = "authentication_error" if status == 401 else kind
    self.answer = {"error": {"message": message, "type": kind, "param": param, "code": code}}

  @property
  def body(self) -> Dict[str, Any]:
    return self.answer


@dataclasses.dataclass(frozen=True)
class Limits:
  """What the server accepts.

  Attributes:
    model: the served model's name (`model` must equal it).
    max_tokens: the most tokens one choice may ask for (and the default).
    max_n: the most choices per request.
  """

  model: str
  max_tokens: int = 256
  max_n: int = 8


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A checked request. `messages` are (role, content) pairs of text."""

  messages: Tuple[Tuple[str, str], ...]
  max_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  stop: Tuple[str, ...] = ()
  n: int = 1
  seed: Optional[int] = None
  continue_final: bool = False  # the reply continues messages[-1] (an assistant message)

  def prompt(self, tok) -> str:
    """The prompt text in `tok`'s chat template (ValueError: a message it cannot render)."""
    chat = [{"role": role, "content": content} for role, content in self.messages]
    if self.continue_final:
      return tok.apply_chat_template(chat[:-1], add_generation_prompt=True) + chat[-1]["content"]
    return tok.apply_chat_template(chat, add_generation_prompt=True)


def _bad(message: str, param: str) -> ApiError:
  return ApiError(400, message, param=param)


def _number(body, key: str, default: float, low: float, high: float, open_low=False) -> float:
  value = body.get(key)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise _bad(f"{key} must be a finite number, got {value!r}", key)
  if value < low or value > high or (open_low and value == low):
    lo = "(" if open_low else "["
    raise _bad(f"{key} must be in {lo}{low}, {high}], got {value!r}", key)
  return float(value)


def _int(body, key: str, default: Optional[int], low: int, high: int) -> Optional[int]:
  value = body.get(key)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, int):
    raise _bad(f"{key} must be an integer, got {value!r}", key)
  if not low <= value <= high:
    raise _bad(f"{key} must be in [{low}, {high}], got {value}", key)
  return value


def _content(message: Dict[str, Any], i: int) -> str:
  content = message.get("content")
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # the array form: text parts only
    texts = []
    for part in content:
      if not isinstance(part, dict) or part.get("type") != "text":
        raise _bad(f"messages[{i}].content: only text parts are supported", "messages")
      if not isinstance(part.get("text"), str):
        raise _bad(f"messages[{i}].content: a text part needs a string 'text'", "messages")
      texts.append(part["text"])
    return "".join(texts)
  raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _messages(body) -> Tuple[Tuple[str, str], ...]:
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise _bad("messages must be a non-empty list", "messages")
  out = []
  for i, message in enumerate(messages):
    if not isinstance(message, dict):
      raise _bad(f"messages[{i}] must be an object", "messages")
    role = message.get("role")
    if role == "developer":  # OpenAI's newer name for the system role
      role = "system"
    if role not in ROLES:
      raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
    if message.get("tool_calls"):
      raise _bad(f"messages[{i}]: tool calls are not supported", "messages")
    out.append((role, _content(message, i)))
  return tuple(out)


def _stop(body) -> Tuple[str, ...]:
  stop = body.get("stop")
  if stop is None:
    return ()
  stops = [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
    raise _bad("stop must be a non-empty string or a list of them", "stop")
  if len(stops) > MAX_STOPS:
    raise _bad(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
  return tuple(stops)


def parse_chat(body: Any, limits: Limits) -> ChatRequest:
  """The checked request of a decoded JSON body; ApiError (400 or 404) naming what is wrong."""
  if not isinstance(body, dict):
    raise ApiError(400, "the request body must be a JSON object")
  model = body.get("model")
  if not isinstance(model, str):
    raise _bad("model must be a string", "model")
  if model != limits.model:
    raise ApiError(
        404,
        f"model {model!r} does not exist; this server serves {limits.model!r}",
        param="model",
        code="model_not_found",
    )
  if body.get("stream"):
    raise _bad("stream is not supported", "stream")
  key = "max_completion_tokens" if body.get("max_tokens") is None else "max_tokens"
  messages = _messages(body)
  continue_final = body.get("continue_final_message") or False
  if not isinstance(continue_final, bool):
    raise _bad("continue_final_message must be a boolean", "continue_final_message")
  if continue_final and messages[-1][0] != "assistant":
    raise _bad("continue_final_message needs an assistant message last", "continue_final_message")
  return ChatRequest(
      messages=messages,
      max_tokens=_int(body, key, limits.max_tokens, 1, limits.max_tokens),
      temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
      stop=_stop(body),
      n=_int(body, "n", 1, 1, limits.max_n),
      seed=_int(body, "seed", None, -(2**63), 2**63 - 1),
      continue_final=continue_final,
  )

"""Any OpenAI-compatible chat endpoint as the policy of a rollout (evaluation, not training).

    client = ApiClient(ApiConfig(base_url="http://127.0.0.1:8000/v1", model="m",
                                 key_env="OPENAI_API_KEY"))
    engine.run(ApiPolicy(client), key, seed)   # rollout.Rollout plays the batch through it

Each turn every active episode's conversation (its chat messages; in a context-window mode the
system message and the last k turns, without the environment's memory text) is sent as one
`POST {base_url}/chat/completions`, up to `concurrency` at a time, with max_tokens the rollout's
`max_new_tokens`, its temperature (0 with `api.greedy`) and top_p, and stop "</answer>" (the
in-process sampler's stop sequence; endpoints drop it from the text, so it is put back when the
reply's last <answer> is open). The reply text after the generation prefix ("<think>") is
tokenised with the rollout's tokenizer and recorded as sampled tokens with log-prob 0, as a
scripted reply is. With `api.prefill` the request ends with that prefix as an open assistant
message (`continue_final_message`, which ragen_jax.serve_model and vLLM honour), so the endpoint
continues the exact prompt the in-process sampler sees.

Failures: a connection error, a timeout, 429 or 5xx is retried `retries` times, waiting
`backoff_s` doubling each time (or the server's Retry-After, capped at `timeout_s`); other 4xx
answers are not retried. An episode whose turn still has no reply ends as an environment fault
does (`env_error` "api: ...", counted, never a crash). The key is read from the environment
variable `key_env` names and sent as a bearer token; it never appears in a config or log.
Usage (`ApiClient.usage`): the endpoint's own prompt and completion token counts, requests and
failed turns.
"""

import concurrent.futures
import dataclasses
import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Tuple

import numpy as np

from ragen_jax.config_checks import check_fields, NonNegativeInt, PositiveFloat, PositiveInt
from ragen_jax.envs.host.records import EnvFault
from ragen_jax.rollout import prompts
from ragen_jax.rollout.policies import Replies, Rows, TurnInputs
from ragen_jax.tokenizers import base as tok_base

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclasses.dataclass(frozen=True)
class ApiConfig:
  """The `api` config section: an endpoint that answers instead of the model (evaluate)."""

  base_url: str | None = None  # OpenAI-compatible base URL (".../v1"); None: the model answers
  model: str = ""  # the endpoint's model name
  key_env: str | None = None  # NAME of the environment variable holding the key (none: no key)
  concurrency: PositiveInt = 8  # requests in flight at once
  timeout_s: PositiveFloat = 120.0  # per request
  retries: NonNegativeInt = 4  # after the first try (connection errors, timeouts, 429, 5xx)
  backoff_s: PositiveFloat = 1.0  # first wait before a retry; doubles each time
  greedy: bool = False  # temperature 0 instead of the rollout's (validation) temperature
  prefill: bool = False  # send the generation prefix as an open assistant message

  def __post_init__(self):
    check_fields(self, "api")
    if self.base_url is not None:
      if not self.base_url.startswith(("http://", "https://")):
        raise ValueError(f"api.base_url must be an http(s) URL, got {self.base_url!r}")
      if not self.model:
        raise ValueError("api.model must name the endpoint's model when api.base_url is set")
    if self.key_env is not None and not self.key_env.replace("_", "").isalnum():
      raise ValueError(f"api.key_env must be an environment variable's NAME, got {self.key_env!r}")


class ApiFailure(Exception):
  """No reply after the retries (or an answer that is not retried)."""


_RETRIED_STATUS = (408, 409, 429, 500, 502, 503, 504)


class ApiClient:
  """The endpoint of an ApiConfig: its key, its connection pool and usage counters."""

  def __init__(self, config: ApiConfig):
    if config.base_url is None:
      raise ValueError("api.base_url is not set")
    self.config = config
    self._key = None
    if config.key_env is not None:
      self._key = os.environ.get(config.key_env)
      if not self._key:
        raise ValueError(f"api.key_env names ${config.key_env}, which is not set")
    self.pool = concurrent.futures.ThreadPoolExecutor(config.concurrency, "api-policy")
    self._lock = threading.Lock()
    self.usage = dict(prompt_tokens=0, completion_tokens=0, requests=0, failed_turns=0)

  def close(self) -> None:
    self.pool.shutdown(wait=False, cancel_futures=True)

  def chat(self, body: Dict[str, Any]) -> Tuple[str, str]:
    """(reply text, finish_reason) of one chat request, retried within the bounds."""
    c = self.config
    data = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if self._key:
      headers["Authorization"] = f"Bearer {self._key}"
    url = c.base_url.rstrip("/") + "/chat/completions"
    error = "no attempt"
    for attempt in range(c.retries + 1):
      wait = c.backoff_s * 2**attempt
      try:
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=c.timeout_s) as answer:
          reply = json.loads(answer.read().decode("utf-8"))
        return self._read(reply)
      except urllib.error.HTTPError as e:
        error = f"HTTP {e.code} from {url}: {_error_message(e)}"
        if e.code not in _RETRIED_STATUS:
          break
        wait = _retry_after(e, wait, c.timeout_s)
      except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        error = f"{type(e).__name__} from {url}: {e}"  # refused, cut off or timed out
      except (ValueError, LookupError, TypeError, AttributeError) as e:
        error = f"not a chat completion from {url}: {type(e).__name__} {e}"
      if attempt < c.retries:
        time.sleep(wait)
    raise ApiFailure(error)

  def _read(self, reply: Dict[str, Any]) -> Tuple[str, str]:
    choice = reply["choices"][0]
    text = choice["message"]["content"] or ""
    if not isinstance(text, str):
      raise TypeError("the reply's content is not a string")
    usage = reply.get("usage") or {}
    with self._lock:
      self.usage["requests"] += 1
      for name in ("prompt_tokens", "completion_tokens"):
        self.usage[name] += int(usage.get(name) or 0)
    return text, choice.get("finish_reason") or ""

  def count_failure(self) -> None:
    """Counts a turn without a reply (the engine logs the first fault of each kind)."""
    with self._lock:
      self.usage["failed_turns"] += 1


def _error_message(e: urllib.error.HTTPError) -> str:
  try:
    body = json.loads(e.read().decode("utf-8"))
    return str(body["error"]["message"] if isinstance(body.get("error"), dict) else body)[:300]
  except Exception:
    return e.reason if isinstance(e.reason, str) else "no message"


def _retry_after(e: urllib.error.HTTPError, default: float, cap: float) -> float:
  try:
    return min(max(float(e.headers.get("Retry-After")), 0.0), cap)
  except (TypeError, ValueError):
    return default


class ApiPolicy:
  """The endpoint of an ApiClient answers every turn (see the module doc); every process plays
  the whole batch, as with a scripted policy."""

  def __init__(self, client: ApiClient):
    self.client = client

  def start(self, engine) -> "ApiTurns":
    rows = Rows.whole(engine.batch_size)
    return ApiTurns(self.client, engine.tok, engine.config, engine.layout, rows)


class ApiTurns:
  """The endpoint's play of one batch: a request per active episode and turn."""

  def __init__(self, client: ApiClient, tokenizer, rollout_config, layout, rows: Rows):
    self.client, self.tok, self.rc = client, tokenizer, rollout_config
    self.layout, self.rows = layout, rows

  def messages(self, ep) -> List[Dict[str, str]]:
    """What the endpoint sees of the episode before its next reply (its context layout's
    messages; a window's without the memory text)."""
    out = []
    for m in self.layout.shown_messages(ep):
      content = m["content"]
      if m["role"] == "assistant":  # a sampled end-of-turn marker is the template's to add
        content = content.removesuffix(tok_base.IM_END)
      out.append({"role": m["role"], "content": content})
    if self.client.config.prefill:
      out.append({"role": "assistant", "content": prompts.generation_prefix(self.rc.enable_think)})
    return out

  def body(self, ep) -> Dict[str, Any]:
    c = self.client.config
    body = {
        "model": c.model,
        "messages": self.messages(ep),
        "max_tokens": self.rc.max_new_tokens,
        "temperature": 0.0 if c.greedy else self.rc.temperature,
        "top_p": self.rc.top_p,
        "stop": [ANSWER_CLOSE],
    }
    if c.prefill:
      body.update(add_generation_prompt=False, continue_final_message=True)
    return body

  def reply_text(self, text: str, finish_reason: str) -> str:
    """The reply after the generation prefix, with a stop-string "</answer>" put back."""
    prefix = prompts.generation_prefix(self.rc.enable_think)
    if not self.client.config.prefill:
      text = text.lstrip().removeprefix(prefix)
    if finish_reason == "stop" and text.rfind(ANSWER_OPEN) > text.rfind(ANSWER_CLOSE):
      text += ANSWER_CLOSE
    return text

  def respond(self, inputs: TurnInputs) -> Replies:
    active = [int(i) for i in np.flatnonzero(inputs.active_B)]
    futures = {
        i: self.client.pool.submit(self.client.chat, self.body(inputs.episodes[i])) for i in active
    }
    replies, faults = {}, {}
    for i, future in futures.items():
      try:
        replies[i] = self.tok.encode(self.reply_text(*future.result()))
      except ApiFailure as e:
        self.client.count_failure()
        faults[i] = EnvFault("api", str(e))
    return Replies.of_host(replies, len(inputs.active_B), self.tok.pad_id, faults)

"""A text environment played over HTTP from a `python -m ragen_jax.envs.serve` server.

  env = HttpEnv("http://127.0.0.1:8000", timeout_s=60.0, token_env="ENV_TOKEN")
  observation = env.reset(seed=3)    # a new episode on the server (the previous one closed)
  env.instruction, env.action_names, env.max_actions_per_turn   # as the served env set them
  observation, reward, done, info = env.step("answer text")      # sent verbatim
  env.close()                        # deletes the episode; errors swallowed (server gone)

One HttpEnv plays one episode at a time, like any TextEnv; make one per concurrent episode.
The protocol is in ragen_jax.envs.serve.server. Failures raise:
  RuntimeError     the server answered an error: the environment raised (the message names
                   its exception type and message), a 4xx, or an answer that is not the protocol's
  TimeoutError     no answer within timeout_s (per connect and per read, not per request)
  ConnectionError  the server is unreachable or hung up (stopped mid-episode)
The rollout turns any of them into an environment error for that episode. `token_env` names an
environment variable holding the server's bearer token (`--token-env`/`--token`); every request
sends it as `Authorization: Bearer <token>`; a named variable that is unset is a ValueError here.
A URL may carry a path prefix (a server behind a proxy: http://host/envs/sokoban). Non-finite
rewards come back as
float('nan') / inf (json reads the NaN and Infinity tokens the server writes); values are not
checked or converted here, that is the rollout's job.
"""

import http.client
import json
import logging
import operator
import os
import urllib.parse
from typing import Any, Dict, Optional

from ragen_jax.envs import text

logger = logging.getLogger(__name__)


class HttpEnv(text.TextEnv):
  """A TextEnv whose episodes live on an environment server; see the module doc."""

  def __init__(self, url: str, timeout_s: float = 60.0, token_env: str = ""):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
      raise ValueError(f"expected an http(s)://host:port URL, got {url!r}")
    if timeout_s <= 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    self._token = os.environ.get(token_env, "") if token_env else ""
    if token_env and not self._token:
      raise ValueError(f"token_env: the environment variable {token_env!r} is unset or empty")
    self.url = url.rstrip("/")
    self.timeout_s = float(timeout_s)
    self._connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    self._netloc = parts.netloc
    self._prefix = parts.path.rstrip("/")
    self._episode: Optional[str] = None
    self.instruction = ""
    self.action_names = None
    self.max_actions_per_turn = None

  def reset(self, seed: int) -> str:
    self.close()
    answer = self._request("POST", "/episodes", {"seed": operator.index(seed)})
    episode = answer.get("episode")
    if not isinstance(episode, str) or "observation" not in answer:
      raise RuntimeError(f"{self.url}: malformed answer to POST /episodes: {str(answer)[:200]}")
    self._episode = episode
    self.instruction = answer.get("instruction") or ""
    names = answer.get("action_names")
    self.action_names = None if names is None else list(names)
    self.max_actions_per_turn = answer.get("max_actions_per_turn")
    return answer["observation"]

  def step(self, action: str) -> text.StepOutput:
    if self._episode is None:
      raise RuntimeError("HttpEnv.step before reset (or after close)")
    path = f"/episodes/{self._episode}/step"
    answer = self._request("POST", path, {"action": action})
    try:
      return answer["observation"], answer["reward"], answer["done"], answer["info"]
    except KeyError as exc:
      raise RuntimeError(f"{self.url}: answer to POST {path} lacks {exc}") from exc

  def close(self) -> None:
    episode, self._episode = self._episode, None
    if episode is None:
      return
    try:
      self._request("DELETE", f"/episodes/{episode}")
    except Exception as exc:  # the server may be gone; the episode is over either way
      logger.debug("closing episode %s at %s failed: %r", episode, self.url, exc)

  def _request(self, method: str, path: str, payload: Any = None) -> Dict[str, Any]:
    body = None if payload is None else json.dumps(payload).encode("ascii")
    headers = {} if body is None else {"Content-Type": "application/json"}
    if self._token:
      headers["Authorization"] = f"Bearer {self._token}"
    # A connection per request: nothing stale to reuse after a server restart, and never a
    # step sent twice by a retry on a reused connection.
    connection = self._connection_class(self._netloc, timeout=self.timeout_s)
    where = f"{method} {self.url}{path}"
    try:
      connection.request(method, self._prefix + path, body=body, headers=headers)
      response = connection.getresponse()
      status, raw = response.status, response.read()
    except TimeoutError as exc:
      raise TimeoutError(f"{where}: no answer within {self.timeout_s} s") from exc
    except (OSError, http.client.HTTPException) as exc:
      raise ConnectionError(f"{where}: {type(exc).__name__}: {exc}") from exc
    finally:
      connection.close()
    try:
      answer = json.loads(raw)
    except ValueError:
      answer = None
    if status != 200:
      error = answer.get("error") if isinstance(answer, dict) else None
      detail = error if error is not None else raw[:200].decode("utf-8", "replace")
      raise RuntimeError(f"{where}: HTTP {status}: {detail}")
    if not isinstance(answer, dict):
      raise RuntimeError(f"{where}: the answer is not a JSON object: {raw[:200]!r}")
    return answer

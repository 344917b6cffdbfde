"""Text environments served over HTTP (ragen_jax.envs.serve) and played with HttpEnv.

Everything runs on 127.0.0.1: servers in background threads on free ports (port 0). The command
line is tests/envs_serve_command_test.py's.
"""

import contextlib
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse

import hypothesis
from hypothesis import strategies as st
import pytest

from ragen_jax.envs import text
from ragen_jax.envs.serve import server as env_server
from ragen_jax.envs.serve.client import HttpEnv
import text_env_fixtures as fixtures

TIMEOUT_S = 30.0  # generous: a loaded 2-core machine


@contextlib.contextmanager
def _served(factory, options=None, **server_options):
  server = env_server.serve(factory, "127.0.0.1", 0, options, background=True, **server_options)
  try:
    yield server
  finally:
    server.close()


@pytest.fixture(name="guess_url", scope="module")
def _guess_url():
  with _served(fixtures.GuessNumber, {"low": 1, "high": 30}) as server:
    yield server.url


def _call(url, method, path, body=None, headers=None):
  """(status, JSON answer or None, response headers) of one raw request."""
  connection = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=TIMEOUT_S)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    raw = response.read()
    return response.status, (json.loads(raw) if raw else None), dict(response.getheaders())
  finally:
    connection.close()


def _healthy(url):
  status, answer, _ = _call(url, "GET", "/health")
  assert status == 200 and answer["ok"] is True, answer
  return answer["episodes"]


def _play(env, seed, actions):
  trace = [env.reset(seed)]
  trace.append((env.instruction, env.action_names and list(env.action_names)))
  trace.append(env.max_actions_per_turn)
  for action in actions:
    trace.append(env.step(action))
  return trace


# Same episodes served as in process.

WEIRD_ACTIONS = ["", " 12 ", "é漢字🙂", '\x00\n\t"\\', "\ud800", "15", "NaN", '{"a": 1}', "7"]


@pytest.mark.parametrize("seed", [0, 1, 7, 123, -5, 2**70])
def test_served_guessing_equals_in_process(guess_url, seed):
  for actions in (["10", "20", "x", "25", "3", "30"], WEIRD_ACTIONS):
    local = _play(fixtures.GuessNumber(low=1, high=30), seed, actions)
    remote_env = HttpEnv(guess_url, timeout_s=TIMEOUT_S)
    assert _play(remote_env, seed, actions) == local
    remote_env.close()


def test_served_vocabulary_env_equals_in_process():
  with _served(fixtures.Counter, {"limit": 2}) as server:
    for seed in range(3):
      actions = ["inc", "dec", "inc", "inc", "stop"]
      remote = _play(HttpEnv(server.url), seed, actions)
      assert remote == _play(fixtures.Counter(limit=2), seed, actions)
      assert remote[1] == ("Reach the limit by counting up.", ["inc", "dec", "stop"])
      assert remote[2] == 2


@hypothesis.settings(max_examples=25)
@hypothesis.given(seed=st.integers(-(2**64), 2**64), actions=st.lists(st.text(), max_size=6))
def test_arbitrary_answers_go_through_verbatim(guess_url, seed, actions):
  remote_env = HttpEnv(guess_url, timeout_s=TIMEOUT_S)
  try:
    remote = _play(remote_env, seed, actions)
  finally:
    remote_env.close()
  assert remote == _play(fixtures.GuessNumber(low=1, high=30), seed, actions)
  for action, (_, _, _, info) in zip(actions, remote[3:]):
    assert info["echo"] == action


def test_reset_closes_the_previous_episode_and_close_is_idempotent():
  with _served(fixtures.Counter) as server:
    env = HttpEnv(server.url + "/")
    env.reset(0)
    env.reset(1)
    assert _healthy(server.url) == 1
    env.close()
    env.close()
    assert _healthy(server.url) == 0
    with pytest.raises(RuntimeError, match="before reset"):
      env.step("inc")


# Failures of the environment, the server and the network.


def test_environment_exceptions_become_runtime_errors_and_the_server_goes_on():
  with _served(fixtures.Faulty) as server:
    env = HttpEnv(server.url, timeout_s=TIMEOUT_S)
    assert env.reset(0) == "ready"
    assert env.step("fine") == ("ok fine", 0.0, False, {})
    with pytest.raises(RuntimeError, match=r"HTTP 500: step raised ValueError: boom on 'explode'"):
      env.step("explode")
    assert env.step("again") == ("ok again", 0.0, False, {})  # the episode is still there
    with pytest.raises(RuntimeError, match="reset raised KeyError: 'unlucky seed'"):
      HttpEnv(server.url).reset(13)
    status, answer, _ = _call(server.url, "POST", "/episodes", b'{"seed": 13}')
    assert status == 500 and answer["exception"] == "KeyError", answer
    other = HttpEnv(server.url)
    assert other.reset(1) == "ready" and other.step("x")[0] == "ok x"
    assert _healthy(server.url) == 2
  with _served(fixtures.Counter, {"no_such_option": 1}) as server:
    with pytest.raises(RuntimeError, match="factory raised TypeError"):
      HttpEnv(server.url).reset(0)
    assert _healthy(server.url) == 0


def test_a_stopped_server_makes_the_next_step_raise_promptly():
  server = env_server.serve(fixtures.Counter, background=True)
  env = HttpEnv(server.url, timeout_s=TIMEOUT_S)
  env.reset(0)
  env.step("inc")
  server.close()
  start = time.monotonic()
  with pytest.raises(ConnectionError):
    env.step("inc")
  assert time.monotonic() - start < 5.0
  env.close()  # swallowed: the server is gone


class _Blocking(text.TextEnv):
  """Steps wait for `release` (a stuck environment or a hung server)."""

  release = threading.Event()

  def reset(self, seed):
    return "waiting"

  def step(self, action):
    if action == "block":
      self.release.wait(TIMEOUT_S)
    return "released", 0.0, False, {}


def test_an_unanswered_step_times_out_instead_of_hanging():
  _Blocking.release.clear()
  with _served(_Blocking) as server:
    env = HttpEnv(server.url, timeout_s=0.5)
    env.reset(0)
    start = time.monotonic()
    try:
      with pytest.raises(TimeoutError, match="no answer within 0.5 s"):
        env.step("block")
      assert time.monotonic() - start < 5.0
    finally:
      _Blocking.release.set()
    assert env.step("go") == ("released", 0.0, False, {})


def test_non_finite_rewards_and_odd_values_pass_through():
  with _served(fixtures.Odd) as server:
    for seed, check in enumerate(
        [math.isnan, lambda r: r == math.inf, lambda r: r == -math.inf, lambda r: r == 0.25]
    ):
      env = HttpEnv(server.url)
      observation = env.reset(seed)
      assert observation == fixtures.Odd.OBSERVATIONS[seed]
      observation, reward, done, info = env.step("a")
      assert observation == fixtures.Odd.OBSERVATIONS[seed]
      assert isinstance(reward, float) and check(reward), reward
      assert done is True
      assert math.isnan(info.pop("nan"))
      assert info == {"np_bool": True, "arr": [0, 1, 2], "5": "int key"}
      env.close()


# Concurrency and the episode cap.


class _Concurrency(text.TextEnv):
  """ "meet" waits for a step of another episode; "alone" fails if its episode is re-entered."""

  meeting = threading.Barrier(2, timeout=TIMEOUT_S)

  def __init__(self):
    self.busy = False

  def reset(self, seed):
    return "start"

  def step(self, action):
    if action == "meet":
      self.meeting.wait()  # only passes if two episodes step at once
    elif action == "alone":
      assert not self.busy, "two steps of one episode interleaved"
      self.busy = True
      time.sleep(0.02)
      self.busy = False
    return action, 0.0, False, {}


def _in_threads(*calls):
  errors = []

  def run(call):
    try:
      call()
    except Exception as exc:  # reported by the test
      errors.append(exc)

  threads = [threading.Thread(target=run, args=(call,)) for call in calls]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(2 * TIMEOUT_S)
  assert not any(t.is_alive() for t in threads), f"a call still runs after {2 * TIMEOUT_S} s"
  return errors


def test_episodes_step_concurrently_and_one_episode_never_interleaves():
  with _served(_Concurrency) as server:
    first, second = HttpEnv(server.url), HttpEnv(server.url)
    first.reset(0)
    second.reset(0)
    assert not _in_threads(lambda: first.step("meet"), lambda: second.step("meet"))

    def steps():
      for _ in range(5):
        first.step("alone")  # the same episode from two threads

    assert not _in_threads(steps, steps)


class _Closes(fixtures.Counter):
  closed = []

  def close(self):
    self.closed.append(self.value)


def test_the_least_recently_used_idle_episode_is_closed_beyond_the_cap():
  _Closes.closed.clear()
  with _served(_Closes, max_episodes=2) as server:
    envs = [HttpEnv(server.url) for _ in range(3)]
    envs[0].reset(0)
    envs[1].reset(1)
    envs[0].step("inc")  # envs[1] is now the least recently used
    envs[2].reset(0)
    assert _healthy(server.url) == 2 and _Closes.closed == [1]
    with pytest.raises(RuntimeError, match="HTTP 404"):
      envs[1].step("inc")
    assert envs[0].step("inc")[0] == "value 2"
  assert sorted(_Closes.closed) == [0, 1, 2]  # closing the server closes the rest


def _busy_episode_locked(server):
  return any(episode.lock.locked() for episode in list(server._episodes.values()))


def test_a_new_episode_is_refused_when_every_episode_is_busy():
  _Blocking.release.clear()
  with _served(_Blocking, max_episodes=1) as server:
    busy = HttpEnv(server.url)
    busy.reset(0)
    stepping = threading.Thread(target=busy.step, args=("block",))
    stepping.start()
    try:
      deadline = time.monotonic() + TIMEOUT_S
      while not _busy_episode_locked(server) and time.monotonic() < deadline:
        time.sleep(0.01)
      with pytest.raises(RuntimeError, match="HTTP 503"):
        HttpEnv(server.url).reset(1)
    finally:
      _Blocking.release.set()
      stepping.join(TIMEOUT_S)
    assert not stepping.is_alive(), f"the released step still runs after {TIMEOUT_S} s"
    assert _healthy(server.url) == 1


# Malformed requests and fuzzing.


def test_malformed_requests_get_4xx_and_the_server_goes_on(guess_url):
  status, answer, _ = _call(guess_url, "POST", "/episodes", b'{"seed": 3}')
  assert status == 200
  step = f"/episodes/{answer['episode']}/step"
  unknown = "/episodes/" + "0" * 32
  cases = [
      ("POST", "/episodes", b"{not json", 400),
      ("POST", "/episodes", b"\xff\xfe\x00garbage", 400),
      ("POST", "/episodes", b"[1, 2]", 400),
      ("POST", "/episodes", b"{}", 400),
      ("POST", "/episodes", b'{"seed": "3"}', 400),
      ("POST", "/episodes", b'{"seed": 3.0}', 400),
      ("POST", "/episodes", b'{"seed": true}', 400),
      ("POST", "/episodes", b'{"seed": NaN}', 400),
      ("POST", "/episodes", b"[" * 100_000, 400),
      ("POST", "/episodes", b'{"seed": 1' + b"0" * 5000 + b"}", 400),
      ("POST", step, b'{"action": 3}', 400),
      ("POST", step, b'{"action": null}', 400),
      ("POST", step, b'{"act": "3"}', 400),
      ("POST", step, b"", 400),
      ("POST", unknown + "/step", b'{"action": "3"}', 404),
      ("DELETE", unknown, None, 404),
      ("GET", "/nope", None, 404),
      ("GET", "/episodes/x/step/more", None, 404),
      ("GET", "/", None, 404),
      ("GET", "/episodes", None, 405),
      ("POST", "/health", b"{}", 405),
      ("PUT", step, b'{"action": "3"}', 405),
      ("BREW", "/health", None, 405),
  ]
  for method, path, body, expected in cases:
    status, answer, headers = _call(guess_url, method, path, body)
    assert status == expected, (method, path, body[:40] if body else body, answer)
    assert isinstance(answer["error"], str) and answer["error"]
    if status == 405:
      assert headers["Allow"] in ("GET", "POST", "DELETE")
    _healthy(guess_url)
  assert _call(guess_url, "POST", step, b'{"action": "3", "extra": 1}')[0] == 200


def _raw_exchange(url, data):
  """Sends raw bytes and half-closes (no more to come), returns the raw answer."""
  parts = urllib.parse.urlsplit(url)
  with socket.create_connection((parts.hostname, parts.port), timeout=TIMEOUT_S) as sock:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    chunks = []
    while chunk := sock.recv(65536):
      chunks.append(chunk)
  return b"".join(chunks)


def test_oversized_missing_length_and_broken_requests(guess_url):
  # 413 from the header alone: the body is never sent, nor read.
  answer = _raw_exchange(
      guess_url, b"POST /episodes HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n"
  )
  assert answer.startswith(b"HTTP/1.0 413 "), answer[:100]
  assert b'"error"' in answer
  answer = _raw_exchange(guess_url, b"POST /episodes HTTP/1.1\r\nHost: x\r\n\r\n")
  assert answer.startswith(b"HTTP/1.0 411 "), answer[:100]
  answer = _raw_exchange(guess_url, b"POST /episodes HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
  assert answer.startswith(b"HTTP/1.0 400 "), answer[:100]
  # http.server answers a bad request line as HTTP/0.9 would: the JSON body alone.
  answer = _raw_exchange(guess_url, b"\x00\xff garbage line\r\n\r\n")
  assert b'{"error": "Bad request version' in answer, answer[:100]
  # A body shorter than its Content-Length: the client stops sending.
  answer = _raw_exchange(guess_url, b"POST /episodes HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
  assert answer.startswith(b"HTTP/1.0 400 "), answer[:100]
  _healthy(guess_url)
  # The limit itself is accepted.
  with _served(fixtures.Counter, max_body_bytes=64) as server:
    body = b'{"seed": 1}'.ljust(64)
    assert _call(server.url, "POST", "/episodes", body)[0] == 200
    assert _call(server.url, "POST", "/episodes", body + b" ")[0] == 413
    env = HttpEnv(server.url)
    env.reset(0)
    with pytest.raises(RuntimeError, match="HTTP 413"):  # not a connection reset
      env.step("x" * 100_000)
    _healthy(server.url)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
_BODIES = (
    st.binary(max_size=200)
    | _JSON.map(lambda value: json.dumps(value).encode())
    | st.fixed_dictionaries({"seed": _JSON}).map(lambda value: json.dumps(value).encode())
    | st.fixed_dictionaries({"action": _JSON}).map(lambda value: json.dumps(value).encode())
)


@pytest.fixture(name="live_episode", scope="module")
def _live_episode(guess_url):
  status, answer, _ = _call(guess_url, "POST", "/episodes", b'{"seed": 1}')
  assert status == 200
  return answer["episode"]


@hypothesis.settings(max_examples=150)
@hypothesis.given(body=_BODIES, to_step=st.booleans())
def test_fuzzed_bodies_never_get_5xx(guess_url, live_episode, body, to_step):
  path = f"/episodes/{live_episode}/step" if to_step else "/episodes"
  status, answer, _ = _call(guess_url, "POST", path, body)
  assert status in (200, 400), (status, answer)
  if status == 200 and not to_step:
    assert _call(guess_url, "DELETE", f"/episodes/{answer['episode']}")[0] == 200
  _healthy(guess_url)


@hypothesis.settings(max_examples=60)
@hypothesis.given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS"]),
    path=st.text("abcdefghijklmnopqrstuvwxyz0123456789/_-.%?=&", max_size=30),
)
def test_fuzzed_paths_never_get_5xx(guess_url, method, path):
  status, _, _ = _call(guess_url, method, "/" + path, b'{"action": "1"}')
  assert 200 <= status < 500
  _healthy(guess_url)


_REQUEST_STARTS = st.sampled_from(
    [b"", b"POST /episodes HTTP/1.1\r\n", b"POST /episodes HTTP/1.0\r\nContent-Length: ", b"GET "]
)


@hypothesis.settings(max_examples=60)
@hypothesis.given(start=_REQUEST_STARTS, rest=st.binary(max_size=200))
def test_fuzzed_raw_requests_never_get_5xx(guess_url, start, rest):
  answer = _raw_exchange(guess_url, start + rest)  # half-closed: the server sees the end
  if answer.startswith(b"HTTP/"):
    assert int(answer.split()[1]) < 500, answer[:200]
  _healthy(guess_url)

"""ragen_jax.serve_model against the official `openai` client, on 127.0.0.1.

One server of the shipped tiny warm start per module (token-protected, a small context so that
oversize prompts are cheap to send); the references are `sampling.generate` called directly on
the same model. Prompts are kept in one length bucket and replies at max_tokens <= 16, so the
whole file compiles a handful of programs.
"""

import http.client
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import openai
import pytest

from ragen_jax import sampling
from ragen_jax import serve_model
from ragen_jax import model_server
from ragen_jax.model_server import batcher as batcher_lib
from ragen_jax.model_server import requests as requests_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "test-token-123"
MAX_CONTEXT = 128
PROMPTS = ["Turn 1: hi", "Turn 1: box", "Turn 1: go up", "Turn 1: left or right"]


@pytest.fixture(name="server", scope="module")
def server_fixture():
  model, tok, name = serve_model.load()
  batch = model_server.BatchConfig(max_batch=8, window_s=0.0, max_context=MAX_CONTEXT)
  srv = serve_model.make_server(model, tok, name, token=TOKEN, batch=batch, max_tokens=16)
  srv.start()
  yield srv
  srv.close()


@pytest.fixture(name="client", scope="module")
def client_fixture(server):
  return openai.OpenAI(base_url=server.url, api_key=TOKEN, max_retries=0, timeout=300)


def reference(server, text, max_tokens, ids=None):
  """The tokens `sampling.generate` samples greedily for `text` as a user message (or for the
  prompt `ids`), alone (batch 1)."""
  tok = server.batcher.tok
  if ids is None:
    ids = tok.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)
  opts = sampling.SamplingOptions(
      max_new_tokens=max_tokens, temperature=0.0, stop_token_ids=(tok.eos_id,), pad_id=tok.pad_id
  )
  out = sampling.generate(
      server.batcher.model,
      np.array([ids]),
      np.ones((1, len(ids))),
      key=jax.random.key(0),
      options=opts,
  )
  return ids, np.asarray(out.tokens_BxN)[0, : int(out.lengths_B[0])].tolist()


def ask(client, server, text, **kwargs):
  kwargs.setdefault("max_tokens", 16)
  kwargs.setdefault("temperature", 0)
  return client.chat.completions.create(
      model=server.model_name, messages=[{"role": "user", "content": text}], **kwargs
  )


def expected_text(tok, tokens):
  return tok.decode(tokens[:-1] if tokens and tokens[-1] == tok.eos_id else tokens)


def test_models_and_health(client, server):
  assert [m.id for m in client.models.list().data] == [server.model_name]
  conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
  conn.request("GET", "/health")  # no token needed
  answer = conn.getresponse()
  assert answer.status == 200 and json.loads(answer.read())["status"] == "ok"


def test_greedy_reply_is_generates_tokens(client, server):
  tok = server.batcher.tok
  ids, tokens = reference(server, PROMPTS[0], 12)
  reply = ask(client, server, PROMPTS[0], max_tokens=12)
  choice = reply.choices[0]
  assert choice.message.content == expected_text(tok, tokens)
  assert choice.finish_reason == ("stop" if tokens[-1] == tok.eos_id else "length")
  assert reply.usage.prompt_tokens == len(ids)
  assert reply.usage.completion_tokens == len(tokens)
  assert reply.usage.total_tokens == len(ids) + len(tokens)
  assert reply.model == server.model_name


def test_n_choices_and_seed(client, server):
  greedy = ask(client, server, PROMPTS[1], n=2)
  _, tokens = reference(server, PROMPTS[1], 16)
  assert [c.message.content for c in greedy.choices] == [
      expected_text(server.batcher.tok, tokens)
  ] * 2
  assert [c.index for c in greedy.choices] == [0, 1]
  assert greedy.usage.completion_tokens == 2 * len(tokens)
  sampled = [ask(client, server, PROMPTS[1], n=3, temperature=1.0, seed=7) for _ in range(2)]
  texts = [[c.message.content for c in r.choices] for r in sampled]
  assert len(texts[0]) == 3 and texts[0] == texts[1]  # the seed alone decides the replies
  assert 3 <= sampled[0].usage.completion_tokens <= 3 * 16


def test_stop_strings(client, server):
  tok = server.batcher.tok
  _, tokens = reference(server, PROMPTS[2], 16)
  text = expected_text(tok, tokens)
  stop = text[4:7]
  assert stop and text.find(stop) >= 4
  reply = ask(client, server, PROMPTS[2], stop=[stop, "never-sampled"])
  assert reply.choices[0].message.content == text[: text.find(stop)]
  assert reply.choices[0].finish_reason == "stop"
  # Tokens counted up to the one that completes the stop string.
  k = next(k for k in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:k]))
  assert reply.usage.completion_tokens == k


def test_continue_final_message(client, server):
  """vLLM's extension: the reply continues an open assistant message (a generation prefix)."""
  tok = server.batcher.tok
  messages = [{"role": "user", "content": PROMPTS[1]}, {"role": "assistant", "content": "<think>"}]
  prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True) + "<think>"
  ids, tokens = reference(server, None, 16, ids=tok.encode(prompt))
  reply = client.chat.completions.create(
      model=server.model_name,
      messages=messages,
      max_tokens=16,
      temperature=0,
      extra_body={"continue_final_message": True, "add_generation_prompt": False},
  )
  assert reply.choices[0].message.content == expected_text(tok, tokens)
  assert reply.usage.prompt_tokens == len(ids)
  with pytest.raises(openai.BadRequestError, match="assistant message last"):
    ask(client, server, PROMPTS[1], extra_body={"continue_final_message": True})


def test_finish_choice_by_hand(server):
  tok = server.batcher.tok
  ids = tok.encode("ab cd ef")
  assert batcher_lib.finish_choice(tok, ids + [tok.eos_id], ()) == (
      "ab cd ef",
      len(ids) + 1,
      "stop",
  )
  assert batcher_lib.finish_choice(tok, ids, ()) == ("ab cd ef", len(ids), "length")
  text, _, reason = batcher_lib.finish_choice(tok, ids, (" cd",))
  assert (text, reason) == ("ab", "stop")


def test_token_required(server):
  bad = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
  with pytest.raises(openai.AuthenticationError):
    bad.models.list()
  with pytest.raises(openai.AuthenticationError):
    ask(bad, server, PROMPTS[0])


def raw_post(server, body: bytes, path="/v1/chat/completions"):
  conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
  headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
  conn.request("POST", path, body=body, headers=headers)
  answer = conn.getresponse()
  return answer.status, json.loads(answer.read())


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(temperature=-1), openai.BadRequestError),
        (dict(top_p=0), openai.BadRequestError),
        (dict(max_tokens=0), openai.BadRequestError),
        (dict(max_tokens=17), openai.BadRequestError),  # above the server's max_tokens
        (dict(n=9), openai.BadRequestError),
        (dict(stop=[""]), openai.BadRequestError),
        (dict(model="gpt-4o"), openai.NotFoundError),
        (
            dict(messages=[{"role": "user", "content": "x " * MAX_CONTEXT}]),
            "context_length_exceeded",
        ),
        (dict(messages=[{"role": "wizard", "content": "x"}]), openai.BadRequestError),
    ],
)
def test_bad_requests_are_4xx(client, server, kwargs, error):
  args = dict(model=server.model_name, messages=[{"role": "user", "content": PROMPTS[0]}])
  args.update(max_tokens=4, temperature=0)
  args.update(kwargs)
  code = error if isinstance(error, str) else None
  with pytest.raises(openai.BadRequestError if code else error) as info:
    client.chat.completions.create(**args)
  assert info.value.body["message"]  # the error says what was wrong
  assert info.value.body["code"] == code or code is None


def test_malformed_bodies_then_still_serving(client, server):
  status, answer = raw_post(server, b"{not json")
  assert status == 400 and "not JSON" in answer["error"]["message"]
  body = {"model": server.model_name, "messages": [{"role": "user", "content": "x"}]}
  status, answer = raw_post(server, json.dumps({**body, "temperature": math.nan}).encode())
  assert status == 400 and answer["error"]["param"] == "temperature"
  status, answer = raw_post(server, json.dumps([body]).encode())
  assert status == 400
  status, _ = raw_post(server, b"{}", path="/v1/nowhere")
  assert status == 404
  _, tokens = reference(server, PROMPTS[0], 12)
  assert ask(client, server, PROMPTS[0], max_tokens=12).choices[0].message.content == (
      expected_text(server.batcher.tok, tokens)
  )


def wait_for(condition, limit_s=120.0):
  deadline = time.monotonic() + limit_s
  while not condition():
    assert time.monotonic() < deadline, "condition never held"
    time.sleep(0.01)


def test_concurrent_requests_share_one_call(client, server):
  tok = server.batcher.tok
  expected = [expected_text(tok, reference(server, p, 16)[1]) for p in PROMPTS]
  replies = [None] * len(PROMPTS)

  def call(i):
    replies[i] = ask(client, server, PROMPTS[i]).choices[0].message.content

  threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PROMPTS))]
  before = server.batcher.sampler_calls
  with server.batcher.hold():
    for t in threads:
      t.start()
    wait_for(lambda: server.batcher.pending() == len(PROMPTS))
  for t in threads:
    t.join(300)
  assert server.batcher.sampler_calls == before + 1
  assert replies == expected


def test_same_shapes_never_recompile(client, server):
  ask(client, server, PROMPTS[3], max_tokens=16)
  compiled = sampling._generate_jit._cache_size()
  ask(client, server, PROMPTS[2], max_tokens=9)  # same buckets, other prompt and max_tokens
  assert sampling._generate_jit._cache_size() == compiled


def test_client_disconnect_frees_its_slot(client, server):
  body = {"model": server.model_name, "messages": [{"role": "user", "content": "x"}]}
  data = json.dumps(body).encode()
  before, cancelled = server.batcher.sampler_calls, server.batcher.cancelled
  with server.batcher.hold():
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: "
        + str(len(data)).encode()
        + b"\r\n\r\n"
        + data
    )
    wait_for(lambda: server.batcher.pending() == 1)
    sock.close()
    wait_for(lambda: server.batcher.pending() == 0)
  assert server.batcher.cancelled == cancelled + 1
  assert ask(client, server, PROMPTS[0], max_tokens=12).choices[0].finish_reason
  assert server.batcher.sampler_calls == before + 1  # only the request that stayed


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.text(max_size=3), max_size=6),
)
_MESSAGES = st.one_of(
    _VALUES,
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool", "bot", 3])},
            optional={"content": st.one_of(st.text(max_size=5), _VALUES)},
        ),
        max_size=3,
    ),
)


@hypothesis.given(
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.sampled_from(["m", "other", None, 1]),
            "messages": _MESSAGES,
            "max_tokens": _VALUES,
            "temperature": _VALUES,
            "top_p": _VALUES,
            "stop": _VALUES,
            "n": _VALUES,
            "seed": _VALUES,
            "stream": st.booleans(),
        },
    )
)
def test_validator_accepts_only_valid_requests(body):
  limits = requests_lib.Limits("m", max_tokens=16, max_n=4)
  try:
    request = requests_lib.parse_chat(body, limits)
  except requests_lib.ApiError as e:
    assert e.status in (400, 404) and e.body["error"]["message"]
    return
  # Accepted: every field within its range, and what was sent is what is used.
  assert body["model"] == "m" and not body.get("stream")
  assert 1 <= request.max_tokens <= 16 and 1 <= request.n <= 4
  assert 0 <= request.temperature <= 2 and 0 < request.top_p <= 1
  assert all(math.isfinite(v) for v in (request.temperature, request.top_p))
  assert len(request.messages) == len(body["messages"]) >= 1
  for (role, content), sent in zip(request.messages, body["messages"]):
    assert role == sent["role"] and content == (sent.get("content") or "")
  if body.get("temperature") is not None:
    assert request.temperature == body["temperature"]
  stop = body.get("stop")
  assert request.stop == (() if stop is None else (stop,) if isinstance(stop, str) else tuple(stop))


def test_command_serves_and_refuses_bad_checkpoints(tmp_path):
  env = {**os.environ, "PYTHONPATH": ROOT, serve_model.TOKEN_ENV: TOKEN}
  bad = subprocess.run(
      [sys.executable, "-m", "ragen_jax.serve_model", f"--checkpoint={tmp_path}"],
      capture_output=True,
      text=True,
      env=env,
      timeout=300,
      check=False,
  )
  assert bad.returncode != 0 and "neither a training run" in bad.stderr
  proc = subprocess.Popen(
      [sys.executable, "-m", "ragen_jax.serve_model", "--port=0"],
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
      env=env,
  )
  try:
    line = proc.stdout.readline()
    assert "auth: token" in line and TOKEN not in line
    url = line.split(" at ")[1].split()[0]
    models = openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0).models.list()
    assert [m.id for m in models.data] == ["tiny_warm_start"]
  finally:
    proc.terminate()
    proc.wait(60)

"""An OpenAI-compatible endpoint as the rollout's policy (ragen_jax.rollout.api_policy).

Both sides real: `ragen_jax.serve_model` serving the shipped warm start, evaluated through the
endpoint, against the in-process evaluation of the same weights (near-greedy: a temperature of
1e-4 in-process, 0 through the endpoint). A scripted stand-in endpoint (the standard library's
HTTP server) checks retries, Retry-After, the key's header and the replies' recording; a closed
port checks that a dead endpoint fails episodes, not the run.
"""

import json
import os
import socket
import subprocess
import sys
import threading
from http import server as http_server

import pytest

from ragen_jax import evaluate
from ragen_jax import serve_model
from ragen_jax import model_server
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.rollout import api_policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY_ENV = "RAGEN_JAX_TEST_API_KEY"
KEY = "sk-test-not-a-real-key"


def sokoban_config(groups=4):
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_ppo.py:debug"))
  with config.unlocked():
    config.envs.sokoban.val_groups = groups
    config.rollout.val_temperature = 1e-4
  return config


def read_lines(path):
  with open(path, encoding="utf-8") as fp:
    return [json.loads(line) for line in fp]


def test_served_checkpoint_evaluates_like_the_in_process_model(tmp_path):
  config = sokoban_config()
  in_process = evaluate.evaluate(config, output=str(tmp_path / "in.jsonl"))
  model, tok, name = serve_model.load()
  batch = model_server.BatchConfig(max_batch=8, window_s=0.005)
  server = serve_model.make_server(
      model, tok, name, max_tokens=config.rollout.max_new_tokens, batch=batch
  )
  server.start()
  try:
    served = evaluate.with_api(config, server.url, name)
    with served.unlocked():
      served.api.greedy, served.api.prefill = True, True
    through_api = evaluate.evaluate_api(served, output=str(tmp_path / "api.jsonl"))
  finally:
    server.close()
  assert through_api["val/success"] == in_process["val/success"]
  assert through_api["val/num_episodes"] == in_process["val/num_episodes"] == 4
  # Not only the success: every conversation is the same, word for word.
  ours, theirs = read_lines(tmp_path / "in.jsonl"), read_lines(tmp_path / "api.jsonl")
  assert [r["messages"] for r in theirs] == [r["messages"] for r in ours]
  assert [r["success"] for r in theirs] == [r["success"] for r in ours]
  turns = sum(r["turns"] for r in ours)
  assert through_api["api/requests"] == turns and through_api["api/failed_turns"] == 0
  assert through_api["api/completion_tokens"] > 0 and through_api["api/prompt_tokens"] > 0
  assert server.batcher.sampler_calls < turns  # the episodes of a turn share sampler calls


class Scripted(http_server.BaseHTTPRequestHandler):
  """Answers each POST with the next scripted (status, body, headers); then a default reply."""

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass

  def do_POST(self):
    srv = self.server
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with srv.lock:
      srv.seen.append((self.headers.get("Authorization"), body))
      status, answer, headers = srv.script.pop(0) if srv.script else (200, srv.reply, {})
    data = json.dumps(answer).encode()
    self.send_response(status)
    for k, v in headers.items():
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def reply(text, finish="stop"):
  message = {"role": "assistant", "content": text}
  usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
  return {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


@pytest.fixture(name="endpoint")
def endpoint_fixture():
  srv = http_server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
  srv.lock, srv.seen, srv.script = threading.Lock(), [], []
  srv.reply = reply("<think>push</think><answer>Up || Left")  # "</answer>" was the stop
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()


def api_config(url, groups=2, **api):
  config = evaluate.with_api(sokoban_config(groups), url, "scripted-model")
  with config.unlocked():
    config.model.warm_start = False  # the tokenizer only: no model is loaded
    config.api.backoff_s = 0.01
    for key, value in api.items():
      config.api[key] = value
  return config


def test_retries_the_key_and_the_recorded_replies(endpoint, monkeypatch, tmp_path):
  monkeypatch.setenv(KEY_ENV, KEY)
  endpoint.script = [
      (503, {"error": {"message": "overloaded"}}, {}),
      (429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
      (200, {"choices": []}, {}),  # not a chat completion
  ]
  config = api_config(_url(endpoint), key_env=KEY_ENV)
  metrics = evaluate.evaluate_api(config, output=str(tmp_path / "t.jsonl"))
  records = read_lines(tmp_path / "t.jsonl")
  assert metrics["val/env_error"] == 0.0 and metrics["api/failed_turns"] == 0
  # Three failed tries, then every turn answered.
  turns = sum(r["turns"] for r in records)
  assert len(endpoint.seen) == turns + 3 and metrics["api/requests"] == turns
  assert metrics["api/completion_tokens"] == 3 * turns
  assert {auth for auth, _ in endpoint.seen} == {f"Bearer {KEY}"}
  _, body = endpoint.seen[-1]
  assert body["model"] == "scripted-model" and body["stop"] == ["</answer>"]
  assert body["max_tokens"] == config.rollout.max_new_tokens
  assert body["temperature"] == config.rollout.val_temperature
  assert body["messages"][0]["role"] == "system" and body["messages"][-1]["role"] == "user"
  # The reply is recorded after the generation prefix, its stop string put back.
  assistant = [m for m in records[0]["messages"] if m["role"] == "assistant"]
  assert assistant[0]["content"] == "<think>push</think><answer>Up || Left</answer>"
  assert KEY not in json.dumps(records) and KEY not in config.to_json()


def _url(srv):
  return f"http://127.0.0.1:{srv.server_address[1]}/v1"


def test_a_dead_endpoint_fails_episodes_not_the_run(tmp_path):
  with socket.socket() as sock:  # a port nobody listens on
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  config = api_config(f"http://127.0.0.1:{port}/v1", retries=1)
  metrics = evaluate.evaluate_api(config, output=str(tmp_path / "dead.jsonl"))
  records = read_lines(tmp_path / "dead.jsonl")
  assert metrics["val/env_error"] == 1.0 and metrics["val/success"] == 0.0
  assert metrics["api/failed_turns"] == len(records) == 2 and metrics["api/requests"] == 0
  assert all(r["env_error"].startswith("api: ") for r in records)


def test_a_refused_request_is_not_retried(endpoint, tmp_path):
  endpoint.script = [(400, {"error": {"message": "bad model"}}, {})] * 2
  metrics = evaluate.evaluate_api(api_config(_url(endpoint)), output=str(tmp_path / "r.jsonl"))
  assert metrics["api/failed_turns"] == 2 and len(endpoint.seen) == 2
  assert all("bad model" in r["env_error"] for r in read_lines(tmp_path / "r.jsonl"))


def test_api_settings_are_checked(monkeypatch):
  with pytest.raises(ValueError, match="api.base_url must be an http"):
    api_policy.ApiConfig(base_url="ftp://x", model="m")
  with pytest.raises(ValueError, match="api.model"):
    api_policy.ApiConfig(base_url="http://x/v1")
  with pytest.raises(ValueError, match="NAME"):
    api_policy.ApiConfig(base_url="http://x/v1", model="m", key_env="sk-abc def")
  monkeypatch.delenv(KEY_ENV, raising=False)
  with pytest.raises(ValueError, match=KEY_ENV):
    api_policy.ApiClient(api_policy.ApiConfig(base_url="http://x/v1", model="m", key_env=KEY_ENV))
  config = api_config("http://x/v1")
  with config.unlocked():
    config.api.timeout_s = float("nan")
  with pytest.raises(ValueError, match=r"^config: api\.timeout_s must be a finite number"):
    schema.from_config(config)


def test_the_command_evaluates_an_endpoint(endpoint, tmp_path):
  out = tmp_path / "cli.jsonl"
  run = subprocess.run(
      [
          sys.executable,
          "-m",
          "ragen_jax.evaluate",
          f"--config={os.path.join(ROOT, 'configs', 'sokoban_ppo.py')}:debug",
          "--config.envs.sokoban.val_groups=2",
          "--config.model.warm_start=False",
          f"--api_base={_url(endpoint)}",
          "--api_model=scripted-model",
          f"--output={out}",
      ],
      capture_output=True,
      text=True,
      env={**os.environ, "PYTHONPATH": ROOT},
      timeout=600,
      check=False,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  metrics = json.loads(run.stdout[run.stdout.index("{") :])
  assert metrics["api/requests"] == sum(r["turns"] for r in read_lines(out)) > 0
  assert metrics["val/num_episodes"] == 2

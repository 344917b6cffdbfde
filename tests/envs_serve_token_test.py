"""A bearer token on the environment server (`python -m ragen_jax.envs.serve --token-env`), sent
by HttpEnv from the environment variable its `token_env` option names."""

import http.client
import json
import logging
import os
import subprocess
import sys
import urllib.parse

import pytest

from ragen_jax import envs
from ragen_jax.envs.serve import server as env_server
from ragen_jax.envs.serve.client import HttpEnv
import text_env_fixtures as fixtures

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "tok-5f1e"
TIMEOUT_S = 30.0


@pytest.fixture(name="server")
def _server():
  server = env_server.serve(
      fixtures.GuessNumber, "127.0.0.1", 0, {"low": 1, "high": 30}, background=True, token=TOKEN
  )
  yield server
  server.close()


def _status(url, method, path, headers=None, body=None):
  connection = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=TIMEOUT_S)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, json.loads(response.read()), dict(response.getheaders())
  finally:
    connection.close()


def test_requests_without_the_token_get_401(server):
  body = json.dumps({"seed": 1})
  for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
    status, answer, response_headers = _status(server.url, "POST", "/episodes", headers, body)
    assert status == 401 and "Bearer" in answer["error"] and TOKEN not in answer["error"]
    assert response_headers["WWW-Authenticate"] == "Bearer"
  assert _status(server.url, "GET", "/health")[0] == 401
  assert server.num_episodes == 0
  status, answer, _ = _status(server.url, "GET", "/health", {"Authorization": f"Bearer {TOKEN}"})
  assert status == 200 and answer["ok"]


def test_http_env_sends_the_token_from_the_named_variable(server, monkeypatch, caplog):
  caplog.set_level(logging.DEBUG)
  monkeypatch.setenv("ENV_SERVER_TOKEN", TOKEN)
  remote = envs.make("", entry=server.url, token_env="ENV_SERVER_TOKEN")
  local = fixtures.GuessNumber(low=1, high=30)
  assert remote.reset(4) == local.reset(4)
  assert remote.step("15") == local.step("15")
  remote.close()
  monkeypatch.setenv("ENV_SERVER_TOKEN", "wrong")
  with pytest.raises(RuntimeError, match="HTTP 401") as caught:
    HttpEnv(server.url, token_env="ENV_SERVER_TOKEN").reset(4)
  assert "wrong" not in str(caught.value)
  assert TOKEN not in caplog.text and "wrong" not in caplog.text


def test_an_unset_token_variable_is_an_error(monkeypatch):
  monkeypatch.delenv("ENV_SERVER_TOKEN", raising=False)
  with pytest.raises(ValueError, match="'ENV_SERVER_TOKEN' is unset"):
    HttpEnv("http://127.0.0.1:1", token_env="ENV_SERVER_TOKEN")


def test_the_command_line_takes_the_token_from_the_environment(monkeypatch):
  command = [sys.executable, "-m", "ragen_jax.envs.serve", "text_env_fixtures:GuessNumber"]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_DIR, os.path.join(REPO_DIR, "tests")])}
  env.pop("SERVE_TEST_TOKEN", None)
  unset = subprocess.run(
      [*command, "--token-env", "SERVE_TEST_TOKEN"],
      env=env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_S,
      check=False,
  )
  assert unset.returncode == 2 and "SERVE_TEST_TOKEN" in unset.stderr
  env["SERVE_TEST_TOKEN"] = TOKEN
  with subprocess.Popen(
      [*command, "--port", "0", "--token-env", "SERVE_TEST_TOKEN"],
      env=env,
      stdout=subprocess.PIPE,
      text=True,
  ) as process:
    try:
      url = process.stdout.readline().rsplit(" ", 1)[-1].strip()
      assert _status(url, "POST", "/episodes", {}, json.dumps({"seed": 1}))[0] == 401
      monkeypatch.setenv("SERVE_TEST_TOKEN_CLIENT", TOKEN)
      assert HttpEnv(url, token_env="SERVE_TEST_TOKEN_CLIENT").reset(1)
    finally:
      process.terminate()
      process.wait(TIMEOUT_S)

"""SearchQA's retrieval servers on 127.0.0.1: ragen_jax.envs.text.retrieval_server, both client APIs,
a bearer token, and servers that are down, slow or answer garbage (an observation, no crash)."""

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from http import server as http_server

import pytest

from ragen_jax.envs.text import retrieval_server
from ragen_jax.envs.text import retrievers
from ragen_jax.envs.text import search_qa
from ragen_jax.envs.text.search_qa import SearchQA

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 30.0


@contextlib.contextmanager
def _served(token=""):
  server = retrieval_server.RetrievalServer(
      retrievers.bm25_index(search_qa.SHIPPED_CORPUS), token=token
  )
  server.start()
  try:
    yield server
  finally:
    server.close()


@pytest.fixture(name="url", scope="module")
def _url():
  with _served() as server:
    yield server.url


def _post(url, path, body, headers=None):
  connection = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=TIMEOUT_S)
  try:
    connection.request(
        "POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
    )
    response = connection.getresponse()
    return response.status, json.loads(response.read())
  finally:
    connection.close()


def test_the_server_answers_ragens_api(url):
  status, answer = _post(url, "/retrieve", {"query": "Velrin Optics", "top_k": 3})
  index = retrievers.bm25_index(search_qa.SHIPPED_CORPUS)
  expected, _ = index.search("Velrin Optics", 3)
  assert status == 200 and len(answer["results"]) == 3
  assert [(r["id"], r["content"]) for r in answer["results"]] == [
      (h.id, h.contents) for h in expected
  ]
  assert answer["results"][0]["content"].startswith('"Velrin Optics"\n')
  assert _post(url, "/retrieve", {"query": "x", "top_k": 0})[0] == 400
  assert _post(url, "/retrieve", {"top_k": 3})[0] == 400


def test_the_server_answers_search_r1s_api(url):
  body = {"queries": ["Velrin Optics", "Brelsa"], "topk": 2, "return_scores": True}
  status, answer = _post(url, "/retrieve", body)
  assert status == 200 and len(answer["result"]) == 2 and len(answer["result"][0]) == 2
  first = answer["result"][0][0]
  assert first["document"]["contents"].startswith('"Velrin Optics"\n') and first["score"] > 0


@pytest.mark.parametrize("api", ["ragen", "search_r1"])
def test_searchqa_plays_through_a_server_with_either_api(url, api):
  local, served = SearchQA(), SearchQA(retriever=url, retriever_api=api)
  for seed in (0, 7, 21):
    local.reset(seed)
    served.reset(seed)
    query = f"search[{local.item.searches[0]}]"
    assert served.step(query) == local.step(query)


def test_a_token_protects_the_server_and_the_client_sends_it(monkeypatch):
  with _served(token="s3cret") as server:
    assert _post(server.url, "/retrieve", {"query": "Brelsa"})[0] == 401
    wrong = {"Authorization": "Bearer nope"}
    assert _post(server.url, "/retrieve", {"query": "Brelsa"}, wrong)[0] == 401
    right = {"Authorization": "Bearer s3cret"}
    assert _post(server.url, "/retrieve", {"query": "Brelsa"}, right)[0] == 200
    env = SearchQA(retriever=server.url, retriever_token_env="RETRIEVAL_TEST_TOKEN")
    env.reset(0)
    assert "status 401" in env.step("search[Brelsa]")[0]
    monkeypatch.setenv("RETRIEVAL_TEST_TOKEN", "s3cret")
    title = env.item.searches[0]
    assert "[Document 1] (ID: " in env.step(f"search[{title}]")[0]


def test_a_server_that_is_down_gives_an_observation():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = SearchQA(retriever=f"http://127.0.0.1:{port}")
  env.reset(0)
  observation, reward, done, info = env.step("search[Brelsa]")
  assert "Could not connect to retrieval server" in observation and not done and reward == 0.0
  assert info["action_is_valid"]


def test_a_server_that_never_answers_gives_an_observation():
  with socket.socket() as listener:  # accepts connections (the backlog), never reads them
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    env = SearchQA(retriever=f"http://127.0.0.1:{port}", retrieval_timeout_s=0.2)
    env.reset(0)
    assert "timed out after 0.2 seconds" in env.step("search[Brelsa]")[0]


class _Garbage(http_server.BaseHTTPRequestHandler):

  def do_POST(self):  # pylint: disable=invalid-name
    body = b'{"results": [{"no_content": 1}]}' if "json" in self.path else b"<html>"
    self.rfile.read(int(self.headers["Content-Length"]))
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


@pytest.mark.parametrize("prefix", ["/json", "/html"])
def test_a_server_answering_garbage_gives_an_observation(prefix):
  server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
  thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
  thread.start()
  try:
    env = SearchQA(retriever=f"http://127.0.0.1:{server.server_address[1]}{prefix}")
    env.reset(0)
    assert "malformed results" in env.step("search[Brelsa]")[0]
  finally:
    server.shutdown()
    server.server_close()


def test_the_command_line_serves_a_corpus_with_a_token_from_the_environment(tmp_path):
  corpus = tmp_path / "c.jsonl"
  corpus.write_text(json.dumps({"title": "Kesh", "text": "Kesh is a city."}) + "\n")
  command = [sys.executable, "-m", "ragen_jax.envs.text.retrieval_server", "--corpus", str(corpus)]
  env = {**os.environ, "PYTHONPATH": REPO_DIR, "RT_TOKEN": "t0k"}
  with subprocess.Popen(
      [*command, "--port", "0", "--token-env", "RT_TOKEN"],
      cwd=REPO_DIR,
      env=env,
      stdout=subprocess.PIPE,
      text=True,
  ) as process:
    try:
      line = process.stdout.readline()
      url = line.rsplit(" ", 1)[-1].strip()
      assert line.startswith("serving 1 passages") and url.startswith("http://127.0.0.1:")
      assert _post(url, "/retrieve", {"query": "Kesh"})[0] == 401
      status, answer = _post(url, "/retrieve", {"query": "Kesh"}, {"Authorization": "Bearer t0k"})
      assert status == 200 and answer["results"][0]["content"] == '"Kesh"\nKesh is a city.'
    finally:
      process.terminate()
      process.wait(TIMEOUT_S)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  done = subprocess.run(
      [*command[:-1], str(empty)],
      cwd=REPO_DIR,
      env=env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_S,
      check=False,
  )
  assert done.returncode == 2 and "empty.jsonl: the corpus has no passages" in done.stderr

"""A BM25 retrieval server speaking RAGEN's API (and Search-R1's), for SearchQA's `retriever=`.

  python -m ragen_jax.envs.retrieval_server --corpus kb.jsonl [--port 8000] [--host 127.0.0.1] \
      [--token-env RETRIEVAL_TOKEN | --token TOKEN]

One process holds the index (ragen_jax.envs.text.retrievers.Bm25 over the JSONL corpus, read as
SearchQA's `corpus=` reads it) and answers every rollout worker:
  POST /retrieve {"query": q, "top_k": k}      -> {"results": [{"id", "content", "score"}]}
  POST /retrieve {"queries": [q, ...], "topk": k, "return_scores": true}
                                               -> {"result": [[{"document": {"id", "contents"},
                                                  "score"}], ...]}   (Search-R1's form)
  GET  /health                                 -> {"ok": true, "passages": N}
`top_k` lies in [1, 50] (RAGEN's client caps it at 50; default 5), at most 32 queries a request.
It binds 127.0.0.1 unless told otherwise; with a token (as for `python -m ragen_jax.envs.serve`)
a request without `Authorization: Bearer <token>` gets 401. Errors answer {"error": message}
with serve's status codes (ragen_jax.envs.serve.http).

In a test or notebook: `server = RetrievalServer(index); server.start(); ...; server.close()`.
"""

import argparse
import logging
import socket
import socketserver
import sys
import threading
from http import server as http_server
from typing import Any, Dict, Optional, Sequence

from ragen_jax.envs.serve import http as serve_http
from ragen_jax.envs.serve import server as serve_server
from ragen_jax.envs.text import retrievers

MAX_TOP_K = 50
MAX_QUERIES = 32


class Handler(serve_http.Handler):
  """serve's request handling (JSON bodies, limits, token) with the retrieval routes."""

  server: "RetrievalServer"
  server_version = "ragen-jax-retrieval/1"

  def _route(self) -> Dict[str, Any]:
    path = self.path.split("?", 1)[0]
    if path == "/health":
      self._allow("GET")
      return {"ok": True, "passages": len(self.server.index.passages)}
    if path != "/retrieve":
      raise serve_http.HttpError(404, f"no such path: {self.path[:200]!r}")
    self._allow("POST")
    body = self._read_json()
    if "queries" in body:  # Search-R1's form
      queries = body["queries"]
      if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise serve_http.HttpError(400, "'queries' must be a list of strings")
      if len(queries) > MAX_QUERIES:
        raise serve_http.HttpError(400, f"at most {MAX_QUERIES} queries a request")
      top_k = self._top_k(body, "topk")
      rows = [self.server.index.search(q, top_k)[0] for q in queries]
      return {
          "result": [
              [{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in row]
              for row in rows
          ]
      }
    query = self._field(body, "query", str)
    hits, _ = self.server.index.search(query, self._top_k(body, "top_k"))
    return {"results": [{"id": h.id, "content": h.contents, "score": h.score} for h in hits]}

  @staticmethod
  def _top_k(body: Dict[str, Any], key: str) -> int:
    value = body.get(key, 5)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOP_K:
      raise serve_http.HttpError(400, f"{key!r} must be an int in [1, {MAX_TOP_K}]")
    return value


class RetrievalServer(http_server.ThreadingHTTPServer):
  """Serves `index` (a `retrievers.Bm25`); port 0 picks a free port (`url`)."""

  daemon_threads = True
  request_queue_size = 1024

  def __init__(self, index: retrievers.Bm25, host: str = "127.0.0.1", port: int = 0, token=""):
    self.index = index
    self.token = token
    self.max_body_bytes = 1 << 20
    self.request_timeout_s = serve_server.DEFAULT_REQUEST_TIMEOUT_S
    self._thread: Optional[threading.Thread] = None
    if ":" in host:
      self.address_family = socket.AF_INET6
    super().__init__((host, port), Handler)

  def server_bind(self) -> None:  # no reverse DNS look-up of the host (see serve.server)
    socketserver.TCPServer.server_bind(self)
    self.server_name, self.server_port = self.server_address[:2]

  def handle_error(self, request: Any, client_address: Any) -> None:
    serve_http.logger.debug("request from %s failed", client_address, exc_info=True)

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

  def start(self) -> None:
    """Serves in a daemon thread; `close` stops it."""
    self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
    self._thread.start()

  def close(self) -> None:
    if self._thread is not None:
      self.shutdown()
      self._thread.join()
      self._thread = None
    self.server_close()


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m ragen_jax.envs.retrieval_server", description=__doc__.splitlines()[0]
  )
  parser.add_argument("--corpus", required=True, help="JSONL corpus ({id, contents} lines)")
  parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
  parser.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
  serve_server.add_token_arguments(parser)
  args = parser.parse_args(argv)
  token = serve_server.token_from_arguments(parser, args)
  try:
    index = retrievers.bm25_index(args.corpus)
  except ValueError as exc:
    parser.exit(2, f"{parser.prog}: error: {exc}\n")
  logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
  server = RetrievalServer(index, args.host, args.port, token)
  print(f"serving {len(index.passages)} passages of {args.corpus} at {server.url}", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  sys.exit(main())

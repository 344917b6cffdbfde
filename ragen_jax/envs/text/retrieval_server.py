"""A BM25 retrieval server speaking RAGEN's API (and Search-R1's), for SearchQA's `retriever=`.

  python -m ragen_jax.envs.text.retrieval_server --corpus kb.jsonl [--port 8000] \
      [--host 127.0.0.1] [--token-env RETRIEVAL_TOKEN | --token TOKEN]

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
with the environment server's status codes (ragen_jax.json_http, the HTTP layer both share).

In a test or notebook: `server = RetrievalServer(index); server.start(); ...; server.close()`.
"""

import argparse
import logging
import sys
from typing import Any, Dict, Optional, Sequence

from ragen_jax import json_http
from ragen_jax.envs.text import retrievers

MAX_TOP_K = 50
MAX_QUERIES = 32


def _top_k(body: Dict[str, Any], key: str) -> int:
  value = body.get(key, 5)
  if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOP_K:
    raise json_http.HttpError(400, f"{key!r} must be an int in [1, {MAX_TOP_K}]")
  return value


class RetrievalServer(json_http.JsonServer):
  """Serves `index` (a `retrievers.Bm25`); port 0 picks a free port (`url`)."""

  SERVER_VERSION = "ragen-jax-retrieval/1"

  def __init__(self, index: retrievers.Bm25, host: str = "127.0.0.1", port: int = 0, token=""):
    self.index = index
    super().__init__(host, port, token=token)

  def _health(self, request: json_http.Request) -> Dict[str, Any]:
    del request
    return {"ok": True, "passages": len(self.index.passages)}

  def _retrieve(self, request: json_http.Request) -> Dict[str, Any]:
    body = request.json()
    if "queries" in body:  # Search-R1's form
      queries = body["queries"]
      if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise json_http.HttpError(400, "'queries' must be a list of strings")
      if len(queries) > MAX_QUERIES:
        raise json_http.HttpError(400, f"at most {MAX_QUERIES} queries a request")
      top_k = _top_k(body, "topk")
      rows = [self.index.search(q, top_k)[0] for q in queries]
      return {
          "result": [
              [{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in row]
              for row in rows
          ]
      }
    query = json_http.field(body, "query", str)
    hits, _ = self.index.search(query, _top_k(body, "top_k"))
    return {"results": [{"id": h.id, "content": h.contents, "score": h.score} for h in hits]}

  ROUTES = (
      json_http.Route("GET", "/health", _health),
      json_http.Route("POST", "/retrieve", _retrieve),
  )


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m ragen_jax.envs.text.retrieval_server", description=__doc__.splitlines()[0]
  )
  parser.add_argument("--corpus", required=True, help="JSONL corpus ({id, contents} lines)")
  parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
  parser.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
  json_http.add_token_arguments(parser)
  args = parser.parse_args(argv)
  token = json_http.token_from_arguments(parser, args)
  try:
    index = retrievers.bm25_index(args.corpus)
  except ValueError as exc:
    parser.exit(2, f"{parser.prog}: error: {exc}\n")
  logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
  server = RetrievalServer(index, args.host, args.port, token)
  print(f"serving {len(index.passages)} passages of {args.corpus} at {server.url}", flush=True)
  server.serve_until_interrupted()


if __name__ == "__main__":
  sys.exit(main())

"""Retrievers of SearchQA (ragen_jax.envs.text.search_qa): BM25 over a local corpus, or a server.

    retriever = make_retriever(corpus="kb.jsonl")                       # in-process BM25
    retriever = make_retriever(url="http://127.0.0.1:8000", api="ragen")  # a retrieval server
    retriever.search("Quorvex Industries", top_k=5)   # -> (hits, None) or ([], error text)

Corpus files are JSONL, one passage a line, in either of two forms:
  {"id": ..., "contents": "\"Title\"\\ntext"}   wiki-18 / FlashRAG (the title on the first line,
                                                its quotes optional)
  {"title": ..., "text": ..., "id": optional}   the id defaults to the line number
An unreadable file, a line that is not a JSON object of one of these forms, or a file without
passages raises ValueError naming the file and the line. A corpus is read and indexed once per
path and shared by every environment instance of the process.

BM25 (`Bm25`) is Lucene's variant, as the `bm25s` package computes it by default (its tests use
it as the reference): idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)) and a term's weight
idf * tf / (tf + k1 * (1 - b + b * len / avglen)), k1 = 1.5, b = 0.75. Tokens are lower-cased
runs of two or more word characters (`\\b\\w\\w+\\b`, bm25s's pattern) less a few English stop
words. The index holds each term's postings (passages and weights) in memory: corpora of up to
some hundred thousand passages; a large one belongs on a retrieval server.

Retrieval servers, `api=`:
  "ragen"     RAGEN's: POST /retrieve {"query", "top_k"} -> {"results": [{"id", "content",
              "score"}]}
  "search_r1" Search-R1's: POST /retrieve {"queries": [q], "topk", "return_scores": true} ->
              {"result": [[{"document": {"id", "contents"}, "score"}]]}
A server that is down, slow (`timeout_s`) or answers garbage yields an error text for the
observation, never an exception. An optional bearer token is read from the environment
variable `token_env` names (the token itself never sits in a config).
"""

import collections
import dataclasses
import http.client
import json
import math
import os
import re
import threading
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ragen_jax.envs.text import jsonl

API_RAGEN = "ragen"
API_SEARCH_R1 = "search_r1"
APIS = (API_RAGEN, API_SEARCH_R1)
_TOKEN = re.compile(r"\b\w\w+\b")
# A short stop list: question words would otherwise favour passages that happen to repeat them.
STOPWORDS = frozenset(
    "the a an and or of in on at to for by with from is was are were be been as it its this "
    "that which who whom what when where how did does do has have had into than then".split()
)


@dataclasses.dataclass(frozen=True)
class Passage:
  """One corpus passage: `contents` is the title's line then the text (wiki-18's form)."""

  id: str
  title: str
  contents: str


@dataclasses.dataclass(frozen=True)
class Hit:
  """One retrieved passage and its score."""

  id: str
  contents: str
  score: float


def tokenize(text: str) -> List[str]:
  return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


# ------------------------------------------------------------------------------------ corpus


def _passage(obj: dict, where: str, number: int) -> Passage:
  doc_id = obj.get("id", str(number))
  if isinstance(obj.get("contents"), str):
    first, _, rest = obj["contents"].partition("\n")
    title, text = first.strip().strip('"'), rest.strip()
  elif isinstance(obj.get("title"), str) and isinstance(obj.get("text"), str):
    title, text = obj["title"].strip(), obj["text"].strip()
  else:
    raise ValueError(
        f'{where}: expected {{"id", "contents"}} or {{"title", "text"}} strings (keys: '
        f"{sorted(obj)})"
    )
  if not title and not text:
    raise ValueError(f"{where}: the passage is empty")
  return Passage(id=str(doc_id), title=title, contents=f'"{title}"\n{text}')


def read_corpus(path: str) -> Tuple[Passage, ...]:
  """The passages of the JSONL file `path` (module doc); ValueError naming the file and line."""
  passages = [_passage(obj, where, n) for n, where, obj in jsonl.objects(path, "corpus")]
  if not passages:
    raise ValueError(f"{path}: the corpus has no passages (one JSON object a line expected)")
  return tuple(passages)


# -------------------------------------------------------------------------------------- BM25


class Bm25:
  """Lucene BM25 over `passages` (module doc); `search` returns the best `top_k` hits."""

  def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75):
    if not passages:
      raise ValueError("BM25 needs at least one passage")
    self.passages = tuple(passages)
    docs = [collections.Counter(tokenize(p.contents)) for p in self.passages]
    lengths_N = np.array([sum(d.values()) for d in docs], np.float64)
    norm_N = k1 * (1.0 - b + b * lengths_N / max(lengths_N.mean(), 1e-9))
    # term -> (passage indices, weights): each posting's idf * tf / (tf + norm).
    postings: Dict[str, Tuple[List[int], List[float]]] = {}
    for i, doc in enumerate(docs):
      for term, tf in doc.items():
        rows, weights = postings.setdefault(term, ([], []))
        rows.append(i)
        weights.append(tf / (tf + norm_N[i]))
    n = len(docs)
    self._postings = {}
    for term, (rows, weights) in postings.items():
      idf = math.log(1.0 + (n - len(rows) + 0.5) / (len(rows) + 0.5))
      self._postings[term] = (np.array(rows), idf * np.array(weights))

  def scores(self, query: str) -> np.ndarray:
    """Every passage's score for `query` (a repeated query term counts each time)."""
    scores_N = np.zeros(len(self.passages))
    for term in tokenize(query):
      if term in self._postings:
        rows, weights = self._postings[term]
        scores_N[rows] += weights
    return scores_N

  def search(self, query: str, top_k: int) -> Tuple[List[Hit], Optional[str]]:
    scores_N = self.scores(query)
    order = np.argsort(-scores_N, kind="stable")[:top_k]
    hits = [
        Hit(self.passages[i].id, self.passages[i].contents, float(scores_N[i]))
        for i in order
        if scores_N[i] > 0
    ]
    return hits, None


_INDEXES: Dict[str, Bm25] = {}
_INDEX_LOCK = threading.Lock()  # the rollout builds instances from several threads


def bm25_index(path: str) -> Bm25:
  """The BM25 index of the corpus file `path`, built once per process."""
  path = os.path.abspath(os.path.expanduser(path))
  with _INDEX_LOCK:
    if path not in _INDEXES:
      _INDEXES[path] = Bm25(read_corpus(path))
    return _INDEXES[path]


# ---------------------------------------------------------------------------------- servers


class HttpRetriever:
  """A retrieval server speaking `api` (module doc); failures come back as error text."""

  def __init__(self, url: str, api: str = API_RAGEN, timeout_s: float = 30.0, token_env: str = ""):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
      raise ValueError(f"retriever: expected an http(s)://host:port URL, got {url!r}")
    if api not in APIS:
      raise ValueError(f"retriever_api {api!r} is not one of {APIS}")
    if timeout_s <= 0:
      raise ValueError(f"retrieval_timeout_s must be positive, got {timeout_s}")
    self.url, self.api, self.timeout_s = url.rstrip("/"), api, float(timeout_s)
    self._https = parts.scheme == "https"
    self._netloc, self._path = parts.netloc, parts.path.rstrip("/") + "/retrieve"
    self._token_env = token_env

  def _body(self, query: str, top_k: int) -> dict:
    if self.api == API_RAGEN:
      return {"query": query, "top_k": top_k}
    return {"queries": [query], "topk": top_k, "return_scores": True}

  def search(self, query: str, top_k: int) -> Tuple[List[Hit], Optional[str]]:
    headers = {"Content-Type": "application/json"}
    token = os.environ.get(self._token_env, "") if self._token_env else ""
    if token:
      headers["Authorization"] = f"Bearer {token}"
    kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
    connection = kind(self._netloc, timeout=self.timeout_s)
    try:
      body = json.dumps(self._body(query, top_k)).encode("utf-8")
      connection.request("POST", self._path, body=body, headers=headers)
      response = connection.getresponse()
      status, raw = response.status, response.read(1 << 24)
    except TimeoutError:
      return [], f"Search request timed out after {self.timeout_s:g} seconds."
    except (OSError, http.client.HTTPException) as e:
      return [], f"Could not connect to retrieval server at {self.url} ({type(e).__name__})."
    finally:
      connection.close()
    if status != 200:
      return [], f"Retrieval server error (status {status})."
    try:
      return self._hits(json.loads(raw)), None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
      return [], f"Retrieval server answered malformed results ({type(e).__name__})."

  def _hits(self, answer) -> List[Hit]:
    if self.api == API_RAGEN:
      return [
          Hit(str(r.get("id", "")), str(r["content"]), float(r.get("score", 0.0)))
          for r in answer["results"]
      ]
    rows = answer["result"][0] if answer["result"] else []
    hits = []
    for r in rows:
      doc = r["document"]
      contents = doc.get("contents")
      if contents is None:
        contents = f'"{doc.get("title", "")}"\n{doc.get("text", "")}'
      hits.append(Hit(str(doc.get("id", "")), str(contents), float(r.get("score", 0.0))))
    return hits


def make_retriever(
    corpus: str = "",
    url: str = "",
    api: str = API_RAGEN,
    timeout_s: float = 30.0,
    token_env: str = "",
):
  """BM25 over `corpus`, or the server at `url`: exactly one of them."""
  if bool(corpus) == bool(url):
    raise ValueError("SearchQA takes a corpus file or a retriever URL (exactly one)")
  if url:
    return HttpRetriever(url, api, timeout_s, token_env)
  return bm25_index(corpus)


def format_hits(hits: Sequence[Hit], max_results: int, max_chars: int, max_total: int) -> str:
  """RAGEN's result text: each passage cut at `max_chars`, the whole at `max_total` ("...")."""
  if not hits:
    return "No relevant documents found for the query."
  blocks = []
  for i, hit in enumerate(hits[:max_results], 1):
    content = hit.contents if len(hit.contents) <= max_chars else hit.contents[:max_chars] + "..."
    blocks.append(f"[Document {i}] (ID: {hit.id or f'doc_{i}'}, Score: {hit.score:.3f})\n{content}")
  text = "\n\n".join(blocks)
  return text if len(text) <= max_total else text[:max_total] + "..."

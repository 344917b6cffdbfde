"""Concurrent chat requests batched into few `sampling.generate` calls, and their replies.

    batcher = Batcher(model, tokenizer, BatchConfig(max_batch=64, window_s=0.01))
    job = batcher.submit(prompt_ids, request)    # ChatRequest from model_server.requests
    job.done.wait(); job.rows                     # one token list per choice
    batcher.cancel(job)                           # the client went away: frees its rows

One worker thread samples. It waits for a first job, collects more for `window_s` (or until
`max_batch` rows wait), then groups the jobs by what the sampler compiles in (temperature and
top_p; a sampled request with a seed is a group of its own, so that the seed alone decides its
reply) and makes one `sampling.generate` call per group of at most `max_batch` rows. Each
request contributes `n` rows. Shapes are static buckets: the batch is padded with empty rows to
a power of two, the prompt to `sampling.bucket` (inside generate), the new tokens to
`sampling.bucket` of the group's largest max_tokens, so a server compiles one program per
(batch, prompt, reply) bucket and sampling setting and never again for the same shapes.

Rows stop on the tokenizer's end-of-turn id or after max_tokens; stop strings are applied to the
decoded text afterwards (`finish_choice`). A cancelled job that is still queued never reaches the
sampler; one already being sampled finishes and its reply is dropped.

Dimension legend: B batch rows (bucketed), T prompt length, N new tokens.
"""

import contextlib
import dataclasses
import itertools
import threading
import time
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from ragen_jax import sampling
from ragen_jax.model_server.requests import ApiError, ChatRequest


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """Attributes: max_batch, the most rows per sampler call (a power of two); window_s, how long
  the worker collects requests after the first; max_context, the most prompt + reply tokens of
  a request; seed, the PRNG seed of requests without one."""

  max_batch: int = 64
  window_s: float = 0.01
  max_context: int = 4096
  seed: int = 0

  def __post_init__(self):
    if self.max_batch < 1 or self.max_batch & (self.max_batch - 1):
      raise ValueError(f"max_batch must be a power of two, got {self.max_batch}")
    if self.window_s < 0 or self.max_context < 1:
      raise ValueError("window_s must be >= 0 and max_context >= 1")


@dataclasses.dataclass(eq=False)
class Job:
  """One request in the batcher: its prompt, its sampled rows once `done` is set."""

  prompt_ids: List[int]
  request: ChatRequest
  done: threading.Event = dataclasses.field(default_factory=threading.Event)
  rows: Optional[List[List[int]]] = None  # n token lists (the end-of-turn id kept)
  error: Optional[BaseException] = None
  cancelled: bool = False


def batch_bucket(rows: int, max_batch: int) -> int:
  """The padded batch size of `rows` rows: a power of two, at most max_batch."""
  return min(max_batch, 1 << max(rows - 1, 0).bit_length())


def group_key(request: ChatRequest, job_id: int) -> Tuple:
  """Requests with equal keys share a sampler call."""
  if request.temperature == 0.0:
    return (0.0, 1.0, None)
  return (request.temperature, request.top_p, None if request.seed is None else job_id)


def finish_choice(tok, tokens: Sequence[int], stop: Sequence[str]) -> Tuple[str, int, str]:
  """(text, completion tokens, finish_reason) of one sampled row.

  The row ends at the end-of-turn id ("stop", the id counted, not in the text), at the first
  stop string of the decoded text ("stop": the text before it; tokens up to the one that
  completes it), or it ran out of max_tokens ("length").
  """
  tokens = list(tokens)
  ended = bool(tokens) and tokens[-1] == tok.eos_id
  body = tokens[:-1] if ended else tokens
  text = tok.decode(body)
  hits = [i for i in (text.find(s) for s in stop) if i >= 0]
  if hits:
    for k in range(1, len(body) + 1):
      if any(s in tok.decode(body[:k]) for s in stop):
        return text[: min(hits)], k, "stop"
  return text, len(tokens), "stop" if ended else "length"


class Batcher:
  """Owns the model and the sampling worker thread (see the module doc)."""

  def __init__(self, model, tokenizer, config: BatchConfig = BatchConfig()):
    self.model, self.tok, self.config = model, tokenizer, config
    self.sampler_calls = 0  # sampling.generate calls so far
    self.cancelled = 0  # jobs dropped before sampling
    self._queue: List[Job] = []
    self._cond = threading.Condition()
    self._held = False
    self._closed = False
    self._ids = itertools.count()
    self._key = jax.random.key(config.seed)
    self._thread = threading.Thread(target=self._loop, name="serve-sampler", daemon=True)
    self._thread.start()

  def submit(self, prompt_ids: List[int], request: ChatRequest) -> Job:
    """Queues a request; ApiError 400 when its prompt and reply cannot fit the context."""
    need = len(prompt_ids) + request.max_tokens
    if need > self.config.max_context:
      raise ApiError(
          400,
          f"the prompt has {len(prompt_ids)} tokens and max_tokens is {request.max_tokens}: "
          f"{need} > this server's context of {self.config.max_context} tokens",
          param="messages",
          code="context_length_exceeded",
      )
    job = Job(list(prompt_ids), request)
    with self._cond:
      if self._closed:
        raise ApiError(503, "the server is shutting down", kind="server_error")
      self._queue.append(job)
      self._cond.notify_all()
    return job

  def cancel(self, job: Job) -> None:
    """Drops a job: still queued, it is never sampled; being sampled, its reply is dropped."""
    with self._cond:
      if job.cancelled:
        return
      job.cancelled = True
      if job in self._queue:
        self._queue.remove(job)
        self.cancelled += 1

  def pending(self) -> int:
    """Jobs queued and not yet taken by the worker."""
    with self._cond:
      return len(self._queue)

  @contextlib.contextmanager
  def hold(self):
    """Keeps the worker from taking jobs inside the block (tests: a deterministic batch)."""
    with self._cond:
      self._held = True
    try:
      yield
    finally:
      with self._cond:
        self._held = False
        self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      for job in self._queue:
        job.error = ApiError(503, "the server is shutting down", kind="server_error")
        job.done.set()
      self._queue.clear()
      self._cond.notify_all()
    self._thread.join(timeout=60)

  def _take(self) -> Optional[List[Job]]:
    """The next jobs to sample (waits for them), None once closed."""
    with self._cond:
      while (not self._queue or self._held) and not self._closed:
        self._cond.wait()
      deadline = time.monotonic() + self.config.window_s
      while not self._closed:
        rows = sum(job.request.n for job in self._queue)
        left = deadline - time.monotonic()
        if rows >= self.config.max_batch or left <= 0:
          break
        self._cond.wait(left)
      if self._closed:
        return None
      jobs, self._queue = self._queue, []
      return jobs

  def _loop(self) -> None:
    while (jobs := self._take()) is not None:
      groups = {}
      for job in jobs:
        groups.setdefault(group_key(job.request, next(self._ids)), []).append(job)
      for group in groups.values():
        for chunk in self._chunks(group):
          try:
            self._sample(chunk)
          except Exception as e:  # a failed call fails its requests, never the server
            for job in chunk:
              job.error = e
          for job in chunk:
            job.done.set()

  def _chunks(self, jobs: List[Job]):
    """Consecutive jobs of at most max_batch rows together."""
    chunk, rows = [], 0
    for job in jobs:
      if chunk and rows + job.request.n > self.config.max_batch:
        yield chunk
        chunk, rows = [], 0
      chunk.append(job)
      rows += job.request.n
    if chunk:
      yield chunk

  def _sample(self, jobs: List[Job]) -> None:
    """One sampler call for `jobs` (same group key, at most max_batch rows)."""
    prompts = [job.prompt_ids for job in jobs for _ in range(job.request.n)]
    b = batch_bucket(len(prompts), self.config.max_batch)
    t = max(len(p) for p in prompts)
    ids_BxT = np.full((b, t), self.tok.pad_id, np.int32)
    mask_BxT = np.zeros((b, t), np.int32)
    for row, prompt in enumerate(prompts):
      ids_BxT[row, t - len(prompt) :] = prompt
      mask_BxT[row, t - len(prompt) :] = 1
    first = jobs[0].request
    options = sampling.SamplingOptions(
        max_new_tokens=sampling.bucket(max(job.request.max_tokens for job in jobs)),
        temperature=first.temperature,
        top_p=first.top_p,
        stop_token_ids=(self.tok.eos_id,),
        pad_id=self.tok.pad_id,
    )
    if first.seed is not None and first.temperature > 0:
      key = jax.random.key(first.seed % 2**32)
    else:
      key = jax.random.fold_in(self._key, self.sampler_calls)
    out = sampling.generate(self.model, ids_BxT, mask_BxT, key=key, options=options)
    self.sampler_calls += 1
    tokens_BxN, lengths_B = np.asarray(out.tokens_BxN), np.asarray(out.lengths_B)
    row = 0
    for job in jobs:
      job.rows = []
      for _ in range(job.request.n):
        length = min(int(lengths_B[row]), job.request.max_tokens)
        job.rows.append(tokens_BxN[row, :length].tolist())
        row += 1

"""Throughput of `ragen_jax.serve_model` at 1, 8 and 64 concurrent clients, against the
in-process sampler at the same batch.

    python -m experiments.bench.serve [--clients 1,8,64] [--requests 4] [--max_tokens 32]
        [--repeats 3]

The shipped tiny warm start is served on 127.0.0.1 (`--max_batch` 64, the default 10 ms window).
Each of C client threads sends `--requests` greedy chat requests one after another over its own
kept-alive connection (http.client: a light client, since the clients share the machine's cores
with the server), prompts drawn from a fixed list of Sokoban-like turns. Reported: requests/s
and completion tokens/s (the server's own usage counts) of a round, after a warm-up round at the
same concurrency and a direct compile of every batch bucket. The in-process side calls
`sampling.generate` on the same prompts at batch C (padded to the same bucket) with the same
options (median of 3 calls): requests/s = C / time, tokens/s = sampled tokens / time. Server
rounds and in-process calls alternate `--repeats` times (the machine's load drifts); medians are
printed. The ratio is the cost of HTTP, JSON, tokenisation, the collection window and partial
batches.
"""

import argparse
import http.client
import json
import statistics
import threading
import time

import jax
import numpy as np

from ragen_jax import sampling
from ragen_jax import serve_model
from ragen_jax import model_server
from ragen_jax.model_server import batcher as batcher_lib

PROMPTS = [
    f"\nTurn 1:\nState:\n######\n#_P__#\n#_X__#\n#__O_#\n######\nYou have {k} actions left."
    for k in range(1, 11)
]


def client_round(server, clients: int, requests: int, max_tokens: int):
  """(seconds, requests done, completion tokens) of `clients` threads x `requests` each."""
  body = lambda i: json.dumps(
      {
          "model": server.model_name,
          "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
          "max_tokens": max_tokens,
          "temperature": 0,
      }
  )
  tokens, lock = [0], threading.Lock()

  def run(c):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    for r in range(requests):
      conn.request("POST", "/v1/chat/completions", body(c + r), {"Content-Type": "text/json"})
      answer = json.loads(conn.getresponse().read())
      with lock:
        tokens[0] += answer["usage"]["completion_tokens"]
    conn.close()

  threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
  tic = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return time.perf_counter() - tic, clients * requests, tokens[0]


def in_process(model, tok, clients: int, max_tokens: int, max_batch: int, iters: int = 3):
  """(median seconds, sampled tokens) of one generate call on `clients` prompts."""
  prompts = [
      tok.encode_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], True)
      for i in range(clients)
  ]
  b, t = batcher_lib.batch_bucket(clients, max_batch), max(len(p) for p in prompts)
  ids = np.full((b, t), tok.pad_id, np.int32)
  mask = np.zeros((b, t), np.int32)
  for i, p in enumerate(prompts):
    ids[i, t - len(p) :], mask[i, t - len(p) :] = p, 1
  options = sampling.SamplingOptions(
      max_new_tokens=sampling.bucket(max_tokens),
      temperature=0.0,
      stop_token_ids=(tok.eos_id,),
      pad_id=tok.pad_id,
  )
  call = lambda: sampling.generate(model, ids, mask, key=jax.random.key(0), options=options)
  out = call()
  jax.block_until_ready(out)
  times = []
  for _ in range(iters):
    tic = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - tic)
  lengths = np.minimum(np.asarray(out.lengths_B), max_tokens)
  return (statistics.median(times) if times else None), int(lengths.sum())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--clients", default="1,8,64")
  parser.add_argument("--requests", type=int, default=4)
  parser.add_argument("--max_tokens", type=int, default=32)
  parser.add_argument("--max_batch", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  model, tok, name = serve_model.load()
  batch = model_server.BatchConfig(max_batch=args.max_batch)
  server = serve_model.make_server(model, tok, name, batch=batch, max_tokens=args.max_tokens)
  server.start()
  try:
    for b in (1 << k for k in range(args.max_batch.bit_length())):  # compile every bucket
      in_process(model, tok, b, args.max_tokens, args.max_batch, iters=0)
    for clients in (int(c) for c in args.clients.split(",")):
      client_round(server, clients, 1, args.max_tokens)  # warm-up
      calls = server.batcher.sampler_calls
      served, local = [], []
      for _ in range(args.repeats):  # alternated: the machine's load drifts
        seconds, done, tokens = client_round(server, clients, args.requests, args.max_tokens)
        served.append((done / seconds, tokens / seconds))
        ref_s, ref_tokens = in_process(model, tok, clients, args.max_tokens, args.max_batch)
        local.append((clients / ref_s, ref_tokens / ref_s))
      med = lambda pairs, j: round(statistics.median(p[j] for p in pairs), 1)
      row = dict(
          clients=clients,
          requests_per_round=clients * args.requests,
          sampler_calls_per_round=(server.batcher.sampler_calls - calls) / args.repeats,
          server_req_s=med(served, 0),
          server_tok_s=med(served, 1),
          inprocess_req_s=med(local, 0),
          inprocess_tok_s=med(local, 1),
      )
      print(json.dumps(row), flush=True)
  finally:
    server.close()


if __name__ == "__main__":
  main()

"""Independent references the tests share: NumPy loops for the advantage estimators
(`rl_math.md`), token log-probs, transformers' logits, the comparison of two runs' logged scalars, a run cut back
to one of its checkpoints, and a reader of W&B's offline run files."""

import glob
import json
import os
import shutil
import struct

import numpy as np

# Timings differ between any two runs; every other scalar of a resumed run equals the original's.
_TIMING = ("timing_s/", "perf/")


def ref_token_logprobs(logits_BxTxV, tokens_BxT, temperature, excluded=()):
  """float64 [B, T - 1]: log-prob of each next token under logits / temperature, the `excluded`
  ids (the vision tokens, outside a policy's support) left out of the normaliser."""
  logits = np.asarray(logits_BxTxV, np.float64) / temperature
  support = logits.copy()
  support[..., list(excluded)] = -np.inf
  top = support.max(-1, keepdims=True)
  logz = np.log(np.exp(support - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(logits[:, :-1], tokens_BxT[:, 1:, None], axis=-1)[..., 0]
  return picked - logz[:, :-1]


def ref_masked_whiten(x, m):
  x = np.asarray(x, np.float64)
  m = np.asarray(m, np.float64)
  n = m.sum()
  mu = (x * m).sum() / (n + 1e-8)
  var = (((x - mu) ** 2) * m).sum() / (n + 1e-8)
  var = var * n / (n - 1)
  return (x - mu) / np.sqrt(var + 1e-8)


def ref_gae(r, v, m, gamma, lam):
  b, t_len = r.shape
  adv = np.zeros((b, t_len))
  for i in range(b):
    nv, g = 0.0, 0.0
    for t in reversed(range(t_len)):
      delta = r[i, t] + gamma * nv - v[i, t]
      cand = delta + gamma * lam * g
      if m[i, t] == 1:
        nv, g = v[i, t], cand
      adv[i, t] = g
  return ref_masked_whiten(adv, m), adv + v


def hf_logits(model, ids_BxT, mask_BxT=None):
  """transformers logits; positions from the mask as in left-padded decoding."""
  import torch  # pylint: disable=import-outside-toplevel

  ids = torch.tensor(np.asarray(ids_BxT), dtype=torch.long)
  kwargs = {}
  if mask_BxT is not None:
    mask = torch.tensor(np.asarray(mask_BxT), dtype=torch.long)
    kwargs = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
  with torch.no_grad():
    return model(input_ids=ids, **kwargs).logits.numpy()


def comparable(scalars, steps):
  """{(tag, step): value} of a run's scalars at `steps`, timings left out."""
  return {
      (tag, step): value
      for tag, series in scalars.items()
      if not tag.startswith(_TIMING)
      for step, value in series
      if step in steps
  }


def run_cut_at(run_dir, workdir, step):
  """`workdir`: `run_dir` as it was when it saved checkpoint `step`, for the same command to
  resume. Its record (config.json) and checkpoints up to `step`; no event files, so what the
  resumed run logs is all its own, to compare with the whole run's."""
  os.makedirs(os.path.join(workdir, "checkpoints"))
  shutil.copy(os.path.join(run_dir, "config.json"), workdir)
  saved = [int(s) for s in os.listdir(os.path.join(run_dir, "checkpoints")) if s.isdigit()]
  assert step in saved, (step, saved)
  for s in saved:
    if s <= step:
      shutil.copytree(*(os.path.join(d, "checkpoints", str(s)) for d in (run_dir, workdir)))
  return workdir


# A W&B run file (`run-<id>.wandb`) is LevelDB's log format: after a 7-byte file header
# (":W&B", a 2-byte magic, a version byte), 32 KiB blocks of chunks, each a 7-byte header
# (checksum u32, length u16, type u8) and its bytes; a record too long for a block's rest is cut
# into FIRST, MIDDLE and LAST chunks, and a block's tail too short for a header is padding.
_WANDB_FILE_HEADER = 7
_WANDB_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _LAST = 1, 4


def wandb_records(run_dir):
  """Every record of the W&B run in `run_dir` (an offline-run-* directory), parsed with wandb's
  own protobuf schema (`wandb.proto.wandb_internal_pb2.Record`), in the order written."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel

  (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  with open(path, "rb") as fp:
    data = fp.read()
  assert data[:4] == b":W&B", path
  records, pending, pos = [], b"", _WANDB_FILE_HEADER
  while pos + _CHUNK_HEADER <= len(data):
    room = _WANDB_BLOCK - pos % _WANDB_BLOCK
    _, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
    if room < _CHUNK_HEADER or kind == 0:  # padding to the end of the block
      pos += room
      continue
    pending += data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
    pos += _CHUNK_HEADER + length
    if kind in (_FULL, _LAST):
      records.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b""
  return records


def _item_key(item):
  return ".".join(item.nested_key) or item.key


def wandb_history(run_dir):
  """The rows `run.log` wrote, as {key: value} (W&B's own `_step`, `_runtime`... included)."""
  return [
      {_item_key(item): json.loads(item.value_json) for item in record.history.item}
      for record in wandb_records(run_dir)
      if record.WhichOneof("record_type") == "history"
  ]


def wandb_config(run_dir):
  """The run's config as the records left it ({key: value}, W&B's `_wandb` left out)."""
  config = {}
  for record in wandb_records(run_dir):
    kind = record.WhichOneof("record_type")
    updates = record.run.config.update if kind == "run" else record.config.update
    if kind in ("run", "config"):
      config.update({_item_key(item): json.loads(item.value_json) for item in updates})
  config.pop("_wandb", None)
  return config

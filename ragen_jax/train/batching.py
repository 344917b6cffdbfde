"""The host side of a training step: the environments' batches joined into one, and the rollout's
metrics (RAGEN's per-tag rollout figures, where the rollout's time went, the batch's lengths).

Dimension legend: B rows (episodes, or one per turn with a context window), T tokens, K turns.
"""

import functools
from typing import Any, Dict, List

import jax
import numpy as np

from ragen_jax.batch import RolloutBatch
from ragen_jax.batch import TurnBatch


def _left_pad(x_BxT, value, width: int) -> np.ndarray:
  """The rightmost `width` columns of x, left-padded with `value` where it is narrower."""
  x_BxT = np.asarray(x_BxT)[:, -width:]
  return np.pad(x_BxT, ((0, 0), (width - x_BxT.shape[1], 0)), constant_values=value)


def _used_width(batch: RolloutBatch) -> int:
  """Columns from the earliest attended token of any row to the end (rows are left-padded)."""
  attended_BxT = np.asarray(batch.attention_mask_BxT) > 0
  first_B = np.where(attended_BxT.any(axis=1), attended_BxT.argmax(axis=1), attended_BxT.shape[1])
  return int(attended_BxT.shape[1] - first_B.min())


def join_batches(batches: List[RolloutBatch], pad_multiple: int, pad_id: int) -> RolloutBatch:
  """One host (numpy) batch from several environments' batches: left-padded to a common width,
  the longest sequence rounded up to a multiple of `pad_multiple` (the rollout's own, coarser
  length buckets are cut back to it), group ids offset so groups stay distinct; the per-turn
  records padded to the most turns (state keys need no offset: they are compared within a group)."""
  width = max(max(_used_width(b) for b in batches), 1)
  width += -width % pad_multiple
  pad = functools.partial(_left_pad, width=width)
  parts, offset, episodes = [], 0, 0
  per_turn = [b.row_episodes_R is not None for b in batches]
  if any(per_turn) and not all(per_turn):
    raise ValueError("batches of one training step mix one row per episode and one per turn")
  k = max((b.turns.mask_BxK.shape[1] for b in batches if b.turns is not None), default=0)
  for b in batches:
    parts.append(
        dict(
            tokens_BxT=pad(b.tokens_BxT, pad_id),
            attention_mask_BxT=pad(b.attention_mask_BxT, 0),
            loss_mask_BxT=pad(b.loss_mask_BxT, 0),
            logprobs_BxT=pad(b.logprobs_BxT, 0),
            token_rewards_BxT=pad(b.token_rewards_BxT, 0),
            group_ids_B=np.asarray(b.group_ids_B) + offset,
            scores_B=np.asarray(b.scores_B),
        )
    )
    if b.row_episodes_R is not None:  # one row per turn: rows point at the joined episodes
      parts[-1]["row_episodes_R"] = np.asarray(b.row_episodes_R) + episodes
    offset += int(np.max(np.asarray(b.group_ids_B))) + 1
    episodes += len(b.group_ids_B)
  joined = RolloutBatch(**{k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
  joined = joined.replace(frames_BxNxHxWx3=_join_frames([b.frames_BxNxHxWx3 for b in batches]))
  if any(b.turns is None for b in batches):
    return joined
  turns = [_pad_turns(b.turns, width, k) for b in batches]
  return joined.replace(turns=jax.tree.map(lambda *xs: np.concatenate(xs), *turns))


def _join_frames(frames):
  """The batches' row frames (RolloutBatch.frames_BxNxHxWx3) as one array, N the most of any;
  None when no batch has images."""
  if all(f is None for f in frames):
    return None
  if any(f is None for f in frames):
    raise ValueError("batches of one training step mix environments seen as images and as text")
  n = max(f.shape[1] for f in frames)
  # A row's frames past its own are unused: repeat the last.
  grow = lambda f: np.concatenate([f] + [f[:, -1:]] * (n - f.shape[1]), axis=1)
  return np.concatenate([grow(np.asarray(f)) for f in frames])


def _pad_turns(turns: TurnBatch, width: int, k: int) -> TurnBatch:
  """A batch's per-turn records at `width` tokens and `k` turns (padding: invalid turns)."""
  right = lambda x: np.pad(np.asarray(x), ((0, 0), (0, k - x.shape[1])))
  return TurnBatch(
      rewards_BxK=right(turns.rewards_BxK),
      mask_BxK=right(turns.mask_BxK),
      state_keys_BxK=right(turns.state_keys_BxK),
      token_turns_BxT=_left_pad(turns.token_turns_BxT, -1, width),
  )


def rollout_metrics(results: Dict[str, Any], prefix: str) -> Dict[str, float]:
  """RAGEN's per-tag rollout metrics (`<prefix>/<tag>/success`, ...) and overall means."""
  out, pooled = {}, {}
  for tag, result in results.items():
    for name, values in result.metrics.items():
      out[f"{prefix}/{tag}/{name}"] = float(np.mean(values))
      pooled.setdefault(name, []).append(values)
    for name, value in result.summary.items():
      if name.startswith("pass@"):
        out[f"{prefix}/{tag}/{name}"] = value
  for name, values in pooled.items():
    out[f"{prefix}/{name}"] = float(np.mean(np.concatenate(values)))
  return out


def add_env_metrics(env, result) -> None:
  """Adds the environment's own per-episode figures (`Env.episode_metrics` of each episode's
  last observation, e.g. 2048's `max_tile`) to a rollout result's metrics, so they are logged
  per tag as the rollout's are; a text environment has none."""
  figures = getattr(env, "episode_metrics", None)
  if figures is None or not result.episodes:
    return
  rows = [figures(ep.observation) for ep in result.episodes]
  for name in rows[0]:
    result.metrics[name] = np.array([row[name] for row in rows], np.float32)


def rollout_cost(results: Dict[str, Any]) -> Dict[str, float]:
  """Where the rollout's time went, summed over tags: the policy's prefill and decode, the
  environments, and the host's prompting, parsing and batch building; and the share of the
  decode loop's row-steps that sampled a token (stopped rows idle until the longest reply of
  their turn ends)."""
  out = {
      f"timing_s/gen_{name}": sum(r.summary[f"{name}_s"] for r in results.values())
      for name in ("decode", "env", "host")
  }
  slots = sum(r.summary["decode_steps"] * len(r.episodes) for r in results.values())
  sampled = sum(r.summary["generated_tokens"] for r in results.values())
  out["perf/decode_row_use"] = sampled / max(slots, 1)
  return out


def batch_metrics(batch: RolloutBatch) -> Dict[str, float]:
  """Lengths and size of the (host) training batch: per episode, or with a context window per
  played turn's row (`train/rows_used`: the share of the episodes x max_turns rows played)."""
  response = batch.loss_mask_BxT.sum(axis=1)
  attended = batch.attention_mask_BxT.sum(1)
  played = np.ones(response.shape, bool)
  if batch.row_episodes_R is not None:
    played = batch.loss_mask_BxT.any(axis=1)
  response, attended = response[played], attended[played]
  mean = lambda x: float(x.mean()) if x.size else 0.0
  out = {
      "response_length/mean": mean(response),
      "prompt_length/mean": float(attended.mean() - response.mean()) if response.size else 0.0,
      "train/batch_size": float(batch.tokens_BxT.shape[0]),
      "train/seq_len": float(batch.tokens_BxT.shape[1]),
  }
  if batch.row_episodes_R is not None:
    out["train/rows_used"] = float(played.mean())
  return out

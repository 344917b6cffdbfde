"""Who answers each turn: the LLM over its growing KV cache, or a scripted host policy.

    policy.respond(TurnInputs(...)) -> Replies(tokens_BxN, logprobs_BxN, lengths_B)

Both take this process's rows of the turn's appended tokens and return numpy replies for them.
`Rows` is the multi-process split of the batch; on one process it is the identity.

Dimension legend: B episodes (this process's rows), C appended chunk length, N reply tokens,
S cache capacity.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import distributed
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax.rollout.episodes import Episode


@dataclasses.dataclass(frozen=True)
class Rows:
  """The episodes [lo, hi) of a batch of `total` that this process plays."""

  lo: int
  hi: int
  total: int
  sharder: Any = None

  @property
  def split(self) -> bool:
    """Processes share the batch (each its rows); otherwise every process plays all of it."""
    return (self.lo, self.hi) != (0, self.total)

  def to_global(self, x_local):
    """A [local rows, ...] host array as the global [B, ...] batch array (split runs only)."""
    if not self.split:
      return x_local
    axes = ("batch",) + (None,) * (np.ndim(x_local) - 1)
    return distributed.global_rows(x_local, self.sharder.named(axes), self.total)

  def to_local(self, tree):
    return distributed.local_rows(tree, self.lo, self.hi)

  def agree_max(self, values: List[int]) -> List[int]:
    """Every process must agree on whether to go on and on padded widths (same calls, same
    shapes); the maximum over processes."""
    return list(distributed.agree_max(values)) if self.split else values

  def gather(self, eps: List[Episode], stats: Dict[str, int], turn_steps: List[int]):
    """Every process's episodes in batch order, with the counters of the whole batch."""
    if not self.split:
      return eps, stats, turn_steps
    parts = distributed.allgather(((self.lo, self.hi), eps, stats, turn_steps))
    by_rows = {}
    for part_rows, part_eps, part_stats, part_steps in parts:
      by_rows.setdefault(tuple(part_rows), (part_eps, part_stats, part_steps))  # replicas agree
    eps, steps, stats = [], [], dict(stats)
    for name in ("prefill_tokens_append", "prefill_tokens_reencode", "generated_tokens"):
      stats[name] = sum(p[1][name] for p in by_rows.values())
    for (lo, hi), (part_eps, _, part_steps) in sorted(by_rows.items()):
      if lo != len(eps):
        raise RuntimeError(f"gathered episodes do not tile the batch: rows {lo}..{hi}")
      eps += part_eps
      steps.append(part_steps)
    if len(eps) != self.total:
      raise RuntimeError(f"gathered {len(eps)} episodes of {self.total}")
    # Every process ran the same number of turns; a turn's decode ran to the longest reply.
    return eps, stats, [max(s) for s in zip(*steps)]


@dataclasses.dataclass
class TurnInputs:
  """One turn's request to a policy (host arrays over this process's rows)."""

  turn: int  # 1-based
  ids_BxC: np.ndarray  # appended tokens, left-padded
  mask_BxC: np.ndarray
  active_B: np.ndarray  # bool: the episode plays this turn
  episodes: List[Episode]
  states: Callable[[Sequence[int]], Dict[int, Any]]  # episodes' states (rollout.env_batch)
  key: jax.Array


@dataclasses.dataclass
class Replies:
  tokens_BxN: np.ndarray
  logprobs_BxN: np.ndarray
  lengths_B: np.ndarray


class LLMPolicy:
  """Samples with `model`; owns the batch's KV cache, which grows turn by turn."""

  def __init__(self, model: models.Qwen2, capacity: int, options: dict, rows: Rows):
    self.graphdef, self.params = nnx.split(model)
    self.capacity, self.options, self.rows = capacity, options, rows
    self.cache = models.init_cache(model.config, rows.total, capacity)
    if rows.sharder is not None:
      self.cache = jax.device_put(self.cache, rows.sharder.cache(self.cache))

  def respond(self, inputs: TurnInputs) -> Replies:
    # This process's rows -> the global batch (unchanged on a single process).
    ids_BxC, mask_BxC, active_B = (
        self.rows.to_global(x) for x in (inputs.ids_BxC, inputs.mask_BxC, inputs.active_B)
    )
    if inputs.turn > 1:
      self.cache = sampling.compact(self.cache, jnp.asarray(active_B))
    # The context check guarantees the fit; extend() raises loudly otherwise.
    window = sampling.window_for(
        int(self.cache.end_index) + ids_BxC.shape[1] + self.options["max_new_tokens"],
        self.capacity,
    )
    out, self.cache = sampling.extend(
        self.graphdef,
        self.params,
        self.cache,
        ids_BxC,
        mask_BxC,
        jnp.asarray(active_B),
        inputs.key,
        window=window,
        **self.options,
    )
    return Replies(*self.rows.to_local(out))


class ScriptedPolicy:
  """Host replies `fn(state, episode) -> text` after the generation prefix, tokenised and
  recorded as sampled tokens with log-prob 0 (a supervised demonstration)."""

  def __init__(self, fn: Callable[[Any, Episode], str], tokenizer, max_new_tokens: int):
    self.fn, self.tok, self.max_new_tokens = fn, tokenizer, max_new_tokens

  def respond(self, inputs: TurnInputs) -> Replies:
    active = [int(i) for i in np.flatnonzero(inputs.active_B)]
    states = inputs.states(active)
    replies = {i: self.tok.encode(self.fn(states[i], inputs.episodes[i])) for i in active}
    width = max(max((len(r) for r in replies.values()), default=1), 1)
    if width > self.max_new_tokens:
      raise ValueError(
          f"a scripted reply has {width} tokens, more than max_new_tokens={self.max_new_tokens}"
      )
    tokens_BxN = np.full((len(inputs.active_B), width), self.tok.pad_id, np.int32)
    lengths_B = np.zeros((len(inputs.active_B),), np.int32)
    for i, reply in replies.items():
      tokens_BxN[i, : len(reply)] = reply
      lengths_B[i] = len(reply)
    return Replies(tokens_BxN, np.zeros(tokens_BxN.shape, np.float32), lengths_B)

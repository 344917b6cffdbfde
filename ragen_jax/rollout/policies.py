"""Who answers each turn: the model over its growing KV cache, a scripted host policy, or an
endpoint (rollout.api_policy). The caller builds the policy; the rollout starts it on its batch.

    engine.run(ModelPolicy(model), key, seed)        # or ScriptedPolicy(fn), api_policy.ApiPolicy
    turns = policy.start(engine)                      # the policy's play of one batch
    turns.rows                                        # the episodes this process answers for
    turns.respond(TurnInputs(...)) -> Replies(tokens_BxN, logprobs_BxN, lengths_B)

Every kind takes its rows of the turn's appended tokens and returns numpy replies for them.
`Rows` is the multi-process split of the batch; on one process it is the identity.

Dimension legend: B episodes (this process's rows), C appended chunk length, N reply tokens,
P system tokens, S cache capacity.
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
from ragen_jax.rollout import images
from ragen_jax.rollout.episodes import Episode


@dataclasses.dataclass(frozen=True)
class Rows:
  """The episodes [lo, hi) of a batch of `total` that this process plays."""

  lo: int
  hi: int
  total: int
  sharder: Any = None

  @classmethod
  def whole(cls, total: int) -> "Rows":
    """Every episode of the batch (a host policy: every process plays all of it)."""
    return cls(0, total, total)

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
  # The batch's sampling options, for plain and tool turns alike (with tools declared, a reply
  # also stops at "</tool_call>").
  options: sampling.SamplingOptions
  # Visual environments: every row's current frame, uint8 [B, H, W, 3] on the device
  # (rollout.images); None for text.
  frames: Any = None


@dataclasses.dataclass
class Replies:
  tokens_BxN: np.ndarray
  logprobs_BxN: np.ndarray
  lengths_B: np.ndarray
  # Rows the policy could not answer (an endpoint that stayed down): row -> its
  # envs.host.records.EnvFault; the episode ends as on an environment fault.
  faults: Dict[int, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def of_host(cls, replies: Dict[int, List[int]], b: int, pad_id: int, faults=None) -> "Replies":
    """Host-made replies {row: tokens}, recorded as sampled tokens with log-prob 0."""
    width = max([len(r) for r in replies.values()] + [1])
    tokens_BxN = np.full((b, width), pad_id, np.int32)
    lengths_B = np.zeros((b,), np.int32)
    for i, reply in replies.items():
      tokens_BxN[i, : len(reply)] = reply
      lengths_B[i] = len(reply)
    return cls(tokens_BxN, np.zeros(tokens_BxN.shape, np.float32), lengths_B, faults or {})


class ModelPolicy:
  """The model answers every turn, sampling over a KV cache of this process's rows."""

  def __init__(self, model: models.Qwen2):
    self.model = model

  def start(self, engine) -> "ModelTurns":
    rows = Rows(*engine.rows, engine.batch_size, engine.sharder)
    turns = ModelTurns(self.model, engine.capacity, rows, engine.layout)
    # A chunk shows its turn's image and, in a window, the k kept turns' (rollout.images).
    window, max_turns = engine.layout.window, engine.config.max_turns
    per_prompt = 1 if window is None else min(window + 1, max_turns)
    turns.images = engine.shown.start(turns.model_inputs, rows.total, max_turns, per_prompt)
    if rows.split and engine.shown.vision_ids:
      raise ValueError("a rollout with images plays on one process")
    turns.vision_ids = engine.shown.vision_ids
    return turns


class ModelTurns:
  """The model's play of one batch: it owns the batch's KV cache, which the context layout
  (rollout.layouts) grows turn by turn or reopens each turn."""

  def __init__(self, model: models.Qwen2, capacity: int, rows: Rows, layout):
    self.graphdef, self.params = nnx.split(model)
    self.model_inputs = (self.graphdef, self.params, model.config)
    self.capacity, self.rows, self.layout = capacity, rows, layout
    # The images the turns show (rollout.images; ModelPolicy.start sets them): none by default.
    self.images, self.vision_ids = images.TextTurns(None), ()
    self.cache = models.init_cache(model.config, rows.total, capacity)
    self._system_cache = None  # window layouts: the system message's slots
    if rows.sharder is not None:
      self.cache = jax.device_put(self.cache, rows.sharder.cache(self.cache))

  def respond(self, inputs: TurnInputs) -> Replies:
    options = inputs.options
    # This process's rows -> the global batch (unchanged on a single process).
    ids_BxC, mask_BxC, active_B = (
        self.rows.to_global(x) for x in (inputs.ids_BxC, inputs.mask_BxC, inputs.active_B)
    )
    ids_BxC, mask_BxC = self.layout.ready_cache(self, inputs, ids_BxC, mask_BxC, active_B)
    chunk_images = self.images.chunk(inputs.turn, inputs.frames, ids_BxC, mask_BxC)
    # The context check guarantees the fit; extend() raises loudly otherwise.
    window = sampling.window_for(
        int(self.cache.end_index) + ids_BxC.shape[1] + options.max_new_tokens,
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
        options=options,
        images=chunk_images,
    )
    return Replies(*self.rows.to_local(out))

  def grow(self, inputs: TurnInputs, ids_BxC, mask_BxC, active_B):
    """Full context: the rows' chunks extend the cache, after the holes of stopped rows close;
    on the first turn, what every prompt shares is prefilled once. Returns the chunks left."""
    if inputs.turn > 1:
      self.cache = sampling.compact(self.cache, jnp.asarray(active_B))
    elif not self.rows.split:  # a split batch's other rows are not on this host to compare
      shared = split_shared_prefix(
          ids_BxC, mask_BxC, active_B, inputs.options.pad_id, stop_ids=self.vision_ids
      )
      if shared is not None:
        prefix_1xP, prefix_mask_1xP, ids_BxC, mask_BxC = shared
        self.cache = sampling.prefill_shared(
            self.graphdef,
            self.params,
            self.cache,
            prefix_1xP,
            prefix_mask_1xP,
            jnp.asarray(active_B),
        )
    return ids_BxC, mask_BxC

  def prefill_system(self, ids_BxP, mask_BxP) -> None:
    """Window layouts: the system message's keys and values, prefilled once: one row when every
    row holds the same tokens, else one per row."""
    shared = not self.rows.split and bool(np.all(ids_BxP == ids_BxP[:1]))
    if shared:
      ids_BxP, mask_BxP = ids_BxP[:1], mask_BxP[:1]
    else:
      ids_BxP, mask_BxP = self.rows.to_global(ids_BxP), self.rows.to_global(mask_BxP)
    self._system_cache = sampling.prefill(self.graphdef, self.params, ids_BxP, mask_BxP)

  def restore_system(self) -> None:
    """Window layouts: an emptied cache opened by the system message's slots."""
    self.cache = sampling.restore_prefix(self.cache, self._system_cache)


def split_shared_prefix(
    ids_BxC, mask_BxC, active_B, pad_id: int, min_prefix: int = 64, stop_ids=()
):
  """The first prompts' common beginning and each row's rest, when sharing it pays.

  The beginning ends before any of `stop_ids` (an image's first token: the rows' images
  differ where their tokens do not).

  Returns (prefix_1xP, its mask, rest_BxR, its mask), each left-padded to its `sampling.bucket`,
  or None: fewer than two active rows, or no prefix of at least `min_prefix` tokens whose two
  parts fit the whole prompts' C slots. Of those that fit, the longest prefix: the rows' own
  prefill is what costs. Every row keeps at least one token of its own (its first sample reads
  the last one's logits).
  """
  rows = {int(i): ids_BxC[i][mask_BxC[i] > 0] for i in np.flatnonzero(active_B)}
  if len(rows) < 2:
    return None
  n = min(len(r) for r in rows.values()) - 1
  first_N = np.stack([r[:n] for r in rows.values()])
  same_N = np.all(first_N == first_N[0], axis=0)
  common = n if same_N.all() else int(np.argmin(same_N))
  stops = np.flatnonzero(np.isin(first_N[0, :common], stop_ids))
  common = int(stops[0]) if stops.size else common
  longest = max(len(r) for r in rows.values())
  # The common length itself, or a bucket size below it (no padding in the prefix's slots).
  sizes = [common] + [v for v in (16, 32, 64, *range(128, common, 128)) if v < common]
  fits = [
      q
      for q in sizes
      if q >= min_prefix and sampling.bucket(q) + sampling.bucket(longest - q) <= ids_BxC.shape[1]
  ]
  if not fits:
    return None
  p = max(fits)
  wp, wr = sampling.bucket(p), sampling.bucket(longest - p)
  prefix_1xP = np.full((1, wp), pad_id, np.int32)
  prefix_1xP[0, wp - p :] = first_N[0, :p]
  prefix_mask_1xP = np.zeros((1, wp), np.int32)
  prefix_mask_1xP[0, wp - p :] = 1
  rest_BxR = np.full((len(active_B), wr), pad_id, np.int32)
  rest_mask_BxR = np.zeros((len(active_B), wr), np.int32)
  for i, r in rows.items():
    rest_BxR[i, wr - (len(r) - p) :] = r[p:]
    rest_mask_BxR[i, wr - (len(r) - p) :] = 1
  return prefix_1xP, prefix_mask_1xP, rest_BxR, rest_mask_BxR


class ScriptedPolicy:
  """Host replies `fn(state, episode) -> text` after the generation prefix, tokenised and
  recorded as sampled tokens with log-prob 0 (a supervised demonstration); see
  `Rollout.run_scripted`."""

  def __init__(self, fn: Callable[[Any, Episode], str]):
    self.fn = fn

  def start(self, engine) -> "ScriptedTurns":
    rows = Rows.whole(engine.batch_size)
    return ScriptedTurns(self.fn, engine.tok, engine.config.max_new_tokens, rows)


@dataclasses.dataclass(frozen=True)
class ScriptedTurns:
  """A scripted policy's play of one batch (every episode of it)."""

  fn: Callable[[Any, Episode], str]
  tok: Any
  max_new_tokens: int
  rows: Rows

  def respond(self, inputs: TurnInputs) -> Replies:
    active = [int(i) for i in np.flatnonzero(inputs.active_B)]
    states = inputs.states(active)
    replies = {i: self.tok.encode(self.fn(states[i], inputs.episodes[i])) for i in active}
    width = max([len(r) for r in replies.values()] + [1])
    if width > self.max_new_tokens:
      raise ValueError(
          f"a scripted reply has {width} tokens, more than max_new_tokens={self.max_new_tokens}"
      )
    return Replies.of_host(replies, len(inputs.active_B), self.tok.pad_id)

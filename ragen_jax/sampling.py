"""KV-cache sampling for ragen_jax.models.Qwen2: jitted prefill + `lax.while_loop` decode.

    from ragen_jax import sampling
    options = sampling.SamplingOptions(max_new_tokens=64, temperature=1.0, top_p=1.0, top_k=0,
                                       stop_token_ids=(eos_id,))
    out = sampling.generate(model, input_ids_BxT, attention_mask_BxT, key=key, options=options)
    out.tokens_BxN, out.logprobs_BxN, out.lengths_B

Prompts are left-padded (mask 0 on the left). Prompt lengths are bucketed (powers of two up to
128, then multiples of 128) by adding more left padding, so new lengths reuse compiled code.
One jitted call runs the prefill and the whole decode loop; the loop exits as soon as every row
has stopped. A row stops on a stop token id, on a stop token sequence (e.g. the ids of
"</answer>" when it is several tokens), or after `max_new_tokens`; later slots hold `pad_id`.

`extend` is the same program over an existing cache (the multi-turn rollout appends each new
user turn to it, with its images: `ChunkImages`, the features and the chunk's M-RoPE positions;
the cache's rope delta carries the positions images imply into later chunks and decode steps); `prefill_shared` puts a prompt every row shares into an empty cache at the cost
of one row; `prefill` and `restore_prefix` keep a prompt's slots and open an emptied cache with
them (a context window's system message, every turn); `compact` squeezes the holes out of a
cache. Cache slots: a decode step of a
row that has stopped writes a padding slot (mask 0), so a cache may hold holes; positions count
only real slots, so holes never change the logits.

Log-probs: `logprobs[b, i]` is log softmax(logits / temperature) of the sampled token, i.e. under
the temperature-scaled distribution before top-k / top-p truncation (what a trainer recomputes
with a full forward pass). Greedy decoding (temperature 0) reports temperature-1 log-probs.
The model's `config.excluded_token_ids` (Qwen2.5-VL's vision tokens) are never sampled: their
logits are -inf here and the trainer's scorers give them no mass either.

A decode step is the model's own forward over one token per row (`Qwen2.decode`): the loop
carries the cache one array per layer (`models.LayerCache`, made once per call) and each layer's
weights beside it (`Decoder.layer_weights`, taken out of the stack once per call), so each step
updates every layer's buffer in place and attends over a window of slots, not the whole
capacity. Tests hold it to transformers' greedy output and to a full forward.

Dimension legend: B batch, T prompt (or appended chunk) length, N max new tokens, S cache
capacity, V vocab, L layers, D model dim, H query heads, K kv heads, G = H // K, Dh head dim,
Q length of a stop sequence.
"""

import dataclasses
import functools
from typing import Annotated, NamedTuple, Sequence

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import models

# pylint: disable-next=unused-import  # the cache edits are part of the sampler's API
from ragen_jax.cache_edits import compact, prefill, prefill_shared, restore_prefix, window_for
from ragen_jax.config_checks import check_fields, NonNegativeFloat, NonNegativeInt, PositiveInt
from ragen_jax.config_checks import Range


@struct.dataclass
class ChunkImages:
  """The images of an appended chunk, as the sampler's prefill takes them.

  Attributes:
    features_BxIxD: each row's image features (the vision tower's output), spliced into that
      row's image-pad tokens in order; a row may use fewer (or none).
    positions_3xBxT: the chunk's M-RoPE positions, counted from each row's next position
      (`models.mrope.rope_index` of the chunk alone).
    rope_delta_B: how far the chunk moves each row's next position beyond its token count.
  """

  features_BxIxD: jax.Array
  positions_3xBxT: jax.Array
  rope_delta_B: jax.Array

  def decoder_arguments(self) -> dict:
    return dict(
        image_features_IxD=self.features_BxIxD,
        positions_BxT=self.positions_3xBxT,
        rope_delta_B=self.rope_delta_B,
    )


def _image_arguments(images: ChunkImages | None) -> dict:
  return {} if images is None else images.decoder_arguments()


class SampleOutput(NamedTuple):
  tokens_BxN: jax.Array  # int32, pad_id after a row stops
  logprobs_BxN: jax.Array  # float32, 0 after a row stops
  lengths_B: jax.Array  # int32, sampled tokens per row (stop token included)


def _normalise_stops(stop_token_ids: Sequence[int], stop_sequences: Sequence[Sequence[int]]):
  ids = set(int(i) for i in stop_token_ids)
  seqs = []
  for seq in stop_sequences:
    seq = tuple(int(i) for i in seq)
    if not seq:
      raise ValueError("empty stop sequence")
    if len(seq) == 1:
      ids.add(seq[0])
    else:
      seqs.append(seq)
  return tuple(sorted(ids)), tuple(sorted(set(seqs)))


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """What to sample: validated, hashable, the one static argument of the decode program.

  Fields are normalised on construction (ints, floats, sorted tuples; a one-token stop
  sequence becomes a stop id), so equal options hash equal and reuse compiled code.

  Attributes:
    max_new_tokens: N, the most tokens sampled per row.
    temperature: 0 = greedy.
    top_p: nucleus mass (1 = off).
    top_k: keep the k most likely tokens (0 = off).
    stop_token_ids: ids that end a row (the stop token is kept and counted).
    stop_sequences: token-id sequences that end a row once sampled in full (e.g. the ids of
      "</answer>").
    pad_id: written after a row stops.
  """

  max_new_tokens: PositiveInt
  temperature: NonNegativeFloat = 1.0
  top_p: Annotated[float, Range(0, 1, open_low=True)] = 1.0
  top_k: NonNegativeInt = 0
  stop_token_ids: tuple[int, ...] = ()
  stop_sequences: tuple[tuple[int, ...], ...] = ()
  pad_id: int = 0

  def __post_init__(self):
    check_fields(self, "sampling")
    ids, seqs = _normalise_stops(self.stop_token_ids, self.stop_sequences)
    normalised = dict(
        max_new_tokens=int(self.max_new_tokens),
        temperature=float(self.temperature),
        top_p=float(self.top_p),
        top_k=int(self.top_k),
        stop_token_ids=ids,
        stop_sequences=seqs,
        pad_id=int(self.pad_id),
    )
    for name, value in normalised.items():
      object.__setattr__(self, name, value)


@struct.dataclass
class DecodeState:
  """Carry of the decode loop."""

  step: jax.Array  # int32 scalar: index of the next token to sample
  cache: models.LayerCache  # holds the prompt and every sampled token but the last
  weights: models.LayerWeights  # each layer's weights, taken out of the stack once per call
  last_B: jax.Array  # int32: the most recent sampled token of each row
  done_B: jax.Array  # bool: the row has stopped (or was never active)
  tokens_BxN: jax.Array  # int32
  logprobs_BxN: jax.Array  # float32
  lengths_B: jax.Array  # int32
  key: jax.Array  # PRNG key


def bucket(n: int) -> int:
  """Padded length for n: a power of two up to 128, then a multiple of 128.

  Coarser buckets compile fewer programs but prefill more padding: a multi-turn rollout's first
  prompt (~320 tokens for RAGEN's Sokoban) took 512 slots with multiples of 256.
  """
  n = max(int(n), 1)
  if n <= 128:
    return max(16, 1 << (n - 1).bit_length())
  return -(-n // 128) * 128


def generate_capacity(prompt_len: int, max_new_tokens: int) -> int:
  """Cache slots `generate` allocates: the bucketed prompt and the bucketed new tokens."""
  return bucket(prompt_len) + bucket(max_new_tokens)


def filter_logits(
    logits_BxV: jax.Array, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> jax.Array:
  """Temperature, then top-k, then top-p (transformers' warper order); removed entries -inf.

  top-k keeps every logit >= the k-th largest; top-p keeps the smallest set of most likely
  tokens whose probability reaches top_p (always at least one).
  """
  scaled_BxV = logits_BxV.astype(jnp.float32) / temperature
  if top_k > 0 and top_k < scaled_BxV.shape[-1]:
    kth_Bx1 = jax.lax.top_k(scaled_BxV, top_k)[0][:, -1:]
    scaled_BxV = jnp.where(scaled_BxV < kth_Bx1, -jnp.inf, scaled_BxV)
  if top_p < 1.0:
    sorted_BxV = -jnp.sort(-scaled_BxV, axis=-1)
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    # Keep a token while the mass strictly above it is below top_p: the same set as
    # transformers' "drop while cumulative (ascending) mass <= 1 - top_p".
    kept_B = jnp.sum(mass_before_BxV < top_p, axis=-1)
    cutoff_Bx1 = jnp.take_along_axis(sorted_BxV, kept_B[:, None] - 1, axis=-1)
    scaled_BxV = jnp.where(scaled_BxV < cutoff_Bx1, -jnp.inf, scaled_BxV)
  return scaled_BxV


def _sample(logits_BxV, key, *, temperature, top_k, top_p, excluded_ids=()):
  """(token_B, logprob_B) of one sampling step; `excluded_ids` (`ModelConfig.
  excluded_token_ids`) are outside the distribution, as every scorer of policy tokens has it."""
  logits_BxV = logits_BxV.astype(jnp.float32)
  if excluded_ids:  # no mask at all without them: text programs are unchanged
    logits_BxV = logits_BxV.at[:, jnp.asarray(excluded_ids, jnp.int32)].set(-jnp.inf)
  if temperature == 0.0:
    token_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    logp_BxV = jax.nn.log_softmax(logits_BxV, axis=-1)
  else:
    logp_BxV = jax.nn.log_softmax(logits_BxV / temperature, axis=-1)
    filtered_BxV = filter_logits(logits_BxV, temperature, top_k, top_p)
    token_B = jax.random.categorical(key, filtered_BxV, axis=-1).astype(jnp.int32)
  return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]


def _stopped(tokens_BxN, step, token_B, stop_token_ids, stop_sequences):
  """True where the token just written at `step` ends the row."""
  hit_B = jnp.zeros(token_B.shape, bool)
  for stop_id in stop_token_ids:
    hit_B |= token_B == stop_id
  for seq in stop_sequences:
    k = len(seq)
    if k > tokens_BxN.shape[1]:  # longer than a reply: never sampled in full
      continue
    window_BxQ = jax.lax.dynamic_slice_in_dim(tokens_BxN, jnp.maximum(step - k + 1, 0), k, axis=1)
    hit_B |= jnp.all(window_BxQ == jnp.asarray(seq, jnp.int32)[None], axis=1) & (step >= k - 1)
  return hit_B


def _decode(
    graphdef,
    params,
    cache,
    ids_BxT,
    mask_BxT,
    active_B,
    key,
    *,
    options: SamplingOptions,
    window=None,
    images: ChunkImages | None = None,
):
  """Appends ids_BxT (with `images` in it, if any) to the cache, then samples up to N tokens
  per active row."""
  model = nnx.merge(graphdef, params)
  b, n = ids_BxT.shape[0], options.max_new_tokens
  pad_id = options.pad_id
  stops = (options.stop_token_ids, options.stop_sequences)
  sample = functools.partial(
      _sample,
      temperature=options.temperature,
      top_k=options.top_k,
      top_p=options.top_p,
      excluded_ids=model.config.excluded_token_ids,
  )
  full_cache = cache
  window = cache.capacity if window is None else window
  # The weights once, here: sliced out of the stack inside the loop, copied every step. The
  # prefill attends over the window too, not the whole capacity.
  weights = model.decoder.layer_weights()
  cache = cache.per_layer(window)
  hidden_BxTxD, cache = model.decoder.decode(
      ids_BxT, mask_BxT, cache=cache, weights=weights, **_image_arguments(images)
  )
  # Only the last position's logits are sampled from: no [B, T, V] logits for a long prompt.
  logits_BxV = model.logits(hidden_BxTxD[:, -1:])[:, 0]
  key, sub = jax.random.split(key)
  token_B, logp_B = sample(logits_BxV, sub)
  tokens_BxN = (
      jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(jnp.where(active_B, token_B, pad_id))
  )
  logprobs_BxN = jnp.zeros((b, n), jnp.float32).at[:, 0].set(jnp.where(active_B, logp_B, 0.0))
  done_B = ~active_B | _stopped(tokens_BxN, 0, token_B, *stops)
  state = DecodeState(
      step=jnp.int32(1),
      cache=cache,
      weights=weights,
      last_B=token_B,
      done_B=done_B,
      tokens_BxN=tokens_BxN,
      logprobs_BxN=logprobs_BxN,
      lengths_B=active_B.astype(jnp.int32),
      key=key,
  )

  def cond(s: DecodeState):
    return (s.step < n) & ~jnp.all(s.done_B)

  def body(s: DecodeState):
    # Stopped rows feed a padding step (mask 0): a hole in the cache, invisible to attention.
    live_B = ~s.done_B
    logits_Bx1xV, cache = model.decode(
        s.last_B[:, None], live_B[:, None], cache=s.cache, weights=s.weights
    )
    logits_BxV = logits_Bx1xV[:, 0]
    key, sub = jax.random.split(s.key)
    token_B, logp_B = sample(logits_BxV, sub)
    token_B = jnp.where(live_B, token_B, pad_id)
    tokens_BxN = jax.lax.dynamic_update_slice_in_dim(s.tokens_BxN, token_B[:, None], s.step, 1)
    logprobs_BxN = jax.lax.dynamic_update_slice_in_dim(
        s.logprobs_BxN, jnp.where(live_B, logp_B, 0.0)[:, None], s.step, 1
    )
    done_B = s.done_B | _stopped(tokens_BxN, s.step, token_B, *stops)
    return DecodeState(
        step=s.step + 1,
        cache=cache,
        weights=s.weights,
        last_B=jnp.where(live_B, token_B, s.last_B),
        done_B=done_B,
        tokens_BxN=tokens_BxN,
        logprobs_BxN=logprobs_BxN,
        lengths_B=s.lengths_B + live_B,
        key=key,
    )

  state = jax.lax.while_loop(cond, body, state)
  return (
      SampleOutput(state.tokens_BxN, state.logprobs_BxN, state.lengths_B),
      state.cache.into(full_cache),
  )


_decode_jit = jax.jit(
    _decode, static_argnames=("graphdef", "options", "window"), donate_argnames=("cache",)
)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "capacity", "options"))
def _generate_jit(graphdef, params, ids_BxT, mask_BxT, key, images, *, config, capacity, options):
  cache = models.init_cache(config, ids_BxT.shape[0], capacity)
  chunk = None
  if images is not None:  # the tower runs here, once, on every image of the prompts
    features_IxD = nnx.merge(graphdef, params).image_features(images)
    chunk = ChunkImages(features_IxD, images.positions_3xBxT, images.rope_delta_B)
  out, _ = _decode(
      graphdef,
      params,
      cache,
      ids_BxT,
      mask_BxT,
      jnp.any(mask_BxT > 0, axis=1),
      key,
      options=options,
      images=chunk,
  )
  return out


def generate(
    model: models.Qwen2,
    input_ids,
    attention_mask,
    *,
    key: jax.Array,
    options: SamplingOptions,
    pixel_values=None,
    image_grid_thw=None,
) -> SampleOutput:
  """Samples continuations of left-padded prompts.

  Args:
    model: the causal LM.
    input_ids: int [B, T] prompts, left-padded.
    attention_mask: [B, T], 0 on the left padding; a row of zeros samples nothing.
    key: PRNG key (unused when temperature is 0).
    options: what to sample (N, temperature, top-k / top-p, stops, padding).
    pixel_values, image_grid_thw: Qwen2.5-VL: the prompts' images, as transformers takes them
      (`ragen_jax.vision.preprocess`), in the order their image tokens appear row after row.

  Returns:
    SampleOutput(tokens_BxN, logprobs_BxN, lengths_B).
  """
  pad_id = options.pad_id
  ids_BxT = np.asarray(input_ids, np.int32)
  mask_BxT = np.asarray(attention_mask, np.int32)
  b, t = ids_BxT.shape
  tb = bucket(t)
  ids_BxT = np.concatenate([np.full((b, tb - t), pad_id, np.int32), ids_BxT], axis=1)
  mask_BxT = np.concatenate([np.zeros((b, tb - t), np.int32), mask_BxT], axis=1)
  images = None
  if pixel_values is not None:  # positions of the padded prompts, on the host
    images = models.prepare_images(model.config, ids_BxT, mask_BxT, pixel_values, image_grid_thw)
  graphdef, params = nnx.split(model)
  return _generate_jit(
      graphdef,
      params,
      ids_BxT,
      mask_BxT,
      key,
      images,
      config=model.config,
      capacity=generate_capacity(t, options.max_new_tokens),
      options=options,
  )


def extend(
    graphdef,
    params,
    cache: models.KVCache,
    ids_BxT,
    mask_BxT,
    active_B,
    key,
    *,
    options: SamplingOptions,
    window: int | None = None,
    images: ChunkImages | None = None,
) -> tuple[SampleOutput, models.KVCache]:
  """`generate` over an existing cache: appends ids_BxT (left-padded), then samples.

  The cache is donated. The last sampled token of each row is NOT written to the returned
  cache; a caller that continues the conversation puts it first in its next chunk.

  Args:
    graphdef, params: `nnx.split(model)`.
    cache: holds the conversation so far; needs T + N free slots after end_index.
    ids_BxT, mask_BxT: the new tokens, left-padded (T should be bucketed by the caller).
    active_B: rows that sample; others only pad.
    key: PRNG key.
    options: what to sample.
    window: static number of leading cache slots the decode loop attends over (None = all);
      callers bucket it (`window_for`) so that it takes few values.
    images: Qwen2.5-VL: the images in ids_BxT (their features and the chunk's positions).

  Returns:
    (SampleOutput, the updated cache).

  Raises:
    ValueError: the new tokens and N samples do not fit the cache (or the window).
  """
  limit = cache.capacity if window is None else min(window, cache.capacity)
  need = int(cache.end_index) + ids_BxT.shape[1] + options.max_new_tokens
  if need > limit:
    raise ValueError(f"{need} slots needed but the cache (window) has {limit}")
  return _decode_jit(
      graphdef,
      params,
      cache,
      ids_BxT,
      mask_BxT,
      active_B,
      key,
      options=options,
      window=window,
      images=images,
  )

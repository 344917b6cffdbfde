"""ragen_jax.sampling against transformers (PyTorch CPU) and a full forward recomputation.

A random float32 Qwen2ForCausalLM is built with transformers (every tensor randomised), saved,
and loaded with `models.load_hf`, so both libraries decode the same weights. Dimension legend:
B batch, T prompt length, N new tokens, V vocab, S cache capacity.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flax import nnx
from ragen_jax import models
from ragen_jax import sampling

VOCAB = 97
LENGTHS, TOTAL = [7, 3, 5, 1], 7


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(transformers model, our model) with identical random weights."""
  config = transformers.Qwen2Config(
      vocab_size=VOCAB,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      rope_parameters={"rope_type": "default", "rope_theta": 1e4},
      attn_implementation="eager",
  )
  hf = transformers.Qwen2ForCausalLM(config).eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in hf.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.5 * noise)
  path = tmp_path_factory.mktemp("hf")
  hf.save_pretrained(path)
  return hf, models.load_hf(str(path))


def left_padded(lengths=LENGTHS, total=TOTAL, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, VOCAB, size=(len(lengths), total)).astype(np.int32)
  mask = np.zeros_like(ids)
  for row, n in enumerate(lengths):
    mask[row, total - n :] = 1
  return np.where(mask > 0, ids, 0), mask


def hf_greedy(hf, ids, mask, n, eos=None):
  with torch.no_grad():
    out = hf.generate(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=0,
        eos_token_id=eos,
        pad_token_id=0,
        top_k=None,
        top_p=None,
        temperature=None,
    )
  return out[:, ids.shape[1] :].numpy()


def test_greedy_matches_transformers_token_for_token(pair):
  hf, model = pair
  ids, mask = left_padded()
  n = 12
  ref = hf_greedy(hf, ids, mask, n)
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(0),
      options=sampling.SamplingOptions(max_new_tokens=n, temperature=0.0),
  )
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), ref)
  np.testing.assert_array_equal(np.asarray(out.lengths_B), n)
  assert out.tokens_BxN.dtype == jnp.int32 and out.logprobs_BxN.dtype == jnp.float32


def test_greedy_stops_on_eos_like_transformers(pair):
  hf, model = pair
  ids, mask = left_padded()
  free = hf_greedy(hf, ids, mask, 10)
  eos = int(free[0, 3])  # row 0 emits it at step 3; other rows may too, or never
  ref = hf_greedy(hf, ids, mask, 10, eos=eos)
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(0),
      options=sampling.SamplingOptions(
          max_new_tokens=10, temperature=0.0, stop_token_ids=(eos,), pad_id=0
      ),
  )
  tokens = np.asarray(out.tokens_BxN)
  # transformers stops once every row is done; the rest is padding.
  np.testing.assert_array_equal(tokens[:, : ref.shape[1]], ref)
  assert np.all(tokens[:, ref.shape[1] :] == 0)
  for row in range(len(LENGTHS)):
    hits = np.flatnonzero(free[row] == eos)
    expected = hits[0] + 1 if len(hits) else 10
    assert int(out.lengths_B[row]) == expected
    assert np.all(tokens[row, expected:] == 0)
    assert np.all(np.asarray(out.logprobs_BxN)[row, expected:] == 0)


def test_stop_sequence_ends_the_row(pair):
  _, model = pair
  ids, mask = left_padded()
  free = np.asarray(
      sampling.generate(
          model,
          ids,
          mask,
          key=jax.random.key(0),
          options=sampling.SamplingOptions(max_new_tokens=10, temperature=0.0),
      ).tokens_BxN
  )
  seq = (int(free[1, 4]), int(free[1, 5]))
  longer_than_a_reply = tuple(range(1, 12))  # 11 tokens: never matches, never fails
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(0),
      options=sampling.SamplingOptions(
          max_new_tokens=10, temperature=0.0, stop_sequences=(seq, longer_than_a_reply), pad_id=0
      ),
  )
  for row in range(len(LENGTHS)):
    pairs = [i + 1 for i in range(9) if (free[row, i], free[row, i + 1]) == seq]
    expected = pairs[0] + 1 if pairs else 10
    assert int(out.lengths_B[row]) == expected
    n = int(out.lengths_B[row])
    np.testing.assert_array_equal(np.asarray(out.tokens_BxN)[row, :n], free[row, :n])
    assert np.all(np.asarray(out.tokens_BxN)[row, n:] == 0)
  assert int(out.lengths_B[1]) <= 6


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 8, 0.9)]
)
def test_sampled_logprobs_match_a_full_forward(pair, temperature, top_k, top_p):
  _, model = pair
  ids, mask = left_padded()
  n = 9
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(3),
      options=sampling.SamplingOptions(
          max_new_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p
      ),
  )
  tokens, logprobs = np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN)
  full_ids = np.concatenate([ids, tokens], axis=1)
  full_mask = np.concatenate([mask, np.ones_like(tokens)], axis=1)
  logits = np.asarray(model(full_ids, full_mask), np.float64) / temperature
  logp = (
      logits
      - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
      - logits.max(-1, keepdims=True)
  )
  # The token at position TOTAL + i is predicted by the logits at TOTAL + i - 1.
  ref = np.take_along_axis(logp[:, TOTAL - 1 : -1], tokens[..., None], axis=-1)[..., 0]
  assert np.max(np.abs(logprobs - ref)) <= 1e-4
  assert np.all(out.lengths_B == n)


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 1, 1.0), (1.0, 7, 1.0), (0.6, 0, 0.5), (1.0, 0, 0.95), (2.0, 10, 0.7), (1.0, 0, 1e-6)],
)
def test_top_k_top_p_support_matches_transformers_warpers(temperature, top_k, top_p):
  rng = np.random.default_rng(1)
  logits = (rng.standard_normal((6, 50)) * rng.uniform(0.5, 4, size=(6, 1))).astype(np.float32)
  processors = [transformers.TemperatureLogitsWarper(temperature)]
  if top_k:
    processors.append(transformers.TopKLogitsWarper(top_k))
  if top_p < 1:
    processors.append(transformers.TopPLogitsWarper(top_p))
  ref = torch.tensor(logits)
  for proc in processors:
    ref = proc(None, ref)
  ref_support = torch.isfinite(ref).numpy()
  ours = np.asarray(sampling.filter_logits(jnp.asarray(logits), temperature, top_k, top_p))
  np.testing.assert_array_equal(np.isfinite(ours), ref_support)
  np.testing.assert_allclose(ours[ref_support], ref.numpy()[ref_support], rtol=1e-6)
  # Sampling draws from exactly that support: nothing outside, everything inside eventually.
  keys = jax.random.split(jax.random.key(0), 2000)
  draws = np.asarray(
      jax.vmap(
          lambda k: sampling._sample(
              jnp.asarray(logits), k, temperature=temperature, top_k=top_k, top_p=top_p
          )[0]
      )(keys)
  )
  for row in range(logits.shape[0]):
    seen = np.zeros(50, bool)
    seen[draws[:, row]] = True
    assert not np.any(seen & ~ref_support[row])
    probs = np.exp(ours[row] - np.max(ours[row]))
    probs /= probs.sum()
    likely = ref_support[row] & (probs > 0.01)
    assert np.all(seen[likely])


def test_new_prompt_lengths_in_a_bucket_do_not_recompile(pair):
  _, model = pair
  before = sampling._generate_jit._cache_size()
  for lengths, total in [([5, 2], 5), ([9, 4], 9), ([12, 1], 12)]:
    ids, mask = left_padded(lengths, total)
    sampling.generate(
        model,
        ids,
        mask,
        key=jax.random.key(0),
        options=sampling.SamplingOptions(max_new_tokens=4, temperature=0.5),
    )
  assert sampling._generate_jit._cache_size() - before == 1  # all three share bucket 16
  assert [sampling.bucket(n) for n in (1, 16, 17, 129, 256, 257, 600)] == [
      16,
      16,
      32,
      256,
      256,
      384,
      640,
  ]


def test_extend_then_compact_keeps_the_conversation(pair):
  # Decode with holes (rows stopping at different steps), compact, append more tokens: the
  # logits equal a full forward over the real tokens only.
  _, model = pair
  graphdef, params = nnx.split(model)
  ids, mask = left_padded()
  cache = models.init_cache(model.config, len(LENGTHS), 64)
  opts = sampling.SamplingOptions(
      max_new_tokens=6, temperature=1.0, pad_id=0, stop_token_ids=tuple(range(0, VOCAB, 4))
  )
  with pytest.raises(ValueError, match="slots needed"):  # 7 + 6 slots > a window of 12
    sampling.extend(
        graphdef,
        params,
        cache,
        ids,
        mask,
        jnp.ones(4, bool),
        jax.random.key(5),
        window=12,
        options=opts,
    )
  out, cache = sampling.extend(
      graphdef,
      params,
      cache,
      ids,
      mask,
      jnp.array([True, True, False, True]),
      jax.random.key(5),
      options=opts,
  )
  cache = sampling.compact(cache, jnp.array([True, True, True, False]))
  tokens, lengths = np.asarray(out.tokens_BxN), np.asarray(out.lengths_B)
  assert lengths[2] == 0 and np.all(np.asarray(cache.mask_BxS)[3] == 0)
  # Row history = prompt + sampled tokens except the last (not yet written to the cache).
  history = [
      list(ids[r, TOTAL - LENGTHS[r] :]) + list(tokens[r, : max(lengths[r] - 1, 0)])
      for r in range(3)
  ]
  counts = np.asarray(cache.mask_BxS).sum(1)
  assert list(counts[:3]) == [len(h) for h in history]
  assert int(cache.end_index) == max(counts)
  nxt = np.array([[11, 12], [13, 14], [15, 16], [17, 18]], np.int32)
  logits, _ = model(nxt, np.ones_like(nxt), cache=cache)
  for r in range(3):
    full = np.array([history[r] + list(nxt[r])], np.int32)
    ref = np.asarray(model(full))[0, -2:]
    np.testing.assert_allclose(np.asarray(logits)[r], ref, atol=1e-4, rtol=0)


def test_bad_options_raise():
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingOptions(max_new_tokens=4, top_p=0.0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    sampling.SamplingOptions(max_new_tokens=0)
  with pytest.raises(ValueError, match="stop sequence"):
    sampling.SamplingOptions(max_new_tokens=4, stop_sequences=((),))
  with pytest.raises(ValueError, match=r"sampling\.temperature must be a finite number >= 0"):
    sampling.SamplingOptions(max_new_tokens=4, temperature=float("nan"))
  with pytest.raises(ValueError, match=r"sampling\.top_k must be an integer >= 0"):
    sampling.SamplingOptions(max_new_tokens=4, top_k=-1)


def test_equal_options_are_one_static_argument():
  """Normalised on construction: the same options written two ways hash equal (one program)."""
  a = sampling.SamplingOptions(max_new_tokens=4, temperature=0, stop_token_ids=[7, 2])
  b = sampling.SamplingOptions(
      max_new_tokens=4, temperature=0.0, stop_token_ids=(2,), stop_sequences=((7,),)
  )
  assert a == b and hash(a) == hash(b) and a.stop_token_ids == (2, 7)

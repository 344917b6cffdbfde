"""Prefix-cached cross-scoring against full-sequence teacher forcing, and the (x, z) samplers."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import models
from ragen_jax import rollout
from ragen_jax.diagnostics import scoring
from ragen_jax.diagnostics import turns as turns_lib


def _model(vocab=97):
  config = models.get_config("tiny").replace(
      vocab_size=vocab,
      num_layers=2,
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
  )
  return models.create(config, jax.random.key(3))


def _references(model, reasonings, prompts):
  """log p(z | x) for every (z, x) by one plain forward over the rows [x | z] (no cache), right-
  padded to one width, which a causal model's earlier positions never see; log-softmax in
  float64 here. Row by row (one width each) compiled a forward per width: minutes on 2 cores."""
  pairs = [(z, x) for z in reasonings for x in prompts]
  width = max(len(x) + len(z) for z, x in pairs)
  seq = np.zeros((len(pairs), width), np.int32)
  for i, (z, x) in enumerate(pairs):
    seq[i, : len(x) + len(z)] = list(x) + list(z)
  logits = np.asarray(model(jnp.asarray(seq)), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  sums = [
      sum(logp[i, len(x) - 1 + k, tok] for k, tok in enumerate(z)) for i, (z, x) in enumerate(pairs)
  ]
  return np.reshape(sums, (len(reasonings), len(prompts)))


def test_cross_logprobs_equal_full_forward_teacher_forcing():
  model = _model()
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, 97, size=n) for n in (1, 7, 40, 19)]
  reasonings = [tuple(rng.integers(1, 97, size=n).tolist()) for n in (1, 5, 17)]
  want = _references(model, reasonings, prompts)
  # micro_batch 4 over 12 pairs: three calls, the last one full; 5 forces a padded last call.
  for micro in (4, 5):
    logp, num = scoring.cross_logprobs(model, reasonings, prompts, pad_id=0, micro_batch=micro)
    assert logp.shape == (3, 4) and num.tolist() == [1, 5, 17]
    for i, j in np.ndindex(3, 4):
      # Sums of up to 17 log-probs (down to about -80) from a cached and a plain forward: the
      # rounding grows with the sum, so the bound is relative too.
      assert logp[i, j] == pytest.approx(want[i, j], rel=1e-5, abs=2e-4), (i, j)


def test_temperature_scales_the_scored_distribution():
  model = _model()
  x, z = np.arange(1, 12), (5, 6, 7)
  hot, _ = scoring.cross_logprobs(model, [z], [x], pad_id=0, temperature=2.0)
  seq = jnp.asarray([list(x) + list(z)], jnp.int32)
  logp = jax.nn.log_softmax(model(seq)[0] / 2.0, axis=-1)
  want = sum(float(logp[len(x) - 1 + k, t]) for k, t in enumerate(z))
  assert hot[0, 0] == pytest.approx(want, abs=2e-4)


def test_reasoning_text_extraction():
  assert (
      turns_lib.reasoning_text("<think> push the box </think><answer>Up</answer>") == "push the box"
  )
  assert turns_lib.reasoning_text("<think></think><answer>Up</answer>") == ""
  assert turns_lib.reasoning_text("<think>never closed <answer>Up</answer>") == ""
  assert turns_lib.reasoning_text("junk \x00\xff") == ""
  assert turns_lib.reasoning_text("<think>a<|im_end|>b</think>") == "ab"


class _CharTokenizer:

  def encode(self, text):
    return [ord(c) % 90 + 1 for c in text]


def _fake_results():
  """Two tags; sokoban: 2 groups x 2 episodes, bandit: 1 group x 2; hand-written replies. Each
  episode's tokens are a row cut into turns at the reply starts (a later turn's context is the
  one token before its reply start)."""

  def ep(group, row, replies, starts):
    episode = rollout.Episode(0, [], None, 10, 1, group_id=group)
    ends = [s - 1 for s in starts[1:]] + [len(row)]
    begin = 0
    for start, end, reply in zip(starts, ends, replies):
      episode.turns.append(rollout.Turn(row[begin:start], row[start:end], text=reply))
      begin = end
    return episode

  ok, bad = "<think>go up</think><answer>Up</answer>", "<answer>Up</answer>"
  soko = [
      ep(0, [1, 2, 3, 9, 9, 4, 5, 9], [ok, ok], [3, 6]),
      ep(0, [1, 2, 3, 8, 8], [bad], [3]),
      ep(1, [6, 7, 3, 9, 4, 5, 6, 9], [ok, bad], [3, 6]),
      ep(1, [6, 7, 3, 8], [ok], [3]),
  ]
  bandit = [ep(0, [1, 2, 3, 5], [ok], [3]), ep(0, [1, 2, 3, 6], [bad], [3])]
  return {
      "sokoban": types.SimpleNamespace(episodes=soko),
      "bandit": types.SimpleNamespace(episodes=bandit),
  }


def test_collect_turns_and_step_metrics():
  turns = turns_lib.collect_turns(_fake_results(), _CharTokenizer())
  assert len(turns) == 8
  assert [t.episode for t in turns] == [0, 0, 1, 2, 2, 3, 4, 5]
  assert turns[1].context.tolist() == [1, 2, 3, 9, 9, 4]  # up to the 2nd reply start
  assert turns[0].group == ("sokoban", 0) and turns[6].group == ("bandit", 0)
  assert turns[0].reasoning == tuple(_CharTokenizer().encode("go up"))
  m = turns_lib.step_metrics(turns)
  assert m["collapse/valid_thinking_rate"] == pytest.approx(5 / 8)
  assert m["collapse/first_turn_num_total"] == 6 and m["collapse/first_turn_num_valid"] == 4
  assert m["reasoning_length/mean"] == 5.0


def test_first_turn_sample_uses_one_column_per_group_and_merges_identical_prompts():
  turns = turns_lib.collect_turns(_fake_results(), _CharTokenizer())
  s = turns_lib.first_turn_sample(turns, 64, np.random.default_rng(0))
  # Valid first turns: episodes 0, 2, 3 (sokoban groups 0, 1, 1) and 4 (bandit group 0).
  assert s.num_samples == 4
  assert s.prompt_index.tolist() == [0, 1, 1, 2]
  # sokoban group 0 and bandit group 0 have the same first prompt [1, 2, 3]: one column id.
  assert s.column_ids.tolist() == [0, 1, 0]
  small = turns_lib.first_turn_sample(turns, 2, np.random.default_rng(0))
  assert small.num_samples == 2 and len(set(map(tuple, small.prompts))) == len(small.prompts)


def test_multi_turn_sample_draws_valid_turns_each_its_own_column():
  turns = turns_lib.collect_turns(_fake_results(), _CharTokenizer())
  s = turns_lib.multi_turn_sample(turns, 200, np.random.default_rng(1))
  assert s.num_samples == 200 and s.prompt_index.tolist() == list(range(200))
  lengths = {len(p) for p in s.prompts}
  assert lengths == {3, 6}  # first turns (3 tokens of context) and episode 0's second turn
  # Episodes are drawn uniformly (4 valid ones), so episode 0's 2nd turn is ~1/8 of draws.
  share = np.mean([len(p) == 6 for p in s.prompts])
  assert 0.05 < share < 0.22
  # Identical contexts share ids.
  assert len(set(s.column_ids.tolist())) == len({p.tobytes() for p in s.prompts})


def test_samplers_return_none_without_valid_reasoning():
  turns = [t for t in turns_lib.collect_turns(_fake_results(), _CharTokenizer()) if not t.reasoning]
  assert turns_lib.first_turn_sample(turns, 8, np.random.default_rng(0)) is None
  assert turns_lib.multi_turn_sample(turns, 8, np.random.default_rng(0)) is None
  assert turns_lib.step_metrics(turns)["collapse/valid_thinking_rate"] == 0.0

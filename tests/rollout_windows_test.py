"""Context windows (`rollout.context_window`): what each turn's prompt holds, one training row per
turn, a cache that does not grow with the turns, and the update on that layout.

References: a full forward over each row (on-policy log-probs), the rollout's own typed episodes
(the row layout against the turns it came from), the same scripted episodes in the sequence
layout (advantages per episode and per turn), and a NumPy GAE along each episode's replies.
Dimension legend: B episodes, K turns, R = B·K rows, T tokens.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax import viewer
from ragen_jax.algos import train_step
from ragen_jax.algos.step_records import OldPass
from ragen_jax.envs.device import sokoban
from ragen_jax.train import batching
from tiny import rollout_config

TOK = tokenizers.load("sentencepiece")


@pytest.fixture(scope="module")
def model():
  return models.create("tiny", jax.random.key(0))


def config(**kw):
  """The engine tests' small rollout (the same compiled programs) with a window of one turn."""
  return rollout_config(**{"context_window": "last_k", "window_turns": 1, **kw})


def shown_turns(prompt_ids):
  """The turn numbers of the user messages a prompt holds (RAGEN's "Turn N:" lines)."""
  return [int(n) for n in re.findall(r"Turn (\d+):", TOK.decode(prompt_ids))]


def attended(batch, r):
  mask = np.asarray(batch.attention_mask_BxT[r]) > 0
  return np.asarray(batch.tokens_BxT[r])[mask].tolist()


@pytest.fixture(scope="module")
def played(model):
  """A random tiny model's Sokoban batch with a window of one earlier turn, and the calls that
  prefilled the system message."""
  calls = []
  prefill = sampling.prefill
  sampling.prefill = lambda *a: calls.append(a[2].shape) or prefill(*a)
  try:
    engine = rollout.Rollout(envs.make("sokoban"), TOK, config())
    result = engine.run(rollout.ModelPolicy(model), jax.random.key(1), seed=123)
  finally:
    sampling.prefill = prefill
  return engine, result, calls


def test_each_turn_is_a_row_holding_exactly_what_the_sampler_saw(played, model):
  engine, result, calls = played
  batch, k = result.batch, engine.config.max_turns
  assert calls == [(1, calls[0][1])]  # the shared system message, prefilled once, at batch 1
  np.testing.assert_array_equal(batch.row_episodes_R, np.repeat(np.arange(4), k))
  for b, ep in enumerate(result.episodes):
    assert ep.window == 1 and len(ep.turns) == k
    for j, turn in enumerate(ep.turns):
      r = b * k + j
      assert attended(batch, r) == turn.context + turn.reply
      loss = np.asarray(batch.loss_mask_BxT[r])
      assert loss.sum() == len(turn.reply) and loss[-len(turn.reply) :].all()
      assert (np.asarray(batch.turns.token_turns_BxT[r]) == j).sum() == len(turn.reply)
      # The system message, the last earlier turn and the current one; nothing older.
      assert shown_turns(turn.context) == list(range(max(1, j), j + 2))
      assert turn.shown_from == max(0, j - 1) and turn.context[: len(ep.prefix)] == ep.prefix
  # On-policy: the sampler's log-probs equal a full forward over each row.
  tokens, mask = np.asarray(batch.tokens_BxT), np.asarray(batch.attention_mask_BxT)
  logits = np.asarray(model(tokens, mask), np.float64) / 0.8
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  ref = np.take_along_axis(logits[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0] - logz[:, :-1]
  trained = np.asarray(batch.loss_mask_BxT)[:, 1:] > 0
  assert trained.sum() == result.metrics["response_length"].sum() > 0
  assert np.max(np.abs(np.asarray(batch.logprobs_BxT)[:, 1:][trained] - ref[trained])) <= 1e-4
  # Prefill counts: the rows' own prompts, against prefilling each prompt whole.
  rest = sum(len(t.context) - len(ep.prefix) for ep in result.episodes for t in ep.turns)
  assert result.summary["prefill_tokens_append"] == rest
  assert result.summary["prefill_tokens_reencode"] == sum(
      len(t.context) for ep in result.episodes for t in ep.turns
  )


def test_single_turn_shows_no_earlier_turn_and_records_what_each_turn_saw():
  engine = rollout.Rollout(
      envs.make("sokoban"), TOK, config(context_window="single_turn", window_turns=None)
  )
  result = engine.run_scripted(lambda s, ep: "go</think><answer>Up</answer>", jax.random.key(2), 7)
  for ep in result.episodes:
    for j, turn in enumerate(ep.turns):
      assert shown_turns(turn.context) == [j + 1] and turn.shown_from == j
    record = ep.to_json()
    assert record["window"] == 0 and record["turn_windows"] == [[j, ""] for j in range(3)]
    view = viewer.episode_view(record)
    assert view["window"] == 0
    assert [s["saw"] for s in view["steps"]] == [
        {"first": j + 1, "last": j, "memory": ""} for j in range(3)
    ]


def scripted_2048(cfg, env=None, moves=("Up", "Left", "Down", "Right")):
  engine = rollout.Rollout(env or envs.make("2048"), TOK, cfg)
  policy = lambda state, ep: f"go</think><answer>{moves[len(ep.turns) % len(moves)]}</answer>"
  return engine, engine.run_scripted(policy, jax.random.key(0), seed=3)


def test_a_long_episode_needs_the_cache_of_a_short_one():
  """Full context stops an episode when its history fills `max_context`; a window plays every
  turn in the same context, cache and row width."""
  common = dict(
      max_turns=12,
      max_actions_per_turn=1,
      max_actions_per_traj=12,
      max_new_tokens=24,
      max_context=1024,
  )
  full_cfg = config(context_window="full", window_turns=None, **common)
  window_cfg = config(window_turns=2, **common)
  _, full = scripted_2048(full_cfg)
  engine, window = scripted_2048(window_cfg)
  assert full.summary["context_truncated"] == 1.0 and full.summary["num_turns"] < 8
  assert window.summary["context_truncated"] == 0.0 and window.summary["num_turns"] == 12
  assert window.summary["turn_limit"] == 1.0  # ended by the turn budget, not the game
  assert engine.capacity == rollout.episodes.cache_slots(1024, 400)  # the same for any max_turns
  assert window.batch.tokens_BxT.shape[1] <= 1024 < full_cfg.max_context + 1
  longest = max(len(t.context) for ep in window.episodes for t in ep.turns)
  assert longest + 24 <= 1024 and len(window.batch.tokens_BxT) == 4 * 12


def test_oldest_turns_leave_a_window_that_does_not_fit():
  # 2048's turns take ~180 tokens: a window of 5 cannot fit 700 tokens, so it shows fewer.
  cfg = config(
      window_turns=5, max_turns=8, max_actions_per_turn=1, max_actions_per_traj=8, max_context=700
  )
  _, result = scripted_2048(cfg)
  for ep in result.episodes:
    assert len(ep.turns) == 8
    for j, turn in enumerate(ep.turns):
      assert len(turn.context) + cfg.max_new_tokens <= cfg.max_context
      assert max(0, j - 5) <= turn.shown_from <= j
    assert ep.turns[-1].shown_from > 8 - 1 - 5  # the window shrank


@dataclasses.dataclass(frozen=True)
class RememberingSokoban(sokoban.Sokoban):
  """Sokoban with RAGEN's memory hook: a line standing in for the turns left out."""

  def memory(self, history):
    assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2)
    return f"[memory of {len(history) // 2} earlier turns, the first: {history[0]['content'].strip()[:7]}]"


def test_the_environments_memory_stands_in_for_the_turns_left_out():
  engine = rollout.Rollout(RememberingSokoban(), TOK, config(max_turns=4))
  policy = lambda state, ep: "go</think><answer>Up</answer>"
  result = engine.run_scripted(policy, jax.random.key(0), seed=5)
  for ep in result.episodes:
    for j, turn in enumerate(ep.turns):
      text = TOK.decode(turn.context)
      if j < 2:  # nothing left out yet
        assert turn.memory == "" and "[memory" not in text
      else:
        assert turn.memory == f"[memory of {j - 1} earlier turns, the first: Turn 1:]"
        # It opens the first user message shown.
        assert re.search(r"user\n\[memory of \d earlier turns, the first: Turn 1:\]\nReward", text)


def test_a_text_environment_class_defines_the_memory_hook():
  class Noted:

    @staticmethod
    def memory(history):
      return f"{len(history)} messages"

  assert envs.HostEnv("noted", Noted).memory([{}, {}]) == "2 messages"
  assert envs.HostEnv("plain", lambda: None).memory([{}]) == ""


def test_window_knobs_are_checked_by_name():
  for kw, key in (
      (dict(window_turns=-1), "rollout.window_turns"),
      (dict(context_window="full", window_turns=3), "rollout.window_turns"),
      (dict(context_window="single_turn", window_turns=2), "rollout.window_turns"),
      (dict(window_turns=None), "rollout.window_turns"),
      (dict(context_window="sliding"), "rollout.context_window"),
  ):
    with pytest.raises(ValueError, match=re.escape(key)):
      config(**kw)


# ------------------------------------------------------------------ the update on rows


@pytest.fixture(scope="module")
def layouts():
  """The same scripted 2048 episodes in both layouts: a window that shows every turn plays the
  same moves and rewards as full context."""
  common = dict(max_turns=5, max_actions_per_turn=1, max_new_tokens=24, max_context=2048)
  moves = ("Up", "Up", "Left", "Down", "Right")
  _, full = scripted_2048(config(context_window="full", window_turns=None, **common), None, moves)
  _, rows = scripted_2048(config(window_turns=5, **common), None, moves)
  for a, b in zip(full.episodes, rows.episodes):
    assert [t.reward for t in a.turns] == [t.reward for t in b.turns]
  return full, rows


def _turn_advantages(batch, adv_BxT):
  """{(row's episode, turn): the advantage on that turn's sampled tokens} (one value each)."""
  out = {}
  turns_BxT = np.asarray(batch.turns.token_turns_BxT)
  episodes = np.asarray(batch.row_episodes_R) if batch.row_episodes_R is not None else None
  for r in range(turns_BxT.shape[0]):
    for j in np.unique(turns_BxT[r][turns_BxT[r] >= 0]):
      values = np.asarray(adv_BxT)[r][turns_BxT[r] == j]
      assert np.ptp(values) == 0
      out[(int(episodes[r]) if episodes is not None else r, int(j))] = float(values[0])
  return out


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_rows_carry_the_advantages_of_their_episode_and_turn(layouts, estimator):
  full, rows = layouts
  cfg = algos.PPOConfig(adv_estimator=estimator, gigpo_norm="mean_std")
  results = []
  for batch in (full.batch, rows.batch):
    batch = jax.tree.map(jnp.asarray, batch)
    sel = train_step.order_and_filter(cfg, batch)
    adv = train_step.advantages(cfg, sel, OldPass(None, None, None, None))
    results.append(_turn_advantages(sel.batch, adv.adv_BxT))
  assert results[0].keys() == results[1].keys() and len(results[0]) == 4 * 5
  for key, value in results[0].items():
    assert results[1][key] == pytest.approx(value, abs=1e-5)
  if estimator == "grpo":  # each episode counted once, whatever its number of rows
    scores = np.asarray(full.batch.scores_B, np.float64).reshape(2, 2)
    want = (scores - scores.mean(1, keepdims=True)) / (scores.std(1, ddof=1, keepdims=True) + 1e-6)
    for (b, _), value in results[1].items():
      assert value == pytest.approx(want.reshape(-1)[b], abs=1e-4)


def test_filtering_keeps_whole_groups_of_rows(layouts):
  _, rows = layouts
  batch = jax.tree.map(jnp.asarray, rows.batch)
  # Group 0's episodes differ in score, group 1's not: top_p 0.5 keeps group 0 alone.
  batch = batch.replace(scores_B=jnp.array([1.0, 0.0, 2.0, 2.0]))
  cfg = algos.PPOConfig(adv_estimator="grpo", filter_value=0.5, filter_include_zero=False)
  sel = train_step.order_and_filter(cfg, batch)
  episodes = np.asarray(sel.batch.row_episodes_R)
  keep = np.asarray(sel.keep_B)
  assert set(episodes[keep]) == {0, 1} and keep.sum() == 2 * 5
  assert keep[: keep.sum()].all()  # kept rows first
  np.testing.assert_array_equal(sel.keep_episodes_B, [True, True, False, False])


def _gae_reference(batch, values_RxT, gamma, lam):
  """Returns (Â + V) by a NumPy loop along each episode's sampled tokens in turn order."""
  k = batch.turns.mask_BxK.shape[1]
  rewards, mask = np.asarray(batch.token_rewards_BxT), np.asarray(batch.loss_mask_BxT) > 0
  out = np.zeros(mask.shape)
  for b in range(len(batch.group_ids_B)):
    where = [(r, t) for r in range(b * k, b * k + k) for t in np.flatnonzero(mask[r])]
    gae, next_value = 0.0, 0.0
    for r, t in reversed(where):
      delta = rewards[r, t] + gamma * next_value - values_RxT[r, t]
      gae = delta + gamma * lam * gae
      next_value = values_RxT[r, t]
      out[r, t] = gae + values_RxT[r, t]
  return out, mask


def test_gae_runs_along_each_episodes_rows_in_turn_order(layouts):
  _, rows = layouts
  batch = jax.tree.map(jnp.asarray, rows.batch)
  batch = batch.replace(scores_B=jnp.array([1.0, 0.0, 2.0, 0.5]))  # every group kept
  cfg = algos.PPOConfig(adv_estimator="gae", gamma=0.9, lam=0.8)
  sel = train_step.order_and_filter(cfg, batch)
  values = np.random.default_rng(0).normal(size=sel.tokens_BxT.shape).astype(np.float32)
  adv = train_step.advantages(cfg, sel, OldPass(None, None, jnp.asarray(values), None))
  # Back in the rollout's row order, against the loop reference.
  order = np.asarray(sel.row_order_R)
  canonical = lambda x: np.asarray(x)[np.argsort(order)]
  mask_values = canonical(values) * (canonical(sel.mask_BxT) > 0)
  want, mask = _gae_reference(rows.batch, mask_values, 0.9, 0.8)
  np.testing.assert_allclose(canonical(adv.returns_BxT)[mask], want[mask], atol=1e-5)
  got = canonical(adv.adv_BxT)[mask]
  assert abs(got.mean()) < 1e-5 and got.std(ddof=1) == pytest.approx(1.0, abs=1e-3)  # whitened


def test_a_train_step_on_rows_is_on_policy(played, model):
  """The update's first pass over the rows reproduces the sampler's probabilities."""
  _, result, _ = played
  cfg = algos.PPOConfig(adv_estimator="grpo", num_minibatches=2, vocab_chunk=64)
  batch = batching.join_batches([result.batch], 64, TOK.pad_id)
  state = algos.init_train_state(model, None, cfg, jax.random.key(1))
  step = algos.make_train_step(model, None, cfg, temperature=0.8)
  before = jax.tree.map(np.array, state.actor_params)
  state, metrics = step(
      state,
      jax.tree.map(jnp.asarray, batch),
      jax.random.key(2),
      response_width=algos.response_width(batch.loss_mask_BxT),
  )
  assert float(metrics["training/rollout_probs_diff_max"]) < 1e-5
  assert float(metrics["train/num_updates"]) == 2.0
  moved = [
      np.abs(a - np.asarray(b)).max()
      for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.actor_params))
  ]
  assert max(moved) > 0
  assert batching.batch_metrics(batch)["train/rows_used"] == 1.0


def test_joined_batches_point_rows_at_their_episodes(played):
  _, result, _ = played
  joined = batching.join_batches([result.batch, result.batch], 64, TOK.pad_id)
  np.testing.assert_array_equal(
      joined.row_episodes_R,
      np.concatenate([result.batch.row_episodes_R] * 2) + np.repeat([0, 4], 12),
  )
  np.testing.assert_array_equal(joined.group_ids_B, [0, 0, 1, 1, 2, 2, 3, 3])
  with pytest.raises(ValueError, match="mix"):
    batching.join_batches([result.batch, result.batch.replace(row_episodes_R=None)], 64, 0)

"""Warm start: expert demonstrations in the rollout's format, and fine-tuning that learns them.

Dimension legend: B episodes, T tokens.
"""

import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.envs.device import sokoban
from ragen_jax.rollout import prompts
from ragen_jax.warm_start import demos
from ragen_jax.warm_start import sft


@pytest.fixture(scope="module")
def tok():
  return tokenizers.load("sentencepiece")


def engine(tok, name, groups=8, max_turns=5, actions=2, **options):
  env = envs.make(name, **options)
  config = rollout.RolloutConfig(
      env_groups=groups,
      group_size=1,
      max_turns=max_turns,
      max_actions_per_turn=actions,
      max_actions_per_traj=10 if name != "bandit" else 1,
      max_new_tokens=64,
      max_context=1536,
      max_turn_tokens=256,
      render_format="grid" if name == "bandit" else "grid_coord",
  )
  return rollout.Rollout(env, tok, config)


@pytest.mark.parametrize(
    "name, options", [("sokoban", {}), ("frozenlake", {"is_slippery": False}), ("bandit", {})]
)
def test_noise_free_experts_always_succeed_in_the_right_format(tok, name, options):
  eng = engine(
      tok,
      name,
      max_turns=5 if name != "bandit" else 1,
      actions=2 if name != "bandit" else 1,
      **options,
  )
  result = eng.run_scripted(
      demos.expert_policy(eng.env, eng.config, 0.0, seed=0), jax.random.key(0), seed=500
  )
  assert result.summary["success"] == 1.0
  assert result.summary["action_is_valid"] == 1.0 and result.summary["format_penalty"] == 0.0
  for ep in result.episodes:
    for message in ep.messages[2::2]:
      parsed = prompts.parse_response(message["content"], True, "||", 2)
      assert parsed.matched and parsed.actions


def test_sokoban_expert_plays_optimal_plans(tok):
  eng = engine(tok, "sokoban")
  result = eng.run_scripted(
      demos.expert_policy(eng.env, eng.config, 0.0, seed=0), jax.random.key(0), seed=500
  )
  keys = jax.vmap(jax.random.key)(500 + np.arange(8))
  starts = jax.jit(eng.env.reset_batch)(keys)
  optimal = [len(sokoban.solve(jax.tree.map(lambda x: x[i], starts), 30)) for i in range(8)]
  np.testing.assert_array_equal(result.metrics["num_actions"], optimal)


def test_random_share_degrades_the_bandit_expert_as_documented(tok):
  eng = engine(tok, "bandit", groups=64, max_turns=1, actions=1)
  result = eng.run_scripted(
      demos.expert_policy(eng.env, eng.config, 1.0, seed=0), jax.random.key(0), seed=0
  )
  # Fully random replies pick either arm: about half choose the high-risk one.
  assert 0.3 < result.summary["success"] < 0.7


def test_undo_share_takes_back_the_first_move_as_documented(tok):
  """undo_prob 1: every two-action Sokoban reply is (first move, the move that takes it back)."""
  eng = engine(tok, "sokoban")
  result = eng.run_scripted(
      demos.expert_policy(eng.env, eng.config, 0.0, seed=0, undo_prob=1.0),
      jax.random.key(0),
      seed=500,
  )
  pairs = 0
  for ep in result.episodes:
    for message in ep.messages[2::2]:
      actions = prompts.parse_response(message["content"], True, "||", 2).actions
      if len(actions) == 2:
        assert actions[1] == demos.OPPOSITE[actions[0]]
        pairs += 1
  assert pairs > 0
  with pytest.raises(ValueError, match="undo_prob"):
    demos.expert_policy(eng.env, eng.config, 0.0, seed=0, undo_prob=-0.1)


def test_demo_loss_mask_covers_exactly_the_replies(tok):
  eng = engine(tok, "frozenlake", groups=2, is_slippery=False)
  result = eng.run_scripted(
      demos.expert_policy(eng.env, eng.config, 0.0, seed=0), jax.random.key(0), seed=7
  )
  tokens = np.asarray(result.batch.tokens_BxT)
  loss = np.asarray(result.batch.loss_mask_BxT)
  for i, ep in enumerate(result.episodes):
    replies = [m["content"][len("<think>") :] for m in ep.messages if m["role"] == "assistant"]
    assert tok.decode(tokens[i][loss[i] == 1]) == "".join(replies)


def test_fine_tuning_learns_the_bandit_demonstrations(tok):
  eng = engine(tok, "bandit", groups=8, max_turns=1, actions=1)
  model = models.create("tiny", jax.random.key(0))
  cfg = sft.SFTConfig(steps=24, batch_size=8, lr=3e-3, warmup_steps=4, random_prob=0.0)
  logs = []
  tuned, last = sft.finetune(
      model, {"bandit": eng}, cfg, log=lambda i, m: logs.append(m), log_every=4
  )
  # From ~log(2048) nats per reply token to a fraction of it in 24 steps (from scratch).
  assert logs[0]["sft/loss"] > 5.0 and last["sft/loss"] < 0.35 * logs[0]["sft/loss"]
  assert last["sft/token_prob"] > 10 * logs[0]["sft/token_prob"]
  # The returned model carries the tuned weights; the input model is left as it was.
  ids = jax.numpy.arange(8, dtype=jax.numpy.int32)[None]
  assert not np.allclose(np.asarray(tuned(ids)), np.asarray(model(ids)))


def test_sft_config_rejects_bad_values():
  with pytest.raises(ValueError, match="random_prob"):
    sft.SFTConfig(random_prob=1.5)
  with pytest.raises(ValueError, match="batch_size"):
    sft.SFTConfig(batch_size=0)
  with pytest.raises(ValueError, match="undo_prob"):
    sft.SFTConfig(undo_prob=2.0)


def test_batch_schedule_interleaves_the_weighted_mix():
  assert sft.batch_schedule({"a": 3, "b": 1}) == ["a", "b", "a", "a"]
  assert sft.batch_schedule({"s": 4, "f": 2, "b": 2}) == ["s", "f", "b", "s", "f", "b", "s", "s"]
  assert sft.batch_schedule({"x": 1, "y": 1}) == ["x", "y"]


def test_demo_stream_draws_each_environment_by_its_weight(tok):
  # Two tags of the cheap Bandit; one refill of 4 levels is exactly one batch of 4.
  engines = {
      "a": engine(tok, "bandit", groups=4, max_turns=1, actions=1),
      "b": engine(tok, "bandit", groups=4, max_turns=1, actions=1),
  }
  cfg = sft.SFTConfig(batch_size=4)
  stream = sft.DemoStream(engines, cfg, tok.pad_id, weights={"a": 2, "b": 1})
  for _ in range(6):
    stream.next()
  assert stream.rounds == {"a": 4, "b": 2}
  with pytest.raises(ValueError, match="every environment needs a weight"):
    sft.DemoStream(engines, cfg, tok.pad_id, weights={"a": 1})

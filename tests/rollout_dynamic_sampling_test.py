"""DAPO's dynamic sampling (train/dynamic_sampling.py, `rollout.dynamic_sampling`).

The selection rule against hand-worked picks and, under hypothesis, against its statement; the
refill loop on a real engine (Countdown, a text environment, played by a scripted policy whose
groups have reward spread exactly on chosen level seeds), checked group by group against the
rounds it played; the refill levels and keys; the config keys; and one short `:smoke` run
through the trainer (2 steps, refills allowed) stopped after step 1 and resumed, equal to the
uninterrupted run, with the sampling metrics logged.
"""

import os

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import keys
from ragen_jax import logging_utils
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import dynamic_sampling
from ragen_jax.train import restore
from ragen_jax.train import trainer
from references import comparable, run_cut_at  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke"
TOK = tokenizers.load("sentencepiece")

# ---------------------------------------------------------------- the selection rule


def test_spread_is_a_group_whose_scores_differ():
  scores_B = [1.0, 1.0, 0.0, 1.0, -0.1, -0.1, 0.5, 0.5 + 1e-7]
  assert dynamic_sampling.spread_G(scores_B, 2).tolist() == [False, True, False, False]
  assert dynamic_sampling.spread_G(scores_B, 4).tolist() == [True, True]


def test_selection_by_hand():
  # 3 slots. Round 0: groups 1 and 2 have no spread; round 1: group 0 has none.
  rounds = [[True, False, False], [False, True, True]]
  # The first 3 with spread in the order played: (0,0), (1,1), (1,2).
  assert dynamic_sampling.select(rounds, 3) == [(0, 0), (1, 1), (1, 2)]
  # One slot left after the 2 with spread goes to the first group without: round 0's group 1.
  assert dynamic_sampling.select([[True, False, False], [False, True, False]], 3) == [
      (0, 0),
      (0, 1),
      (1, 1),
  ]
  # Nothing with spread: the step's own groups.
  assert dynamic_sampling.select([[False] * 3, [False] * 3], 3) == [(0, 0), (0, 1), (0, 2)]
  with pytest.raises(ValueError, match="2 groups played, fewer than the 3"):
    dynamic_sampling.select([[True, True]], 3)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.integers(1, 5).flatmap(
        lambda g: st.tuples(
            st.just(g), st.lists(st.lists(st.booleans(), min_size=g, max_size=g), min_size=1)
        )
    )
)
def test_selection_keeps_the_first_groups_with_spread_then_the_first_without(case):
  groups, rounds = case
  picks = dynamic_sampling.select(rounds, groups)
  played = [(r, g) for r in range(len(rounds)) for g in range(groups)]
  spread = [p for p in played if rounds[p[0]][p[1]]]
  flat = [p for p in played if not rounds[p[0]][p[1]]]
  kept = spread[:groups]
  assert picks == sorted(kept + flat[: groups - len(kept)])
  assert len(set(picks)) == groups  # each slot a distinct played group


# ---------------------------------------------------------------- the refill loop


def _engine():
  config = rollout.RolloutConfig(
      env_groups=2, group_size=2, max_turns=1, max_new_tokens=32, max_actions_per_traj=1
  )
  return rollout.Rollout(envs.make("countdown"), TOK, config)


def _spread_on(seeds):
  """A scripted policy: in groups of these level seeds the second episode breaks the format
  (penalty -0.1), so the group's returns differ; elsewhere both episodes reply alike."""

  def reply(state, episode):
    del state
    if episode.seed in seeds and episode.index_in_group == 1:
      return "no tags"
    return "</think><answer>1 + 1</answer>"

  return rollout.ScriptedPolicy(reply)


def _play(engine, spread_seeds, rounds):
  """play_groups with round r at level seeds 100 r, 100 r + 1; returns (result, rounds asked)."""
  asked = []

  def key_of_round(r):
    asked.append(r)
    return jax.random.key(r)

  result = dynamic_sampling.play_groups(
      engine, _spread_on(spread_seeds), rounds, key_of_round, lambda r: 100 * r
  )
  return result, asked


def _rows(result):
  """Each row's attended tokens."""
  batch = result.batch
  mask = np.asarray(batch.attention_mask_BxT) > 0
  return [np.asarray(batch.tokens_BxT)[i][mask[i]].tolist() for i in range(mask.shape[0])]


@pytest.fixture(scope="module", name="engine")
def engine_fixture():
  engine = _engine()
  yield engine
  engine.close()


def test_groups_without_spread_are_replaced_by_refills(engine):
  # Round 0 (seeds 0, 1): only group 1 has spread; round 1 (100, 101): group 0 has, and the
  # batch is full after 2 of the 3 rounds allowed.
  result, asked = _play(engine, {1, 100}, rounds=3)
  assert asked == [0, 1]
  assert [ep.seed for ep in result.episodes] == [1, 1, 100, 100]
  np.testing.assert_array_equal(result.batch.group_ids_B, [0, 0, 1, 1])
  np.testing.assert_allclose(result.batch.scores_B, [0.0, -0.1, 0.0, -0.1], atol=1e-6)
  s = result.summary
  assert (s["sampling_rounds"], s["episodes_played"], s["trained_zero_std_groups"]) == (2, 8, 0)
  # The rows are those the rounds played for these groups (round 0's group 1, round 1's group 0).
  round0, _ = _play(engine, {1, 100}, rounds=1)
  round1 = engine.run(_spread_on({1, 100}), jax.random.key(1), 100)
  assert _rows(result) == _rows(round0)[2:] + _rows(round1)[:2]
  # Cost counters sum over both rounds.
  assert s["generated_tokens"] == round0.summary["generated_tokens"] * 2


def test_after_the_last_round_the_first_groups_without_spread_fill_the_slots(engine):
  result, asked = _play(engine, {201}, rounds=3)
  assert asked == [0, 1, 2]
  assert [ep.seed for ep in result.episodes] == [0, 0, 201, 201]  # round 0's group 0 fills
  assert result.summary["trained_zero_std_groups"] == 1
  assert result.summary["episodes_played"] == 12
  # No spread anywhere: the step's own groups, as played.
  result, _ = _play(engine, set(), rounds=2)
  assert [ep.seed for ep in result.episodes] == [0, 0, 1, 1]
  assert (result.summary["sampling_rounds"], result.summary["trained_zero_std_groups"]) == (2, 2)


def test_one_round_is_the_plain_rollout(engine):
  result, asked = _play(engine, set(), rounds=1)
  plain = engine.run(_spread_on(set()), jax.random.key(0), 0)
  assert asked == [0]
  assert _rows(result) == _rows(plain)
  assert result.summary["sampling_rounds"] == 1 and result.summary["episodes_played"] == 4


def test_metrics_pool_the_tags():
  def result(rounds, zero, groups):
    r = rollout.RolloutResult(None, {}, {}, [])
    r.batch = type("B", (), {"group_ids_B": np.repeat(np.arange(groups), 2)})()
    r.summary.update(sampling_rounds=rounds, trained_zero_std_groups=zero, episodes_played=7.0)
    return r

  got = dynamic_sampling.metrics({"a": result(3.0, 1.0, 2), "b": result(1.0, 0.0, 4)})
  assert got["rollout/sampling_rounds"] == 3.0
  assert got["rollout/a/trained_zero_std_share"] == 0.5
  assert got["rollout/trained_zero_std_share"] == pytest.approx(1 / 6)
  assert got["rollout/episodes_played"] == 14.0


# ---------------------------------------------------------------- levels, keys and config


def _exp(**rollout_values):
  config = cli.load_config_file(SMOKE)
  with config.unlocked():
    for k, v in rollout_values.items():
      config.rollout[k] = v
  return schema.from_config(config)


def test_refill_levels_follow_step_and_round_apart_from_the_training_levels():
  exp = _exp(dynamic_sampling=True, max_sampling_rounds=3)  # 2 groups a step
  base = exp.seed.train + (1 << 28)
  assert keys.level_seeds_of_round(exp, 1, 0) == {"sokoban": exp.seed.train}
  assert keys.level_seeds_of_round(exp, 1, 1) == {"sokoban": base}
  assert keys.level_seeds_of_round(exp, 1, 2) == {"sokoban": base + 2}
  assert keys.level_seeds_of_round(exp, 2, 1) == {"sokoban": base + 4}
  step_key = keys.step(keys.base(exp.seed), 1)
  assert keys.sampling_round(step_key, 0) is step_key
  drawn = {
      int(jax.random.randint(keys.sampling_round(step_key, r), (), 0, 2**30)) for r in range(3)
  }
  assert len(drawn) == 3


def test_config_keys_are_checked_and_validation_never_samples_dynamically():
  exp = _exp(dynamic_sampling=True, max_sampling_rounds=4)
  assert exp.rollout.sampling_rounds == 4
  assert exp.rollout.for_validation().sampling_rounds == 1
  assert _exp(max_sampling_rounds=4).rollout.sampling_rounds == 1
  with pytest.raises(ValueError, match="rollout.max_sampling_rounds"):
    _exp(max_sampling_rounds=0)
  with pytest.raises(ValueError, match="group_size >= 2"):
    _exp(dynamic_sampling=True, group_size=1)


# ---------------------------------------------------------------- through the trainer


def _config():
  config = cli.load_config_file(SMOKE)
  with config.unlocked():
    config.trainer.total_steps, config.trainer.save_every = 2, 1
    config.trainer.eval_every = 10
    config.envs.sokoban.val_groups = 1
    config.rollout.dynamic_sampling = True
    config.rollout.max_sampling_rounds = 3
  return config


@pytest.fixture(scope="module", name="runs")
def runs_fixture(tmp_path_factory):
  """(uninterrupted workdir, resumed workdir) of the 2-step `:smoke` run with refills."""
  root = tmp_path_factory.mktemp("dynamic")
  whole, resumed = str(root / "whole"), str(root / "resumed")
  trainer.train(_config(), whole)
  # The run as it was when it saved step 1: the same call resumes it.
  assert trainer.train(_config(), run_cut_at(whole, resumed, 1))["step"] == 2
  return whole, resumed


def test_a_run_logs_its_sampling(runs):
  scalars = logging_utils.read_scalars(runs[0])
  rounds = dict(scalars["rollout/sampling_rounds"])
  played = dict(scalars["rollout/episodes_played"])
  assert sorted(rounds) == [1, 2] and all(1 <= v <= 3 for v in rounds.values())
  assert max(rounds.values()) > 1  # this run refills (seed.init 0), so resume covers refills
  # 2 groups of 2 episodes a round.
  assert all(played[s] == 4 * rounds[s] for s in (1, 2))
  assert dict(scalars["rollout/episodes_played_total"]) == {1: played[1], 2: played[1] + played[2]}
  # A step stops refilling once both groups have spread; at 3 rounds it may train without.
  for step, share in scalars["rollout/trained_zero_std_share"]:
    assert share in (0.0, 0.5, 1.0) and (share == 0.0 or rounds[step] == 3)
  assert [s for s, _ in scalars["train/batch_size"]] == [1, 2]
  assert all(v == 4 for _, v in scalars["train/batch_size"])  # the batch keeps its shape


def test_a_resumed_run_with_refills_equals_the_uninterrupted_run(runs):
  whole, resumed = (logging_utils.read_scalars(w) for w in runs)
  expected = comparable(whole, {2})
  assert expected and comparable(resumed, {2}) == expected
  a, b = (restore.load_actor(w)[0] for w in runs)
  ids = jax.numpy.arange(12, dtype=jax.numpy.int32)[None]
  np.testing.assert_array_equal(np.asarray(a(ids)), np.asarray(b(ids)))

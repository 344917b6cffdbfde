"""RAGEN's stopping rules on hand-worked metric sequences."""

import json

import pytest

from ragen_jax.diagnostics import early_stop


def _cfg(**kw):
  return early_stop.EarlyStopConfig(**kw)


def _feed(monitor, stds, skipped=()):
  fired = {}
  for step, std in enumerate(stds, start=1):
    metrics = {"rollout/in_group_reward_std": std, "rollout/skipped": float(step in skipped)}
    for e in monitor.after_step(step, metrics):
      fired.setdefault(e.rule, []).append(step)
  return fired


def test_reward_std_collapse_fires_after_patience_steps_below_ratio_of_baseline():
  m = early_stop.Monitor(
      _cfg(reward_std_baseline_steps=3, reward_std_patience=2, reward_std_ratio=0.5)
  )
  # Baseline mean(0.4, 0.2, 0.3) = 0.3; threshold 0.15. Steps 4-5 below, 6 above, 7-8 below.
  fired = _feed(m, [0.4, 0.2, 0.3, 0.1, 0.14, 0.2, 0.0, 0.1])
  assert fired == {"reward_std_collapse": [5, 8]}
  assert m.state["baseline"] == pytest.approx([0.4, 0.2, 0.3])


def test_skipped_steps_do_not_enter_the_baseline_or_the_streak():
  m = early_stop.Monitor(
      _cfg(
          reward_std_baseline_steps=2,
          reward_std_patience=2,
          empty_filter="warn",
          empty_filter_patience=3,
      )
  )
  # Steps 1-2 skipped (std 0 there), baseline from steps 3-4 = 1.0; 5 and 7 below, 6 skipped.
  fired = _feed(m, [0.0, 0.0, 1.0, 1.0, 0.01, 0.0, 0.01], skipped={1, 2, 6})
  assert m.state["baseline"] == [1.0, 1.0]
  assert fired == {"reward_std_collapse": [7]}


def test_empty_filter_counts_consecutive_skipped_steps():
  m = early_stop.Monitor(_cfg(empty_filter_patience=2))
  events = []
  for step, skipped in enumerate([1, 0, 1, 1, 1, 0, 1, 1], start=1):
    events += m.after_step(step, {"rollout/skipped": float(skipped)})
  assert [(e.rule, e.step, e.stop) for e in events] == [
      ("empty_filter", 4, True),
      ("empty_filter", 8, True),
  ]
  assert events[0].metric == "early_stopped/empty_filter"


def test_low_validation_success_per_tag():
  m = early_stop.Monitor(_cfg(low_val_patience=2, low_val_success="warn"))
  seq = [
      {"val/a/success": 0.0, "val/b/success": 0.5, "val/success": 0.0},
      {"val/a/success": 0.005, "val/b/success": 0.0},
      {"val/a/success": 0.3, "val/b/success": 0.0},
      {"val/a/success": 0.0, "val/b/success": 0.0},
  ]
  got = [
      (e.step, e.message.split()[3])
      for i, v in enumerate(seq)
      for e in m.after_validation(i * 10, v)
  ]
  assert got == [(10, "a"), (20, "b")]  # "validation success of <tag> ..."
  assert m.after_validation(50, {"val/b/success": 0.0}) == []  # streak 4 > patience: once
  assert all(
      not e.stop and e.metric.startswith("early_warning/")
      for e in m.after_validation(0, {}) + [early_stop.Event("x", 0, "", False)]
  )


def test_off_rules_never_fire_and_state_round_trips_through_json():
  m = early_stop.Monitor(_cfg(empty_filter="off", empty_filter_patience=1))
  assert m.after_step(1, {"rollout/skipped": 1.0}) == []
  m2 = early_stop.Monitor(_cfg(empty_filter_patience=2), json.loads(json.dumps(m.state)))
  assert [e.step for e in m2.after_step(2, {"rollout/skipped": 1.0})] == [2]


@pytest.mark.parametrize(
    "bad", [dict(low_val_success="maybe"), dict(reward_std_patience=0), dict(reward_std_ratio=1.5)]
)
def test_bad_settings_are_rejected(bad):
  with pytest.raises(ValueError, match="early_stop"):
    early_stop.EarlyStopConfig(**bad)

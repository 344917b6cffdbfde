"""RAGEN's stopping rules (../shared/reference/ragen.md §3.5) as configurable early warnings.

Each rule has a mode: "stop" (save a checkpoint and end the run, as RAGEN does), "warn" (log a
warning and go on) or "off".

  reward_std_collapse: the baseline is the mean `rollout/in_group_reward_std` over the first
    `reward_std_baseline_steps` steps that updated (not skipped by filtering); the rule fires when
    `reward_std_patience` consecutive later steps are all below `reward_std_ratio` x baseline.
  low_val_success: any `val/<tag>/success` below `low_val_threshold` for `low_val_patience`
    consecutive validations (step 0's included).
  empty_filter: `empty_filter_patience` consecutive steps whose filtered batch was empty (the
    train step skipped the update: `rollout/skipped`).

A rule fires when its streak reaches the patience (so "warn" speaks once per streak). Firing is
logged as `early_stopped/<rule>` or `early_warning/<rule>` = 1. The monitor's state is plain JSON,
stored in checkpoint metadata, so a resumed run continues the same streaks.
"""

import dataclasses
from typing import Annotated, Any, Dict, List

from ragen_jax.config_checks import check_fields, OneOf, PositiveInt, UnitFloat

MODES = ("stop", "warn", "off")
Mode = Annotated[str, OneOf(MODES)]  # a rule's mode


@dataclasses.dataclass(frozen=True)
class EarlyStopConfig:
  reward_std_collapse: Mode = "stop"
  reward_std_baseline_steps: PositiveInt = 10
  reward_std_patience: PositiveInt = 10
  reward_std_ratio: UnitFloat = 0.1
  low_val_success: Mode = "stop"
  low_val_threshold: UnitFloat = 0.01  # a success rate
  low_val_patience: PositiveInt = 5
  empty_filter: Mode = "stop"
  empty_filter_patience: PositiveInt = 5

  def __post_init__(self):
    check_fields(self, "early_stop")


@dataclasses.dataclass(frozen=True)
class Event:
  rule: str
  step: int
  message: str
  stop: bool

  @property
  def metric(self) -> str:
    return f"{'early_stopped' if self.stop else 'early_warning'}/{self.rule}"


class Monitor:
  """Tracks the streaks of every rule; feed it each step's and each validation's metrics."""

  def __init__(self, config: EarlyStopConfig, state: Dict[str, Any] | None = None):
    self.config = config
    self.state = {"baseline": [], "below": 0, "low_val": {}, "empty": 0}
    self.state.update(state or {})

  def _event(self, rule: str, step: int, message: str) -> List[Event]:
    mode = getattr(self.config, rule)
    return [] if mode == "off" else [Event(rule, step, message, mode == "stop")]

  def after_step(self, step: int, metrics: Dict[str, float]) -> List[Event]:
    c, s, events = self.config, self.state, []
    skipped = metrics.get("rollout/skipped", 0.0) > 0.5
    s["empty"] = s["empty"] + 1 if skipped else 0
    if s["empty"] == c.empty_filter_patience:
      events += self._event(
          "empty_filter",
          step,
          f"the filtered batch was empty for "
          f"{s['empty']} consecutive steps: no update was made",
      )
    std = metrics.get("rollout/in_group_reward_std")
    if std is not None and not skipped:
      if len(s["baseline"]) < c.reward_std_baseline_steps:
        s["baseline"].append(float(std))
      else:
        baseline = sum(s["baseline"]) / len(s["baseline"])
        s["below"] = s["below"] + 1 if std < c.reward_std_ratio * baseline else 0
        if s["below"] == c.reward_std_patience:
          events += self._event(
              "reward_std_collapse",
              step,
              f"in-group reward std stayed below {c.reward_std_ratio:g} x its baseline "
              f"{baseline:.4g} for {s['below']} consecutive steps (now {std:.4g})",
          )
    return events

  def after_validation(self, step: int, metrics: Dict[str, float]) -> List[Event]:
    c, counts, events = self.config, self.state["low_val"], []
    for name, value in sorted(metrics.items()):
      parts = name.split("/")
      if len(parts) != 3 or parts[0] != "val" or parts[2] != "success":
        continue
      tag = parts[1]
      counts[tag] = counts.get(tag, 0) + 1 if value < c.low_val_threshold else 0
      if counts[tag] == c.low_val_patience:
        events += self._event(
            "low_val_success",
            step,
            f"validation success of {tag} was below {c.low_val_threshold:g} "
            f"for {counts[tag]} consecutive evaluations",
        )
    return events

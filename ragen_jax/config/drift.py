"""Resuming a run under another config: which keys may change, and how the others are reported.

Every checkpoint stores the config it was trained under (metadata "config"). Resuming a workdir
under another learning rate, seed or environment would graft a second experiment onto the
first one's curves without a word (a changed seed would even reach validation only: training
levels follow the checkpoint's counters). `compare` sets the stored config, overlaid on today's
defaults by `stored_config` so that keys added since compare at their defaults, against
the command's, and splits the differences into those `MAY_CHANGE` allows and the others, which
`check_resume` refuses unless the operator allows them explicitly.
"""

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import ml_collections

from ragen_jax.algos.config import PPOConfig
from ragen_jax.config import sections

# Keys a resumed run may change, with the reason. They decide how long the run goes, how often
# it validates, logs and saves, and when it stops; never what a step computes, so the steps
# trained after the resume are those the uninterrupted run would have trained. "section.*"
# covers a whole section.
MAY_CHANGE = {
    "trainer.total_steps": "the schedule's length; each step's levels and keys derive from "
    "(seed, step) alone",
    "trainer.eval_every": "validation plays fixed levels with its own keys and updates nothing",
    "trainer.save_every": "when checkpoints are written",
    "trainer.keep_checkpoints": "how many checkpoints are kept",
    "trainer.sample_trajectories": "how many validation trajectories are logged as text",
    "diagnostics.compute_freq": "the MI diagnostics read the batch with their own keys and "
    "change no rollout or update",
    "early_stop.*": "the stopping rules only watch the run (`warn` or `off` is how a run they "
    "stopped goes on)",
    "logging.*": "where the scalars are reported besides TensorBoard (W&B, MLflow); no step "
    "reads them",
}

ABSENT = "(absent)"  # a key one of the two configs lacks
Change = Tuple[str, Any, Any]  # (dotted key, stored value, value now)


def stored_config(values: dict) -> ml_collections.ConfigDict:
  """A run's stored config overlaid on today's defaults for its environment tags: a key added
  after the run was saved gets its default, which is the behaviour the run had (a key's
  default never changes behaviour; config files set other values)."""
  return sections.overlay(sections.defaults_like(values), values)


def may_change(key: str) -> bool:
  return any(
      key == allowed or (allowed.endswith(".*") and key.startswith(allowed[:-1]))
      for allowed in MAY_CHANGE
  )


def flatten(values: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
  """{"a": {"b": 1}} -> {"a.b": 1}; an empty section has no keys."""
  out = {}
  for key, value in values.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def compare(stored_json: str, config_json: str) -> Tuple[List[Change], List[Change]]:
  """(the changes `MAY_CHANGE` allows, the others) from a checkpoint's stored config to the
  command's, both as the JSON the trainer stores; nothing when either holds no config."""
  stored_values, now_values = json.loads(stored_json or "{}"), json.loads(config_json or "{}")
  if not stored_values or not now_values:
    return [], []
  # Through JSON on both sides: tuples and lists compare equal, as they are stored.
  stored = flatten(in_force(json.loads(stored_config(stored_values).to_json_best_effort())))
  now = flatten(in_force(now_values))
  changes = [
      (key, stored.get(key, ABSENT), now.get(key, ABSENT))
      for key in sorted(stored.keys() | now.keys())
      if stored.get(key, ABSENT) != now.get(key, ABSENT)
  ]
  return [c for c in changes if may_change(c[0])], [c for c in changes if not may_change(c[0])]


def in_force(values: dict) -> dict:
  """The settings a step uses where a key's None stands for a mode's default (the policy
  loss's clip range and aggregation), so that spelling a default out is no change."""
  if isinstance(values.get("ppo"), dict):
    return dict(values, ppo=PPOConfig.in_force(values["ppo"]))
  return values


def describe(changes: List[Change]) -> str:
  """One line: `key: stored -> now` for each change."""
  return "; ".join(f"{key}: {_show(before)} -> {_show(after)}" for key, before, after in changes)


def _show(value: Any) -> str:
  return value if value is ABSENT else repr(value)


def check_resume(ckpt, config_json: str, allow: bool) -> Optional[str]:
  """Compares `config_json` with the config stored in `ckpt`'s newest checkpoint whose
  metadata reads: logs the changes `MAY_CHANGE` allows; returns the refusal (one line) for the
  others, or None when there is none or `allow` (each such change then logged as a warning)."""
  if ckpt.latest_step() is None:
    return None
  meta = ckpt.meta()
  step = meta.get("step")
  allowed, refused = compare(meta.get("config", "{}"), config_json)
  if allowed:
    logging.info("resuming with a changed %s", describe(allowed))
  if refused and not allow:
    return (
        f"the run in {os.path.dirname(ckpt.directory)} was trained under another config "
        f"(checkpoint step {step}): {describe(refused)}. Resume it with the stored values, "
        "start a new run with another --workdir, or pass --allow_config_change to train on "
        "under the new values"
    )
  for change in refused:
    logging.warning("resuming under a changed config: %s", describe([change]))
  return None

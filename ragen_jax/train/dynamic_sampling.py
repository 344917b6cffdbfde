"""DAPO's dynamic sampling (`rollout.dynamic_sampling`): a step's batch refilled with groups
that have reward spread, at a fixed batch shape.

    result = dynamic_sampling.play_groups(engine, policy, rounds, key_of_round, seed_of_round)
    metrics = dynamic_sampling.metrics(results)    # {"rollout/sampling_rounds": ..., ...}

A group has reward spread when the scores of its episodes (`RolloutBatch.scores_B`, the episode
returns; a failed episode carries its group's mean) are not all equal: max - min > SPREAD_TOL.
Under a group-normalised estimator (GRPO) a group without spread has zero advantage and trains
nothing but the KL and entropy terms.

Per environment tag, round 0 plays the step's own levels (`keys.level_seeds_of_step`) with the
step's key, exactly the batch of a step without dynamic sampling. While fewer than `env_groups`
of the groups played so far have spread and fewer than `rollout.max_sampling_rounds` rounds have
run, another round plays `env_groups` groups of fresh levels (`keys.level_seeds_of_round`: a
counter of (step, round) apart from the training levels) with the round's key
(`keys.sampling_round`). `select` then picks the groups trained:

  1. the first `env_groups` groups with spread, in the order played (round, then group);
  2. if too few, the slots left go to the groups without spread in the order played (the
     step's own levels first), so that the batch keeps its `env_groups x group_size` episodes and
     the train step its shapes; under GRPO they carry zero advantage, under GAE their value
     targets still train the critic. Their share is logged (`rollout/trained_zero_std_share`).

The picked groups keep their played order and are renumbered 0..G-1; the batch is rebuilt from
their episodes and, with a visual environment, their frames (`episodes.take_episodes`, then
`episodes.to_result`), so it is exactly what the engine builds for those episodes: each row
shows its own turns' frames. When the picks are round 0's groups in order, round 0's result is
used as it is.

StarPO-S filtering (ppo.filter_*) then runs inside the train step on the refilled batch: it keeps
a share of a fixed batch, whereas dynamic sampling pays more rollouts to fill the batch with
groups that have spread. Validation never samples dynamically (`RolloutConfig.for_validation`).

The result's summary adds `sampling_rounds`, `episodes_played` and `trained_zero_std_groups`;
its cost counters and timings sum over every round played, and its `env_error` is the share of
failed episodes among all played (a failing environment is not hidden by the refills).

Dimension legend: G groups of one round, B = G x group_size episodes.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from ragen_jax.rollout import engine as engine_lib
from ragen_jax.rollout import episodes as episodes_lib

# max - min of a group's scores above this: the group has reward spread (scores are float32
# returns of order 1; this is far below any reward or penalty the environments give).
SPREAD_TOL = 1e-6
_TIMINGS = ("decode_s", "env_s", "host_s", "total_s")


def spread_G(scores_B, group_size: int) -> np.ndarray:
  """Whether each group of `group_size` consecutive episodes has reward spread (module doc)."""
  scores_GxN = np.asarray(scores_B, np.float64).reshape(-1, group_size)
  return (scores_GxN.max(axis=1) - scores_GxN.min(axis=1)) > SPREAD_TOL


def select(spread_by_round: Sequence[Sequence[bool]], groups: int) -> List[Tuple[int, int]]:
  """The (round, group) of the `groups` groups a batch trains on, in the order played: the first
  `groups` with spread, the slots left filled with the first ones without (module doc)."""
  played = [(r, g) for r, spread in enumerate(spread_by_round) for g in range(len(spread))]
  with_spread = [p for p in played if spread_by_round[p[0]][p[1]]][:groups]
  without = [p for p in played if not spread_by_round[p[0]][p[1]]]
  picks = sorted(with_spread + without[: groups - len(with_spread)])
  if len(picks) != groups:
    raise ValueError(f"{len(played)} groups played, fewer than the {groups} a batch holds")
  return picks


def play_groups(
    engine,
    policy,
    rounds: int,
    key_of_round: Callable[[int], Any],
    seed_of_round: Callable[[int], int],
) -> episodes_lib.RolloutResult:
  """A tag's batch: round 0, then refill rounds while too few groups have spread, at most
  `rounds` in all (1: round 0 alone, sampling as without dynamic sampling); module doc.

  Args:
    engine: the tag's `rollout.Rollout` (`run`, `config`, `layout`, `tok`).
    policy: what `engine.run` plays with (a `rollout.ModelPolicy`).
    rounds: `RolloutConfig.sampling_rounds`.
    key_of_round, seed_of_round: round r's sampling key and first level seed.
  """
  c = engine.config
  results, spread = [], []
  while len(results) < rounds and sum(int(s.sum()) for s in spread) < c.env_groups:
    r = len(results)
    results.append(engine.run(policy, key_of_round(r), seed_of_round(r)))
    spread.append(spread_G(results[-1].batch.scores_B, c.group_size))
  picks = select(spread, c.env_groups)
  if picks == [(0, g) for g in range(c.env_groups)]:
    out = results[0]
  else:
    out = _assemble(engine, results, picks)
  played = [ep for result in results for ep in result.episodes]
  out.summary.update({k: sum(res.summary[k] for res in results) for k in _cost_keys()})
  out.summary.update(
      sampling_rounds=float(len(results)),
      episodes_played=float(len(played)),
      trained_zero_std_groups=float(sum(not spread[r][g] for r, g in picks)),
      env_error=float(np.mean([bool(ep.env_error) for ep in played])),
  )
  return out


def _cost_keys() -> Tuple[str, ...]:
  return (*engine_lib.COUNTERS, *_TIMINGS)


def _assemble(engine, results, picks: List[Tuple[int, int]]) -> episodes_lib.RolloutResult:
  """The result of the picked groups' episodes, renumbered 0..G-1 in pick order, with their
  frames (a visual environment's)."""
  n = engine.config.group_size
  taken, frames_KxBxHxWx3 = episodes_lib.take_episodes(
      results, [(r, g * n + i) for r, g in picks for i in range(n)]
  )
  eps = []
  for slot, (r, g) in enumerate(picks):
    group = taken[slot * n : (slot + 1) * n]
    if any(ep.group_id != g for ep in group):
      raise ValueError(f"round {r}: the episodes of group {g} are out of order")
    eps += [dataclasses.replace(ep, group_id=slot) for ep in group]
  stats = dict.fromkeys(engine_lib.COUNTERS, 0)  # summed over the rounds by the caller
  return episodes_lib.to_result(
      eps, engine.config, engine.layout, engine.tok.pad_id, stats, frames_KxBxHxWx3
  )


def metrics(results: Dict[str, episodes_lib.RolloutResult]) -> Dict[str, float]:
  """A step's sampling metrics: rounds played (the most of any tag, and per tag), the share of
  trained groups without reward spread, and the episodes played for it."""
  out, zero, groups = {}, 0.0, 0
  for tag, result in results.items():
    g = len(np.unique(np.asarray(result.batch.group_ids_B)))
    out[f"rollout/{tag}/sampling_rounds"] = result.summary["sampling_rounds"]
    out[f"rollout/{tag}/trained_zero_std_share"] = result.summary["trained_zero_std_groups"] / g
    zero, groups = zero + result.summary["trained_zero_std_groups"], groups + g
  out["rollout/sampling_rounds"] = max(r.summary["sampling_rounds"] for r in results.values())
  out["rollout/trained_zero_std_share"] = zero / max(groups, 1)
  out["rollout/episodes_played"] = sum(r.summary["episodes_played"] for r in results.values())
  return out

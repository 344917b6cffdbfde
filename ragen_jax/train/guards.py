"""What ends a run rather than train on bad data, and RAGEN's stopping rules as they fire.

A non-finite loss stops the run without saving (the last checkpoint stays the last good one); a
rollout or validation in which more episodes of a tag than `envs.<tag>.max_env_errors` ended in
an environment fault stops it before anything trains on them. Both errors name the latest
checkpoint, so the message says where the run can go on from.
"""

from typing import Any, Dict, Optional, Sequence, Tuple

from absl import logging
import numpy as np


class NonFiniteLossError(RuntimeError):
  """A train step produced a NaN or infinite loss; the run stops without saving."""


class EnvironmentFailure(RuntimeError):
  """More of a rollout's episodes than `envs.<tag>.max_env_errors` ended in an environment
  fault; the run stops before training on them."""


_LOSS_KEYS = ("actor/pg_loss", "critic/vf_loss", "actor/kl_loss", "actor/entropy")


def check_losses(metrics: Dict[str, float], step: int, ckpt) -> None:
  """Raises NonFiniteLossError when a loss of the step's `metrics` is NaN or infinite."""
  bad = [k for k in _LOSS_KEYS if k in metrics and not np.isfinite(metrics[k])]
  if bad:
    raise NonFiniteLossError(
        f"step {step}: {', '.join(bad)} is not finite ({metrics[bad[0]]}); stopping "
        f"without saving. The last good checkpoint is step {ckpt.latest_step()} in "
        f"{ckpt.directory}; lower ppo.actor_lr or check the data."
    )


def check_env_errors(
    env_specs: Sequence[Any], shares: Dict[str, Tuple[float, Sequence[Any]]], step: int, ckpt
) -> None:
  """Raises EnvironmentFailure when a tag's share of failed episodes exceeds its
  `max_env_errors` (`shares`: {tag: (that share, the tag's rollout.Episode records)})."""
  for spec in env_specs:
    share, episodes = shares[spec.tag]
    if share > spec.max_env_errors:
      first = next((ep.env_error for ep in episodes if ep.env_error), "")
      raise EnvironmentFailure(
          f"step {step}: {share:.0%} of the episodes of envs.{spec.tag} ({spec.label}) ended "
          f"in an environment fault, more than envs.{spec.tag}.max_env_errors="
          f"{spec.max_env_errors:g}; nothing was trained on them. First fault: {first}. "
          f"The last checkpoint is step {ckpt.latest_step()} in {ckpt.directory}."
      )


def fired(events, metrics: Dict[str, float]) -> Optional[Dict[str, Any]]:
  """Logs the stopping rules that fired into `metrics` (1.0 under each rule's metric) and as
  warnings; returns the first one in "stop" mode (as JSON for the checkpoint) or None."""
  stopped = None
  for event in events:
    metrics[event.metric] = 1.0
    logging.warning("%s at step %d: %s", event.metric, event.step, event.message)
    if event.stop and stopped is None:
      stopped = {"rule": event.rule, "step": event.step, "message": event.message}
  return stopped

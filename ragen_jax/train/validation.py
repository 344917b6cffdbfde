"""Validation on the fixed seeds, shared by the trainer and `python -m ragen_jax.evaluate`.

Every environment tag plays `val_groups` groups (group g starts from the level of seed
`seed.val + g`) of `rollout.val_group_size` episodes at `rollout.val_temperature` (RAGEN: 0.5),
in batches of at most `rollout.val_batch_groups` groups. A last, partial batch still plays a
full one (same shapes, no recompile) and keeps only its first groups.

A visual environment's records also carry each turn's frame (`turn_frames`, PNG data URIs;
rollout.images), which the viewer shows beside the turn's text.

Metrics: `val/<tag>/<metric>` per tag, `val/<metric>` pooled over tags, and
`val/<tag>/pass@k` (k = val_group_size: any success within a group).
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Tuple

import jax
import numpy as np

from ragen_jax import atomic_write
from ragen_jax import logging_utils
from ragen_jax import rollout as rollout_lib
from ragen_jax import viewer
from ragen_jax import keys
from ragen_jax.train import batching


def engines(exp, tokenizer, sharder=None) -> Dict[str, rollout_lib.Rollout]:
  return {
      e.tag: rollout_lib.Rollout(
          e.make(validation=True),
          tokenizer,
          e.rollout_config(exp.rollout, validation=True),
          sharder,
      )
      for e in exp.envs
  }


def batches(exp, spec, engine):
  """(start group, level seed, episodes to keep) of each validation batch of one tag."""
  size, k = engine.config.env_groups, exp.rollout.val_group_size
  for start in range(0, spec.val_groups, size):
    yield start, keys.validation_level_seed(exp, start), min(size, spec.val_groups - start) * k


def run(exp, val_engines, policy) -> Tuple[Dict[str, float], List[rollout_lib.Episode]]:
  """(metrics, every episode) of `policy` (built: `rollout.ModelPolicy(model)`, or an endpoint's
  `api_policy.ApiPolicy`) on every tag's validation levels; an episode's `env` is its tag, its
  `group_id` the validation group (seed `seed.val + group_id`)."""
  key = keys.validation(exp.seed)
  metrics, pooled, episodes = {}, {}, []
  k = exp.rollout.val_group_size
  for spec in exp.envs:
    engine = val_engines[spec.tag]
    per_episode = {}
    for start, seed, keep in batches(exp, spec, engine):
      result = engine.run(policy, jax.random.fold_in(key, start), seed=seed)
      engine.shown.record_frames(result)  # a visual environment's frames, for the records
      batching.add_env_metrics(engine.env, result)
      for name, values in result.metrics.items():
        per_episode.setdefault(name, []).append(values[:keep])
      episodes += [
          dataclasses.replace(ep, env=spec.tag, group_id=start + ep.group_id)
          for ep in result.episodes[:keep]
      ]
    for name, parts in per_episode.items():
      values = np.concatenate(parts)
      metrics[f"val/{spec.tag}/{name}"] = float(values.mean())
      pooled.setdefault(name, []).append(values)
    success = np.concatenate(per_episode["success"]).reshape(-1, k)
    metrics[f"val/{spec.tag}/pass@{k}"] = float(success.max(axis=1).mean())
  for name, parts in pooled.items():
    metrics[f"val/{name}"] = float(np.concatenate(parts).mean())
  return metrics, episodes


def write_outputs(
    workdir: str,
    step: int,
    episodes: List[rollout_lib.Episode],
    writer,
    tags,
    sample_trajectories: int,
) -> None:
  """A validation's trajectories: `eval/step_<s>.jsonl`, the viewer page `viewer/step_<s>.html`
  and the first `sample_trajectories` of each tag as TensorBoard text (process 0 only)."""
  if jax.process_index() != 0:
    return
  records = [ep.to_json() for ep in episodes]
  write_jsonl(os.path.join(workdir, "eval", f"step_{step}.jsonl"), records)
  viewer.write_html(
      os.path.join(workdir, "viewer", f"step_{step}.html"),
      records,
      title=f"{os.path.basename(os.path.abspath(workdir))}: validation at " f"step {step}",
  )
  for tag in tags:
    samples = [e for e in records if e["env"] == tag][:sample_trajectories]
    if samples:
      writer.text(step, f"val/{tag}/trajectories", markdown(samples))


def write_jsonl(path: str, episodes: List[Dict[str, Any]]) -> None:
  """One JSON line per episode record (`Episode.to_json()`), UTF-8 whatever the locale,
  replacing `path` whole."""
  atomic_write.write_text(
      path, "".join(json.dumps(ep, ensure_ascii=False) + "\n" for ep in episodes)
  )


def markdown(episodes: List[Dict[str, Any]]) -> str:
  """Episode records (`Episode.to_json()`) as TensorBoard text: a header line and the
  conversation in a code block that no model reply can close (logging_utils.code_block), so
  none renders as links or images."""
  parts = []
  for ep in episodes:
    body = "\n".join(f"[{m['role']}]\n{m['content']}" for m in ep["messages"][1:])
    parts.append(
        f"**{ep['env']} seed {ep['seed']}**: success {ep['success']}, reward "
        f"{ep['reward']:.2f}, turns {ep['turns']}\n\n{logging_utils.code_block(body)}"
    )
  return "\n\n".join(parts)

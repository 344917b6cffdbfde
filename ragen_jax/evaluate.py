r"""Evaluates a policy on the fixed validation levels, as RAGEN's validation does.

  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py --checkpoint=DIR \
      --output=/tmp/eval.jsonl

`--checkpoint` is a Hugging Face Qwen2 directory (config.json + *.safetensors; its
tokenizer.json when present, else `config.model.tokenizer`). Without it, a randomly initialised
`config.model.preset` model (seed `config.seed.init`) with `config.model.tokenizer` is evaluated.
Training (orbax) checkpoints are not readable yet: they wait for the trainer.

Validation: groups g = 0 .. val_env_groups - 1 start from the level of seed `seed.val + g`,
`val_group_size` episodes each, sampled at `rollout.val_temperature` (RAGEN: 0.5), played in
batches of `min(rollout.env_groups, val_env_groups)` groups. Reports success rate, pass@k
(k = group size: any success in the group), mean return (environment reward plus format
penalties) and the other rollout metrics; writes one JSON line per trajectory (messages,
success, reward, turns).

Dimension legend: B episodes per batch, G groups per batch.
"""
import json
import os
from typing import Any, Dict, Optional, Tuple

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None,
                                  "Hugging Face checkpoint directory; none = random model.")
_OUTPUT = flags.DEFINE_string("output", "eval_trajectories.jsonl",
                              "Where to write one JSON line per trajectory.")


def load_policy(config, checkpoint: Optional[str] = None
                ) -> Tuple[models.Qwen2, tokenizers.Tokenizer]:
  """The model and tokenizer to evaluate (see the module doc).

  Raises:
    ValueError: `checkpoint` is not a Hugging Face directory (e.g. a training checkpoint).
  """
  dtype = jnp.dtype(config.model.dtype)
  if checkpoint is None:
    model = models.create(config.model.preset, jax.random.key(config.seed.init), dtype=dtype,
                          param_dtype=dtype)
    return model, tokenizers.load(config.model.tokenizer)
  if not os.path.exists(os.path.join(checkpoint, "config.json")):
    raise ValueError(
        f"{checkpoint} has no config.json: only Hugging Face checkpoint directories can be "
        "evaluated for now; training (orbax) checkpoints need the trainer's restore code")
  model = models.load_hf(checkpoint, dtype=dtype)
  if os.path.exists(os.path.join(checkpoint, "tokenizer.json")):
    tok = tokenizers.load(checkpoint)
  else:
    logging.info("no tokenizer.json in %s; using %s", checkpoint, config.model.tokenizer)
    tok = tokenizers.load(config.model.tokenizer)
  if tok.vocab_size > model.config.vocab_size:
    raise ValueError(f"tokenizer has {tok.vocab_size} ids but the model only "
                     f"{model.config.vocab_size} rows")
  return model, tok


def evaluate(config, checkpoint: Optional[str] = None, output: Optional[str] = None,
             model=None, tokenizer=None) -> Dict[str, Any]:
  """Runs validation; returns the summary and writes the trajectories to `output`.

  Args:
    config: experiment config (env, model, rollout, seed sections).
    checkpoint: see `load_policy`; ignored when `model` is given.
    output: JSON-lines path, or None to write nothing.
    model, tokenizer: an in-memory policy to evaluate instead of loading one.

  Returns:
    Dict of metric means over all validation episodes plus success, pass@k, mean_return.
  """
  if model is None:
    model, tokenizer = load_policy(config, checkpoint)
  env = envs.make(config.env.name, **config.env.options.to_dict())
  r = config.rollout
  engine = rollout.Rollout(env, tokenizer, rollout.config_from(config, validation=True))
  key = jax.random.key(config.seed.init)
  metrics, lines = {}, []
  for start in range(0, r.val_env_groups, engine.config.env_groups):
    # A last, partial batch still plays a full one (same shapes, no recompile) and keeps only
    # its first groups.
    keep = min(engine.config.env_groups, r.val_env_groups - start) * r.val_group_size
    result = engine.run(model, jax.random.fold_in(key, start), seed=config.seed.val + start)
    for name, values in result.metrics.items():
      metrics.setdefault(name, []).append(values[:keep])
    for i, episode in enumerate(result.episodes[:keep]):
      group = start + episode["group_id"]
      lines.append({**episode, "env": config.env.name, "group_id": group,
                    "seed": config.seed.val + group, "episode": i % r.val_group_size})
  per_episode = {name: np.concatenate(v) for name, v in metrics.items()}
  success = per_episode["success"].reshape(-1, r.val_group_size)
  summary = {name: float(np.mean(v)) for name, v in per_episode.items()}
  summary["mean_return"] = summary.pop("return")
  summary[f"pass@{r.val_group_size}"] = float(np.mean(success.max(axis=1)))
  summary["num_episodes"] = int(success.size)
  if output:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as fp:
      for line in lines:
        fp.write(json.dumps(line, ensure_ascii=False) + "\n")
  return summary


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required")
  logging.info("jax %s, devices %s", jax.__version__, jax.devices())
  summary = evaluate(config, _CHECKPOINT.value, _OUTPUT.value)
  print(json.dumps(summary, indent=1, sort_keys=True))
  logging.info("wrote trajectories to %s", _OUTPUT.value)


if __name__ == "__main__":
  app.run(main)

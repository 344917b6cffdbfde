r"""Evaluates a policy on the fixed validation levels, as RAGEN's validation does.

  python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py --checkpoint=DIR \
      --output=/tmp/eval.jsonl

`--checkpoint` is a training run (its workdir, its `checkpoints/` directory or one
`checkpoints/<step>` directory: the run's own config rebuilds the model and `--config`, when
given, chooses what is evaluated) or a Hugging Face Qwen2 directory (config.json and
model.safetensors or model.safetensors.index.json, its tokenizer.json when present). A directory
with `checkpoints/` is a run, whatever else it holds (every workdir has a config.json); one that
is neither is refused with what it lacks, in one line. Without `--checkpoint`, the config's own
starting policy is evaluated: the tiny preset's shipped warm start, or with
`--config.model.warm_start=False` the randomly initialised `config.model.preset` (seed
`config.seed.init`).

Validation (ragen_jax.train.validation): every environment tag plays `val_groups` groups from
seeds `seed.val + g`, `rollout.val_group_size` episodes each, at `rollout.val_temperature`
(RAGEN: 0.5). Prints success rate, pass@k (k = group size), mean return (environment reward
plus format penalties) and the other rollout metrics, per tag and pooled; writes one JSON line
per trajectory (messages, success, reward, turns), UTF-8 and replacing the file whole.
"""

import json
from typing import Any, Dict, Optional

from absl import app
from absl import flags
from absl import logging
import jax

from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import launch_utils
from ragen_jax.train import restore
from ragen_jax.train import validation

_CONFIG = cli.define_config_flag(None)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    None,
    "Training run or Hugging Face directory; none = a randomly initialised model.",
)
_OUTPUT = flags.DEFINE_string(
    "output", "eval_trajectories.jsonl", "Where to write one JSON line per trajectory."
)


# Loading is shared with ragen_jax.serve_model; these names stay here for callers.
load_policy = restore.load_policy
checkpoint_kind = restore.checkpoint_kind


def evaluate(
    config,
    checkpoint: Optional[str] = None,
    output: Optional[str] = None,
    model=None,
    tokenizer=None,
) -> Dict[str, Any]:
  """Runs validation; returns the metrics and writes the trajectories to `output`.

  Args:
    config: experiment config; None to use a training checkpoint's own.
    checkpoint: see the module doc; ignored when `model` is given.
    output: JSON-lines path, or None to write nothing.
    model, tokenizer: an in-memory policy to evaluate instead of loading one.
  """
  if model is None:
    model, tokenizer, config = load_policy(config, checkpoint)
  exp = schema.from_config(config)
  metrics, episodes = validation.run(exp, validation.engines(exp, tokenizer), model)
  metrics["val/num_episodes"] = len(episodes)
  if output:
    validation.write_jsonl(output, [ep.to_json() for ep in episodes])
  return metrics


def main(argv):
  del argv
  logging.info("jax %s, devices %s", jax.__version__, jax.devices())
  try:
    model, tokenizer, config = load_policy(_CONFIG.value, _CHECKPOINT.value)
  except (FileNotFoundError, ValueError) as e:  # what the operator passed: one line, no trace
    launch_utils.exit_with_error(str(e))
  metrics = evaluate(config, output=_OUTPUT.value, model=model, tokenizer=tokenizer)
  print(json.dumps(metrics, indent=1, sort_keys=True))
  logging.info("wrote trajectories to %s", _OUTPUT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser(_CONFIG, launch_utils.fail))

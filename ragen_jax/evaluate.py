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

An OpenAI-compatible endpoint instead of a model (ragen_jax.rollout.api_policy; the `api` config
section):

  OPENAI_API_KEY=... python -m ragen_jax.evaluate --config=configs/sokoban_ppo.py \
      --api_base=https://api.openai.com/v1 --api_model=gpt-4o-mini \
      --config.api.key_env=OPENAI_API_KEY --config.api.greedy=True

writes the same trajectories and metrics, plus `api/prompt_tokens`, `api/completion_tokens`,
`api/requests` and `api/failed_turns` (turns that got no reply after the retries: their episodes
fail as on an environment fault, `val/env_error`). The config's tokenizer counts the tokens of
the conversation (context limits, replies).
"""

import json
from typing import Any, Dict, Optional

from absl import app
from absl import flags
from absl import logging
import jax

from ragen_jax import rollout
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.rollout import api_policy
from ragen_jax.train import launch_utils
from ragen_jax.train import policy as policy_lib
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
_API_BASE = flags.DEFINE_string(
    "api_base", None, "OpenAI-compatible base URL to evaluate instead of a model (api.base_url)."
)
_API_MODEL = flags.DEFINE_string("api_model", None, "The endpoint's model name (api.model).")


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
    model, tokenizer: an in-memory model to evaluate instead of loading one.
  """
  if model is None:
    model, tokenizer, config = load_policy(config, checkpoint)
  return _validate(config, rollout.ModelPolicy(model), tokenizer, output)


def _validate(config, policy, tokenizer, output: Optional[str]) -> Dict[str, Any]:
  """Validation of a built policy (rollout.policies); writes the trajectories to `output`."""
  exp = schema.from_config(config)
  metrics, episodes = validation.run(exp, validation.engines(exp, tokenizer), policy)
  metrics["val/num_episodes"] = len(episodes)
  if output:
    validation.write_jsonl(output, [ep.to_json() for ep in episodes])
  return metrics


def with_api(config, base_url: Optional[str] = None, model: Optional[str] = None):
  """`config` with api.base_url / api.model set where given (a copy)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    if base_url is not None:
      config.api.base_url = base_url
    if model is not None:
      config.api.model = model
  return config


def evaluate_api(config, output: Optional[str] = None) -> Dict[str, Any]:
  """`evaluate` with the endpoint of `config.api` answering every turn, plus its usage."""
  exp = schema.from_config(config)
  if exp.api.base_url is None:
    raise ValueError("api.base_url is not set (--api_base)")
  client = api_policy.ApiClient(exp.api)
  try:
    tokenizer = policy_lib.load_tokenizer(exp.model)
    metrics = _validate(config, api_policy.ApiPolicy(client), tokenizer, output)
  finally:
    client.close()
  metrics.update({f"api/{name}": value for name, value in client.usage.items()})
  return metrics


def main(argv):
  del argv
  logging.info("jax %s, devices %s", jax.__version__, jax.devices())
  config = _CONFIG.value
  use_api = bool(_API_BASE.value or (config is not None and config.api.base_url))
  try:
    if use_api:
      if config is None or _CHECKPOINT.value is not None:
        raise ValueError("--api_base needs --config and takes no --checkpoint")
      config = with_api(config, _API_BASE.value, _API_MODEL.value)
      api_policy.ApiClient(schema.from_config(config).api).close()  # the key is there
    else:
      model, tokenizer, config = load_policy(config, _CHECKPOINT.value)
  except (FileNotFoundError, ValueError) as e:  # what the operator passed: one line, no trace
    launch_utils.exit_with_error(str(e))
  if use_api:
    metrics = evaluate_api(config, output=_OUTPUT.value)
  else:
    metrics = evaluate(config, output=_OUTPUT.value, model=model, tokenizer=tokenizer)
  print(json.dumps(metrics, indent=1, sort_keys=True))
  logging.info("wrote trajectories to %s", _OUTPUT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser(_CONFIG, launch_utils.fail))

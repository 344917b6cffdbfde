"""Opening a training run's checkpoint outside the trainer (evaluation, export, serving).

    model, tokenizer, config, step = restore.load_actor("runs/sokoban")   # latest step
    restore.load_actor("runs/sokoban/checkpoints/40")                      # a given step

The run's own config (stored in every checkpoint's metadata, overlaid on today's defaults so
that keys added since still open) rebuilds the model structure; the actor parameters are then
restored into it, shapes checked. `load_policy` opens whatever `--checkpoint` of evaluate and
serve_model names: a run, a Hugging Face directory, a GGUF file, or (none) the config's starting
policy.
"""

import json
import os
from typing import Optional, Tuple

from absl import logging
import ml_collections

from ragen_jax import algos
from ragen_jax import checkpoints
from ragen_jax.config import drift
from ragen_jax.config import schema
from ragen_jax.models import checkpoint as hf_checkpoint
from ragen_jax.models import gguf_checkpoint
from ragen_jax.train import policy as policy_lib
from ragen_jax.train import run_state


def locate(path: str) -> Tuple[str, Optional[int]]:
  """(checkpoint directory, step or None for the latest) for a workdir, its `checkpoints/`
  directory, or one step directory inside it."""
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return os.path.join(path, "checkpoints"), None
  name = os.path.basename(path)
  if name.isdigit() and os.path.isdir(path):
    return os.path.dirname(path), int(name)
  if os.path.isdir(path) and any(d.isdigit() for d in os.listdir(path)):
    return path, None
  raise FileNotFoundError(
      f"{path} is not a training run: expected a workdir with "
      "checkpoints/, a checkpoints/ directory, or checkpoints/<step>"
  )


def run_config(path: str) -> Tuple[ml_collections.ConfigDict, str, Optional[int]]:
  """(the run's config, checkpoint directory, step) from the checkpoint metadata."""
  directory, step = locate(path)
  ckpt = checkpoints.Checkpointer(directory)
  try:
    meta = ckpt.meta(step)
  finally:
    ckpt.close()
  if "config" not in meta:
    raise ValueError(f"the checkpoint in {directory} has no config in its metadata")
  return drift.stored_config(json.loads(meta["config"])), directory, step


def load_actor(path: str):
  """(actor model with the trained weights, tokenizer, run config, step)."""
  config, directory, step = run_config(path)
  exp = schema.from_config(config)
  model, tok = policy_lib.build(exp)
  ckpt = checkpoints.Checkpointer(directory)
  try:
    state, meta = ckpt.restore(run_state.abstract(model, exp), step)
  finally:
    ckpt.close()
  if isinstance(state, run_state.PipelinedState):
    state = state.run
  return algos.actor_module(model, state.train), tok, config, int(meta["step"])


def load_policy(config, checkpoint: Optional[str] = None):
  """(model, tokenizer, config) of `checkpoint`; the config is the run's when `config` is None."""
  if checkpoint is not None and checkpoint_kind(checkpoint) == "run":
    model, tok, stored, step = load_actor(checkpoint)
    logging.info("loading step %d of the run in %s", step, checkpoint)
    return model, tok, config if config is not None else stored
  if config is None:
    raise ValueError("--config is required unless --checkpoint is a training run")
  if checkpoint is not None:
    config = config.copy_and_resolve_references()  # the caller's config stays as it was
    with config.unlocked():
      config.model.checkpoint = checkpoint
      config.sft.steps = 0
  model, tok = policy_lib.build(schema.from_config(config))
  return model, tok, config


def checkpoint_kind(path: str) -> str:
  """What `path` holds, "run", "hugging_face" or "gguf"; FileNotFoundError naming what it lacks.

  A run's workdir holds a config.json too (its resolved config), so `checkpoints/` decides.
  """
  if gguf_checkpoint.is_gguf(path):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"--checkpoint {path}: no such GGUF file")
    return "gguf"
  try:
    locate(path)
    return "run"
  except FileNotFoundError:
    pass
  if not os.path.isdir(path):
    raise FileNotFoundError(f"--checkpoint {path}: no such directory or GGUF file")
  missing = hf_checkpoint.missing_files(path)
  if missing:
    raise FileNotFoundError(
        f"--checkpoint {path} is neither a training run (no checkpoints/ directory or step "
        f"directories) nor a Hugging Face checkpoint (no {', no '.join(missing)})"
    )
  return "hugging_face"

r"""Serves a policy behind an OpenAI-compatible chat-completions endpoint.

  python -m ragen_jax.serve_model --checkpoint=runs/sokoban_ppo --port=8000
  RAGEN_JAX_SERVE_TOKEN=secret python -m ragen_jax.serve_model --checkpoint=DIR --host=0.0.0.0

`--checkpoint` takes what `ragen_jax.evaluate --checkpoint` takes (a training run's workdir, its
checkpoints or one step; a Hugging Face Qwen2 directory); without it the config's starting policy
is served (by default the tiny preset's shipped warm start). `--config` (optional) sets the model
section for a Hugging Face directory (dtype, tokenizer without tokenizer.json); a run brings its
own. The server binds 127.0.0.1 unless `--host` says otherwise; the bearer token comes from
`--token` or the environment variable RAGEN_JAX_SERVE_TOKEN (prefer the variable: a command line
is visible to every user of the machine) and is never logged. Routes, batching and errors:
ragen_jax.model_server.
"""

import os
from typing import Optional

from absl import app
from absl import flags
from absl import logging

from ragen_jax import json_http
from ragen_jax import model_server
from ragen_jax.config import cli
from ragen_jax.config import sections
from ragen_jax.train import launch_utils
from ragen_jax.train import restore

TOKEN_ENV = "RAGEN_JAX_SERVE_TOKEN"


def default_config():
  """The config a Hugging Face directory or the warm start is served with when none is given
  (only its model section matters)."""
  return sections.experiment(envs={"sokoban": sections.env("sokoban")})


def load(checkpoint: Optional[str] = None, config=None):
  """(model, tokenizer, model name) to serve, loaded as `ragen_jax.evaluate` loads them."""
  if config is None and (checkpoint is None or restore.checkpoint_kind(checkpoint) != "run"):
    config = default_config()
  model, tok, config = restore.load_policy(config, checkpoint)
  if checkpoint is not None:
    path = os.path.normpath(os.path.abspath(checkpoint))
    name = os.path.basename(path)
    if name.isdigit():  # runs/NAME/checkpoints/STEP
      name = f"{os.path.basename(os.path.dirname(os.path.dirname(path)))}_step{name}"
    elif name == "checkpoints":
      name = os.path.basename(os.path.dirname(path))
  elif config.model.checkpoint:
    name = os.path.basename(os.path.normpath(config.model.checkpoint))
  else:
    name = "tiny_warm_start" if config.model.warm_start else config.model.preset
  return model, tok, name


def make_server(
    model,
    tokenizer,
    model_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: Optional[str] = None,
    batch: model_server.BatchConfig = model_server.BatchConfig(),
    max_tokens: int = 256,
    max_n: int = 8,
) -> model_server.ChatServer:
  """A bound (not yet started) server of `model`; `.start()` serves in a thread."""
  batcher = model_server.Batcher(model, tokenizer, batch)
  try:
    return model_server.ChatServer(batcher, model_name, host, port, token, max_tokens, max_n)
  except OSError:
    batcher.close()
    raise


def main(argv):
  del argv
  f = flags.FLAGS
  try:
    model, tok, name = load(f.checkpoint, f.config)
    batch = model_server.BatchConfig(
        max_batch=f.max_batch,
        window_s=f.window_ms / 1000,
        max_context=min(f.max_context, model.config.max_position_embeddings),
        seed=f.seed,
    )
    token = f.token or os.environ.get(TOKEN_ENV) or None
    server = make_server(
        model,
        tok,
        f.model_name or name,
        host=f.host,
        port=f.port,
        token=token,
        batch=batch,
        max_tokens=f.max_tokens,
        max_n=f.max_n,
    )
  except (FileNotFoundError, ValueError, OSError) as e:  # what the operator passed: one line
    launch_utils.exit_with_error(str(e))
  if token is None and f.host not in json_http.LOOPBACK:
    logging.warning("serving on %s without a token: anyone who reaches it can use it", f.host)
  print(f"serving {server.model_name!r} at {server.url} (auth: {'token' if token else 'none'})")
  server.serve_until_interrupted()  # closing it closes the batcher


def _define_flags() -> flags.FlagHolder:
  """Defines the command's flags (only when run as a program, so that importing this module
  beside ragen_jax.evaluate defines no flag twice); returns `--config`."""
  config = cli.define_config_flag(None)
  flags.DEFINE_string(
      "checkpoint", None, "Training run or Hugging Face directory; none = the config's policy."
  )
  flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0 exposes it).")
  flags.DEFINE_integer("port", 8000, "Port to bind (0 = any free port).")
  flags.DEFINE_string("token", None, f"Bearer token (or ${TOKEN_ENV}); none = open.")
  flags.DEFINE_string(
      "model_name", None, "Name clients pass as `model`; default: the checkpoint's directory."
  )
  flags.DEFINE_integer("max_batch", 64, "Most rows per sampler call (a power of two).")
  flags.DEFINE_float("window_ms", 10.0, "How long to collect requests into a batch.")
  flags.DEFINE_integer("max_tokens", 256, "Most reply tokens a request may ask for.")
  flags.DEFINE_integer("max_context", 4096, "Most prompt + reply tokens of a request.")
  flags.DEFINE_integer("max_n", 8, "Most choices per request.")
  flags.DEFINE_integer("seed", 0, "PRNG seed of requests that give none.")
  return config


if __name__ == "__main__":
  _CONFIG = _define_flags()
  app.run(main, flags_parser=cli.flags_parser(_CONFIG, launch_utils.fail))

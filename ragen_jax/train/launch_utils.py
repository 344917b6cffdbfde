"""What `launch.py` does around the trainer: early override checks and the start-up log."""

import importlib.util
import os
import platform
import sys

from absl import logging
import jax

from ragen_jax import config_sections


def load_config_file(spec: str):
  """The ConfigDict of `path[:variant]`, loaded the way ml_collections' config flag does."""
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} not found")
  module_spec = importlib.util.spec_from_file_location("experiment_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant or None)


def check_argv(argv, default_config: str) -> None:
  """Exits with a one-line message (status 2) on an unknown `--config.*` key or variant."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), default_config)
  try:
    config_sections.check_overrides(load_config_file(spec), argv)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


class _QuietLibraries:
  """Drops INFO records of orbax (dozens per save) so the console shows the run itself."""

  def filter(self, record) -> bool:
    return record.levelno > 20 or "/orbax/" not in record.pathname


def log_start(config, workdir: str) -> None:
  """Versions, devices and the resolved config, to the log and `workdir/config.json`."""
  import flax, optax, orbax.checkpoint  # pylint: disable=g-import-not-at-top,multiple-imports

  logging.get_absl_handler().addFilter(_QuietLibraries())
  logging.info(
      "python %s, jax %s, jaxlib %s, flax %s, optax %s, orbax %s",
      platform.python_version(),
      jax.__version__,
      jax.lib.__version__,
      flax.__version__,
      optax.__version__,
      orbax.checkpoint.__version__,
  )
  logging.info(
      "devices: %s (process %d of %d)", jax.devices(), jax.process_index(), jax.process_count()
  )
  logging.info("workdir: %s\nconfig:\n%s", os.path.abspath(workdir), config)
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as fp:
      fp.write(config.to_json_best_effort(indent=1))

"""What `launch.py` does around the trainer: the start-up log, and the one-line errors and exit
statuses an operator sees.

Exit statuses of launch.py: 0 when the run is done, or stopped by Ctrl-C or SIGTERM with its
step saved (run the same command to resume); `EXIT_CONFIG` (2) when the command is wrong;
`EXIT_RUN_FAILED` (3) when the run stopped on a failure it names. Both print one line,
`error: <message>`, on stderr; any other exception is a bug and keeps its traceback.
"""

import os
import platform
import sys
from typing import NoReturn

from absl import logging
import jax

from ragen_jax import checkpoints
from ragen_jax.config import cli
from ragen_jax.train import trainer

# An unknown key or variant, a bad value, a mesh the devices do not fit, a config that differs
# from the one the workdir's run was trained under: fix the command (nothing was written).
EXIT_CONFIG = 2
# A non-finite loss, too many environment faults, a checkpoint that cannot be saved or restored:
# the message names it; the workdir keeps its last good checkpoint.
EXIT_RUN_FAILED = 3
CONFIG_ERRORS = (trainer.ConfigError, cli.CommandError)
RUN_FAILURES = (
    trainer.NonFiniteLossError,
    trainer.EnvironmentFailure,
    checkpoints.NonFiniteError,
    checkpoints.NoUsableCheckpoint,
    checkpoints.SaveError,
)
OPERATOR_ERRORS = CONFIG_ERRORS + RUN_FAILURES


def fail(error: BaseException) -> NoReturn:
  """Exits with `error` as one line on stderr and its status (`EXIT_CONFIG` for CONFIG_ERRORS,
  else `EXIT_RUN_FAILED`)."""
  exit_with_error(str(error), EXIT_CONFIG if isinstance(error, CONFIG_ERRORS) else EXIT_RUN_FAILED)


def exit_with_error(message: str, status: int = EXIT_CONFIG) -> NoReturn:
  """Exits with `message` as one line on stderr, `error: ...`, and `status`."""
  print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
  sys.exit(status)


class _QuietLibraries:
  """Drops INFO records of orbax (dozens per save) so the console shows the run itself."""

  def filter(self, record) -> bool:
    return record.levelno > 20 or "/orbax/" not in record.pathname


def log_start(config, workdir: str) -> None:
  """Versions, devices and the resolved config, to the log (the trainer writes
  `workdir/config.json` once the config and any resume have passed their checks)."""
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

r"""Trains an agent: python launch.py --config=configs/sokoban_ppo.py [--workdir=DIR]

Overrides: --config.section.key=value (e.g. --config.trainer.total_steps=100); a key that does
not exist fails at once with the valid keys named. Variants (ragen_jax/config/variants.py),
joined by commas: configs/sokoban_ppo.py:smoke, configs/sokoban_ppo.py:model=qwen2.5-3b,hw=h100
--config.model.checkpoint=/path/to/Qwen2.5-3B-Instruct (or the shorthand :qwen2.5-3b-h100).
Running the same command again resumes from the workdir's latest checkpoint; a config changed
from the checkpoint's (beyond the schedule, cadences and stopping rules) is refused unless
--allow_config_change. Ctrl-C or SIGTERM (a scheduler's preemption) finishes the current step,
saves it and exits 0; a second one aborts. Errors an operator can fix end in one line,
`error: <message>`, and exit status 2 (the command) or 3 (the run; launch_utils).

Multi-process: the same command on every process, with --coordinator_address=host:port
--num_processes=N --process_id=i, or none of them under SLURM / on a TPU pod / with
JAX_COORDINATOR_ADDRESS set (ragen_jax/distributed.py; scripts in experiments/launch/).
"""

from absl import app
from absl import flags
from absl import logging

from ragen_jax import distributed
from ragen_jax.config import cli
from ragen_jax.train import launch_utils
from ragen_jax.train import trainer

_CONFIG = cli.define_config_flag("configs/sokoban_ppo.py")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (default: runs/<config name>[_<variant>])."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (multi-process runs)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (0 .. N-1).")
_LOCAL_DEVICES = flags.DEFINE_string(
    "local_device_ids", None, "Comma-separated local devices of this process."
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume the workdir's run even though this config changes keys its checkpoints were "
    "trained under (each change is logged as a warning).",
)


def main(argv):
  del argv
  try:
    distributed.initialize(
        _COORDINATOR.value,
        _NUM_PROCESSES.value,
        _PROCESS_ID.value,
        distributed.parse_device_ids(_LOCAL_DEVICES.value),
    )
  except distributed.LaunchError as e:
    launch_utils.exit_with_error(str(e))
  config = _CONFIG.value
  workdir = _WORKDIR.value or cli.default_workdir(cli.config_spec(_CONFIG))
  launch_utils.log_start(config, workdir)
  try:
    summary = trainer.train(config, workdir, allow_config_change=_ALLOW_CONFIG_CHANGE.value)
  except launch_utils.OPERATOR_ERRORS as e:
    launch_utils.fail(e)
  logging.info(
      "%s at step %s; workdir %s",
      "stopped" if summary.get("interrupted") else "done",
      summary.get("step"),
      workdir,
  )


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser(_CONFIG, launch_utils.fail))

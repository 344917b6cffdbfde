"""The command line's config: `--config=configs/x.py[:variant]` and `--config.a.b=value`.

    config_flag = cli.define_config_flag("configs/sokoban_ppo.py")
    app.run(main, flags_parser=cli.flags_parser(config_flag, on_error))
    workdir = cli.default_workdir(cli.config_spec(config_flag))

ml_collections' config flag loads the file and applies the overrides as absl parses argv, once.
Only when that fails are the command and the file read again, to say what was wrong in one line
(an unknown key with the valid keys there, an unknown variant, a missing file) instead of a
traceback: `CommandError`, which the command turns into its exit status. `load_config_file` is
the same load for code and tests (no flags).
"""

import importlib.util
import os
from typing import Callable, List, NoReturn

from absl import flags
import ml_collections
from ml_collections import config_flags


class CommandError(ValueError):
  """The command's config cannot be loaded: an unknown key or variant, a bad value, no file."""


def define_config_flag(default: str | None) -> flags.FlagHolder:
  """The `--config` flag (a config file, locked: a typo in code fails too)."""
  return config_flags.DEFINE_config_file(
      "config", default, "Experiment config file, path[:variant].", lock_config=True
  )


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of `path[:variant]`, loaded the way ml_collections' config flag does."""
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} not found")
  module_spec = importlib.util.spec_from_file_location("experiment_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant or None)


def check_overrides(config: ml_collections.ConfigDict, argv) -> None:
  """Raises ValueError for a `--config.a.b=...` flag naming no key, listing the valid keys."""
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config.") :].split("=", 1)[0].split(".")
    node, seen = config, []
    for part in path:
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        where = ".".join(seen) or "the config"
        valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ValueError(
            f"unknown config key {'.'.join(path)!r}: {where} has no {part!r}; "
            f"valid keys there: {', '.join(valid) or '(none: a value)'}"
        )
      node, seen = node[part], seen + [part]


def config_spec(config_flag: flags.FlagHolder) -> str:
  """`path[:variant]` as given to `--config` (or its default)."""
  return config_flags.get_config_filename(flags.FLAGS[config_flag.name])


def default_workdir(spec: str) -> str:
  """runs/<config name>[_<variant>] for `path[:variant]`."""
  path, _, variant = spec.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  variant = variant.replace("=", "-").replace(",", "_")  # model=qwen2.5-3b,hw=h100
  return os.path.join("runs", name + (f"_{variant}" if variant else ""))


def _explain(error: Exception, argv: List[str], spec: str | None) -> str:
  """One line saying why parsing `argv` failed (the config file is loaded again only here)."""
  if spec:
    try:
      check_overrides(load_config_file(spec), argv)
    except (ValueError, FileNotFoundError) as e:  # the key, variant or file at fault
      return str(e)
    except Exception:  # pylint: disable=broad-except
      pass  # the file itself is broken: absl's message below says how
  lines = [line for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
  # A traceback inside the message (an exception in the config file): its last line says why.
  return lines[-1].strip() if any("Traceback" in line for line in lines) else " ".join(lines)


def flags_parser(
    config_flag: flags.FlagHolder, on_error: Callable[[CommandError], NoReturn]
) -> Callable[[List[str]], List[str]]:
  """`app.run`'s flags parser: absl's own, the config loaded with its overrides once, and any
  failure handed to `on_error` (which exits) as one `CommandError`."""

  def parse(argv: List[str]) -> List[str]:
    try:
      rest = flags.FLAGS(argv)
      if config_flag.value is not None:
        config_flag.value.keys()  # a file that failed to load raises here, not at first use
      return rest
    except Exception as e:  # pylint: disable=broad-except
      given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{config_flag.name}=")]
      spec = given[-1] if given else flags.FLAGS[config_flag.name].default
      on_error(CommandError(_explain(e, argv, spec)))

  return parse

"""Public names that moved, and where to: an old import fails at once with the new place named,
instead of "No module named ..." (there is one home per module; the old paths do not alias it).

`install()` (run by `import ragen_jax`) adds a finder at the end of `sys.meta_path`, so it is
asked only about modules no other finder has; a package's `__getattr__` calls `attribute` for
names it no longer has.
"""

import importlib.abc
import sys

_CONFIG = "ragen_jax.config.sections (experiment, env) and ragen_jax.config.variants (variants)"
MODULES = {
    "ragen_jax.config_sections": _CONFIG,
    "ragen_jax.train.experiment": "ragen_jax.config.schema",
    "ragen_jax.train.config_drift": "ragen_jax.config.drift",
    "ragen_jax.train.sft": "ragen_jax.warm_start.sft",
    "ragen_jax.train.demos": "ragen_jax.warm_start.demos",
    "ragen_jax.train.early_stop": "ragen_jax.diagnostics.early_stop",
    "ragen_jax.train.keys": "ragen_jax.keys",
    "ragen_jax.envs.base": "ragen_jax.envs.device.base",
    "ragen_jax.envs.sokoban": "ragen_jax.envs.device.sokoban",
    "ragen_jax.envs.sokoban_generator": "ragen_jax.envs.device.sokoban_generator",
    "ragen_jax.envs.frozenlake": "ragen_jax.envs.device.frozenlake",
    "ragen_jax.envs.bandit": "ragen_jax.envs.device.bandit",
    "ragen_jax.envs.countdown": "ragen_jax.envs.text.countdown",
    "ragen_jax.envs.sudoku": "ragen_jax.envs.text.sudoku",
    "ragen_jax.envs.math_env": "ragen_jax.envs.text.math_env",
    "ragen_jax.envs.math_questions": "ragen_jax.envs.text.math_questions",
    "ragen_jax.envs.host_pool": "ragen_jax.envs.host.pool (records: ragen_jax.envs.host.records)",
    "ragen_jax.envs.host_core": "ragen_jax.envs.host.core",
    "ragen_jax.envs.host_workers": "ragen_jax.envs.host.workers",
    "ragen_jax.envs.host_actor": "ragen_jax.envs.host.actor (records: ragen_jax.envs.host.records)",
    "ragen_jax.envs.serve_http": "ragen_jax.json_http",
    "ragen_jax.envs.http_env": "ragen_jax.envs.serve.client",
    "ragen_jax.envs.gymnasium_adapter": "ragen_jax.envs.bridges.gymnasium",
    "ragen_jax.envs.reasoning_gym_adapter": "ragen_jax.envs.bridges.reasoning_gym",
}
# Attributes a module no longer has: {module: {name: where it is now}}.
ATTRIBUTES = {
    "ragen_jax.envs": {
        name: MODULES[f"ragen_jax.envs.{name}"]
        for name in ("sokoban", "frozenlake", "bandit", "countdown", "sudoku", "math_env")
    },
    "ragen_jax.sampling": {"sampling_options": "ragen_jax.sampling.SamplingOptions"},
    "ragen_jax.train.launch_utils": {
        "load_config_file": "ragen_jax.config.cli.load_config_file",
        "check_argv": "ragen_jax.config.cli.flags_parser",
    },
}


class _Finder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname in MODULES:
      # ImportError, not ModuleNotFoundError: `from a import b` would swallow the latter.
      raise ImportError(f"{fullname} has moved: import {MODULES[fullname]}", name=fullname)
    return None


def install() -> None:
  if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.append(_Finder())


def attribute(module: str, name: str):
  """For a module's `__getattr__`: an AttributeError naming where `name` went, if it moved."""
  where = ATTRIBUTES.get(module, {}).get(name)
  if where is None:
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
  raise AttributeError(f"{module}.{name} has moved: use {where}")

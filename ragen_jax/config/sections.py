"""The ConfigDicts of `configs/*.py`, derived from the dataclasses that declare every knob.

    def get_config(arg=None):                      # a configs/<experiment>.py
      return cs.experiment(arg, envs=dict(sokoban=cs.env("sokoban", train_groups=8)),
                           ppo=dict(actor_lr=1e-4), trainer=dict(total_steps=25))

`experiment` builds every section from its dataclass (`config.schema.SECTIONS`; the defaults
are RAGEN's, shared/reference/ragen.md §3.4), applies `CPU_SCALE` (the tiny model on a 2-core
CPU), then the file's values, then the variant arguments of `configs/x.py:<arg>`
(`config.variants`). Overrides on the command line (`--config.rollout.group_size=4`) and typo errors work on the
result as on any ConfigDict; `config.schema.from_config` turns it back into the dataclasses.
"""

import dataclasses
import typing
from typing import Dict, Optional

import ml_collections
from ml_collections import config_dict

from ragen_jax import envs as envs_lib
from ragen_jax import rollout as rollout_lib
from ragen_jax.config import schema
from ragen_jax.config.variants import apply_variant

# The tiny model's scale on a 2-core CPU, under every config file (RAGEN's value after each).
CPU_SCALE = {
    "rollout": dict(
        group_size=8,  # RAGEN 16
        max_new_tokens=48,  # RAGEN 400: the tiny model's replies are short
        max_context=1024,  # RAGEN 3600
        max_turn_tokens=256,
    ),  # RAGEN 512: a user turn is ~120 tokens here
    # RAGEN 64 (the cost grows as N^2; timings in BENCHMARKS.md)
    "diagnostics": dict(multi_turn_samples=32),
}

# RAGEN's per-environment settings (its custom_envs entries CoordSokoban, CoordFrozenLake,
# Bandit, game_2048, Countdown, MetaMathQA, Sudoku); each environment's options are its
# dataclass's fields (a text environment: its keyword parameters) and defaults.
ENV_DEFAULTS = {
    "sokoban": dict(render_format="grid_coord", max_actions_per_traj=10, max_tokens_hint=120),
    "frozenlake": dict(render_format="grid_coord", max_actions_per_traj=10, max_tokens_hint=100),
    # The same games seen as images (rollout.images): each turn's frame opens its user message;
    # the text keeps the grid, so a policy may read either.
    "visual_sokoban": dict(render_format="grid", max_actions_per_traj=10, max_tokens_hint=120),
    "visual_frozenlake": dict(render_format="grid", max_actions_per_traj=10, max_tokens_hint=100),
    # Validation keeps the training names: a model trained from scratch knows nothing of unseen
    # names (RAGEN validates on BanditTest).
    "bandit": dict(render_format="grid", max_actions_per_traj=1, max_tokens_hint=100),
    # RAGEN's "max words" hint is its 8192-token context; its 700 actions need a context window.
    "2048": dict(render_format="grid", max_actions_per_traj=700, max_tokens_hint=8192),
    # Text environments (render_format is unused): one expression; three answers; a 4x4 board's
    # placements with room for mistakes.
    "countdown": dict(max_actions_per_traj=1, max_tokens_hint=100),
    "math": dict(max_actions_per_traj=3, max_tokens_hint=100),
    "sudoku": dict(max_actions_per_traj=20, max_tokens_hint=100),
    # Code runs tests in the sandbox: worker processes, and a turn's limit above the env's own
    # (CodeEnv's step_budget_s 30 s + test_timeout_s 2 s + a second).
    "code": dict(max_actions_per_traj=1, max_tokens_hint=400, pool="process", step_timeout_s=60.0),
    "search": dict(max_actions_per_traj=10, max_tokens_hint=300),  # RAGEN's SearchQA
}


def _config_value(field: dataclasses.Field):
  default = field.default
  if default is dataclasses.MISSING:  # a required field: a typed placeholder to fill
    default = None if field.default_factory is dataclasses.MISSING else field.default_factory()
  if "section" in field.metadata:  # a field with its own config form (sharding's rules)
    default = field.metadata["section"](default)
  if isinstance(default, dict):
    return ml_collections.ConfigDict(default)
  if default is None:  # a placeholder keeps the type: overrides are checked
    kinds = [t for t in typing.get_args(field.type) if t is not type(None)] or [field.type]
    return config_dict.placeholder(kinds[0])
  return default


def _update(node: ml_collections.ConfigDict, values: dict, where: str) -> None:
  """Sets `values` into `node`, dicts into nested sections; an unknown key is an error."""
  for key, value in values.items():
    if key not in node:
      raise ValueError(
          f"unknown config key {where}.{key}; valid keys there: "
          f"{', '.join(sorted(node.keys()))}"
      )
    if isinstance(value, dict) and isinstance(node[key], ml_collections.ConfigDict):
      _update(node[key], value, f"{where}.{key}")
    else:
      node[key] = value


def section(cls, exclude=(), where: str = "", **values) -> ml_collections.ConfigDict:
  """A ConfigDict of `cls`'s init fields (less `exclude`) at their defaults, then `values`."""
  out = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    if field.init and field.name not in exclude:
      out[field.name] = _config_value(field)
  _update(out, values, where or cls.__name__)
  return out


def env(name: str = "", entry: str = "", **values) -> ml_collections.ConfigDict:
  """One `envs.<tag>` section: `config.schema.EnvSpec`'s keys, the rollout's per-tag ones
  (`ENV_DEFAULTS`), `options`: a registered environment's keyword options at their defaults
  (`options=dict(...)` overrides), or for an `entry` just the options given, and `val_options`:
  those of them validation plays with instead (`val_options=dict(...)`)."""
  if bool(name) == bool(entry):
    raise ValueError(f"an environment section names a registered name or an entry: {name!r}")
  factory = envs_lib.registry.resolve(name, entry)
  out = section(
      schema.EnvSpec,
      exclude=("options", "val_options", "per_tag", "tag"),
      where=f"envs({name or entry})",
      name=name,
      entry=entry,
  )
  if entry:
    out.options = ml_collections.ConfigDict(values.pop("options", {}))
  elif envs_lib.is_jax(factory):
    out.options = section(factory, where=f"envs({name}).options")
  else:
    out.options = ml_collections.ConfigDict(envs_lib.registry.option_defaults(factory))
  # Validation's overrides: keys of `options` only (a typo is caught here, not at the first
  # validation). Keys a config file sets can then be overridden on the command line too.
  val_options = values.pop("val_options", {})
  unknown = sorted(set(val_options) - set(out.options)) if not entry else []
  if unknown:
    raise ValueError(
        f"unknown config key envs({name}).val_options.{unknown[0]}; valid keys there: "
        f"{', '.join(sorted(out.options.keys()))}"
    )
  out.val_options = ml_collections.ConfigDict(val_options)
  for field in dataclasses.fields(rollout_lib.RolloutConfig):
    if field.name in rollout_lib.RolloutConfig.PER_TAG:
      out[field.name] = _config_value(field)
  _update(out, {**ENV_DEFAULTS.get(name, {}), **values}, f"envs({name or entry})")
  return out


def experiment(
    arg: Optional[str] = None,
    *,
    envs: Dict[str, ml_collections.ConfigDict],
    cpu_scale: bool = True,
    **sections: dict,
) -> ml_collections.ConfigDict:
  """The whole config: every section's defaults, `CPU_SCALE`, `sections`, the variant `arg`."""
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict(envs)
  for name, (cls, exclude) in schema.SECTIONS.items():
    config[name] = section(cls, exclude, where=name)
  for name, values in (CPU_SCALE if cpu_scale else {}).items():
    _update(config[name], values, name)
  for name, values in sections.items():
    if name not in schema.SECTIONS:
      raise ValueError(f"unknown config section {name!r}; valid: {sorted(schema.SECTIONS)}")
    _update(config[name], values, name)
  return apply_variant(config, arg)


def defaults_like(config) -> ml_collections.ConfigDict:
  """Every key's current default for a config with `config`'s environment tags (no CPU scale):
  what a stored config of an older run is overlaid on (`drift.stored_config`)."""
  envs = {
      tag: env(section_.get("name", ""), section_.get("entry", ""))
      for tag, section_ in config.get("envs", {}).items()
  }
  return experiment(None, envs=envs, cpu_scale=False)


def overlay(base: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """`base` with `values` (a nested dict) written over it; keys `base` lacks are kept too, so
  `config.schema.from_config` names them."""
  out = ml_collections.ConfigDict(base.to_dict())
  for key, value in values.items():
    if isinstance(value, dict) and isinstance(out.get(key), ml_collections.ConfigDict):
      out[key] = overlay(out[key], value)
    elif isinstance(value, list) and isinstance(out.get(key), tuple):  # JSON has no tuples
      out[key] = tuple(value)
    else:
      with out.unlocked():
        out[key] = value
  return out

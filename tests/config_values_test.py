"""Every numeric knob is range-checked and every named one choice-checked: a NaN / inf sweep over
the float leaves of real config files, the boundaries each range admits and refuses, values outside
a knob's choices, and an environment's own annotated options."""

import copy
import math
import os
import re
import typing

import ml_collections
import pytest

from ragen_jax import config_checks
from ragen_jax.config import sections
from ragen_jax import envs
from ragen_jax.algos import PPOConfig
from ragen_jax.envs import text
from ragen_jax.config import schema
from ragen_jax.config import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A grid environment and the three text environments, at the variant tests run.
SWEPT = ("sokoban_ppo", "text_mix_ppo")


def load(name, variant="smoke"):
  return cli.load_config_file(os.path.join(ROOT, "configs", f"{name}.py:{variant}"))


BASE = {name: load(name) for name in SWEPT}


def float_keys(node, prefix=""):
  """Dotted keys of every leaf of `node` typed float (a None placeholder of float included)."""
  for name in node.keys():
    value = node[name]
    if isinstance(value, ml_collections.ConfigDict):
      yield from float_keys(value, f"{prefix}{name}.")
    elif node.get_type(name) is float:
      yield prefix + name


def with_value(name, key, value):
  """Config `name` (smoke) with `key` set to `value` (a key that does not exist yet is added)."""
  config = copy.deepcopy(BASE[name]) if name in BASE else load(name)
  *path, leaf = key.split(".")
  node = config
  for part in path:
    node = node[part]
  with node.unlocked():
    node[leaf] = value
  return config


SWEEP = [(name, key) for name in SWEPT for key in float_keys(BASE[name])]


@pytest.mark.parametrize("name, key", SWEEP, ids=[f"{n}:{k}" for n, k in SWEEP])
def test_a_float_knob_that_is_not_finite_is_named(name, key):
  for bad in (math.nan, math.inf, -math.inf):
    pattern = rf"^config: {re.escape(key)} must be a finite number.*, got {re.escape(repr(bad))}$"
    with pytest.raises(ValueError, match=pattern):
      schema.from_config(with_value(name, key, bad))


def test_the_sweep_reaches_every_float_field_and_the_knobs_that_slipped_through():
  swept = {key for _, key in SWEEP}
  assert swept >= {
      "rollout.val_temperature",
      "rollout.temperature",
      "rollout.format_penalty",
      "ppo.actor_lr",
      "ppo.clip_high",
      "ppo.loss_scale_factor",
      "sft.lr",
      "envs.sokoban.options.step_reward",
      "envs.countdown.options.score",
      "envs.math.step_timeout_s",
  }
  # Independently of the config: each section's float fields, read off the dataclasses.
  for section, (cls, exclude) in schema.SECTIONS.items():
    for name, annotation in typing.get_type_hints(cls).items():
      if name in schema.section_keys(cls, exclude) and float in (
          annotation,
          *typing.get_args(annotation),
      ):
        assert f"{section}.{name}" in swept


def test_the_error_names_key_range_and_value():
  with pytest.raises(ValueError) as e:
    schema.from_config(with_value("sokoban_ppo", "ppo.actor_lr", math.inf))
  assert str(e.value) == "config: ppo.actor_lr must be a finite number > 0, got inf"
  with pytest.raises(ValueError, match=r"^ppo\.clip_high must be a finite number > 0, got nan$"):
    PPOConfig(clip_high=math.nan)


def test_validation_options_are_checked_under_their_own_key():
  config = with_value("sokoban_ppo", "envs.sokoban.val_options.solved_reward", math.nan)
  with pytest.raises(ValueError, match=r"^config: envs\.sokoban\.val_options\.solved_reward must"):
    schema.from_config(config)


GOOD = [
    ("sokoban_ppo", "ppo.gamma", 0.0),
    ("sokoban_ppo", "ppo.lam", 1.0),
    ("sokoban_ppo", "ppo.clip_low", 1e-6),
    ("sokoban_ppo", "ppo.clip_low", 0.999),
    ("sokoban_ppo", "ppo.clip_c", 1.001),
    ("sokoban_ppo", "ppo.entropy_coeff", 0.0),
    ("sokoban_ppo", "ppo.vf_coef", 0.0),
    ("sokoban_ppo", "ppo.filter_eps", 0.0),
    ("sokoban_ppo", "ppo.loss_scale_factor", 1e-3),
    ("sokoban_ppo", "ppo.actor_lr", 1),  # an int, as a command line may give it
    ("sokoban_ppo", "rollout.top_p", 1.0),
    ("sokoban_ppo", "rollout.top_k", 0),
    ("sokoban_ppo", "rollout.format_penalty", -1e9),
    ("sokoban_ppo", "rollout.unchanged_penalty", 2.5),
    ("sokoban_ppo", "rollout.val_temperature", 1e-4),
    ("sokoban_ppo", "sft.random_prob", 1.0),
    ("sokoban_ppo", "early_stop.low_val_threshold", 0.0),
    ("sokoban_ppo", "diagnostics.compute_freq", 0),
    ("sokoban_ppo", "trainer.total_steps", 0),
    ("sokoban_ppo", "envs.sokoban.max_env_errors", 1.0),
    ("sokoban_ppo", "envs.sokoban.step_timeout_s", 1e-3),
    ("sokoban_ppo", "envs.sokoban.options.step_reward", 0),
    ("sokoban_ppo", "envs.sokoban.options.solved_reward", -1e6),
    ("text_mix_ppo", "envs.countdown.options.format_score", -0.5),
    ("frozenlake_ppo", "envs.frozenlake.options.p", 1.0),
    ("frozenlake_ppo", "envs.frozenlake.options.success_rate", 0.0),
    ("bandit_ppo", "envs.bandit.options.hi_arm_hiscore_prob", 1.0),
]


@pytest.mark.parametrize("name, key, value", GOOD)
def test_values_on_the_boundary_are_accepted(name, key, value):
  exp = schema.from_config(with_value(name, key, value))
  section, _, leaf = key.partition(".")
  if section == "envs":
    tag, _, leaf = leaf.partition(".")
    spec = next(s for s in exp.envs if s.tag == tag)
    kind, _, option = leaf.partition(".")
    assert (dict(spec.options)[option] if kind == "options" else getattr(spec, leaf)) == value
  else:
    assert getattr(getattr(exp, section), leaf) == value


BAD = [
    ("ppo.gamma", 1.0000001, "must be a finite number in [0, 1]"),
    ("ppo.clip_low", 0.0, "must be a finite number in (0, 1)"),
    ("ppo.clip_low", 1.0, "must be a finite number in (0, 1)"),
    ("ppo.clip_c", 1.0, "must be a finite number > 1"),
    ("ppo.actor_lr", 0.0, "must be a finite number > 0"),
    ("ppo.entropy_coeff", -1e-9, "must be a finite number >= 0"),
    ("ppo.loss_scale_factor", 0.0, "must be a finite number > 0"),
    ("rollout.temperature", 0.0, "must be a finite number > 0"),
    ("rollout.val_temperature", 0.0, "must be a finite number > 0"),
    ("rollout.top_p", 0.0, "must be a finite number in (0, 1]"),
    ("rollout.group_size", True, "must be an integer >= 1"),
    ("sft.undo_prob", 1.5, "must be a finite number in [0, 1]"),
    ("early_stop.low_val_threshold", 1.5, "must be a finite number in [0, 1]"),
    ("trainer.eval_every", 0, "must be an integer >= 1"),
    ("seed.init", -1, "must be an integer >= 0"),
    ("envs.sokoban.step_timeout_s", 0.0, "must be a finite number > 0"),
    ("envs.sokoban.max_env_errors", 1.01, "must be a finite number in [0, 1]"),
    ("envs.sokoban.options.max_steps", 0, "must be an integer >= 1"),
]


@pytest.mark.parametrize("key, value, message", BAD)
def test_values_past_the_boundary_are_named(key, value, message):
  pattern = rf"^config: {re.escape(key)} {re.escape(message)}, got {re.escape(repr(value))}$"
  with pytest.raises(ValueError, match=pattern):
    schema.from_config(with_value("sokoban_ppo", key, value))


CHOICES = [
    ("ppo.gigpo_norm", "std", "('mean', 'mean_std')"),
    ("ppo.critic", "both", "('separate', 'shared')"),
    ("rollout.context_window", "last", "('full', 'last_k', 'single_turn')"),
    ("early_stop.empty_filter", "halt", "('stop', 'warn', 'off')"),
    ("model.attention", "flash", "('auto', 'xla', 'cudnn', 'splash')"),
]


@pytest.mark.parametrize("key, value, choices", CHOICES)
def test_a_value_outside_its_choices_is_named_with_the_choices(key, value, choices):
  pattern = rf"^config: {re.escape(key)} must be one of {re.escape(choices)}, got {value!r}$"
  with pytest.raises(ValueError, match=pattern):
    schema.from_config(with_value("sokoban_ppo", key, value))


class _Annotated(text.TextEnv):
  """A user's text environment whose options declare their range and choices."""

  instruction = "Say anything."
  action_names = None

  def __init__(
      self,
      bonus: typing.Annotated[float, config_checks.Range(0, 1)] = 0.5,
      mode: typing.Annotated[str, config_checks.OneOf(("easy", "hard"))] = "easy",
  ):
    self.bonus, self.mode = bonus, mode

  def reset(self, seed):
    return "ready"

  def step(self, action):
    return "done", self.bonus, True, {"success": True}


def test_a_user_environment_gets_its_declared_ranges_checked_before_the_run(monkeypatch):
  monkeypatch.setitem(envs.registry.REGISTRY, "annotated", _Annotated)
  config = sections.experiment(
      "smoke", envs={"mine": sections.env("annotated", max_actions_per_traj=1)}
  )
  assert schema.from_config(config).envs[0].make().new().bonus == 0.5
  config.envs.mine.options.bonus = 2.0
  with pytest.raises(ValueError, match=r"^config: envs\.mine\.options\.bonus must .* \[0, 1\]"):
    schema.from_config(config)
  with pytest.raises(ValueError, match=r"^annotated\.bonus must be a finite number"):
    envs.make("annotated", bonus=math.nan)  # the API alone, without a config
  config.envs.mine.options.bonus = 0.5
  config.envs.mine.options.mode = "medium"
  message = r"^config: envs\.mine\.options\.mode must be one of \('easy', 'hard'\), got 'medium'$"
  with pytest.raises(ValueError, match=message):
    schema.from_config(config)

"""Environments by name and by entry: registration, import paths, options, config sections."""

import functools

import pytest

from ragen_jax.config import sections as cs
from ragen_jax import envs
from ragen_jax.envs import registry
from ragen_jax.config import schema

from examples import guess_number


@pytest.fixture(name="registered")
def _registered():
  registry.REGISTRY.pop("guess", None)
  envs.register("guess", guess_number.GuessNumber)
  yield "guess"
  registry.REGISTRY.pop("guess", None)


def test_a_registered_text_environment_is_a_host_env_with_its_options(registered):
  env = envs.make(registered, high=20)
  assert isinstance(env, envs.HostEnv) and env.options == (("high", 20),)
  instance = env.new()
  assert isinstance(instance, guess_number.GuessNumber) and instance.high == 20
  assert instance.reset(3) == instance.reset(3) == "The number is between 1 and 20."
  assert registry.option_defaults(guess_number.GuessNumber) == {"low": 1, "high": 8}


def test_a_registered_environment_gets_a_config_section(registered):
  section = cs.env(registered, train_groups=3)
  assert section.options.to_dict() == {"low": 1, "high": 8} and section.entry == ""
  config = cs.experiment("smoke", envs=dict(guess=section))
  config.envs.guess.options.high = 30
  spec = schema.from_config(config).envs[0]
  assert spec.make().options == (("high", 30), ("low", 1))


def test_registration_errors():
  with pytest.raises(ValueError, match="already registered"):
    envs.register("sokoban", guess_number.GuessNumber)
  for bad in ("", "a:b", "http://x"):
    with pytest.raises(ValueError, match="plain non-empty string"):
      envs.register(bad, guess_number.GuessNumber)
  with pytest.raises(ValueError, match="not callable"):
    envs.register("x", 3)
  with pytest.raises(ValueError, match=r"Unknown environment 'nope'; valid names: \["):
    envs.make("nope")
  with pytest.raises(ValueError, match="an entry: 'x'"):
    cs.env("x", entry="examples.guess_number:GuessNumber")


def test_entries_name_classes_functions_and_urls():
  env = envs.make("", entry="examples.guess_number:GuessNumber", low=2)
  assert env.factory is guess_number.GuessNumber and env.name == "examples.guess_number:GuessNumber"
  url = envs.make("", entry="http://127.0.0.1:1", step_timeout_s=2.0)
  assert isinstance(url.factory, functools.partial) and url.factory.args == ("http://127.0.0.1:1",)
  assert url.step_timeout_s == 2.0
  with pytest.raises(ValueError, match="does not take options"):
    envs.make("", entry="examples.guess_number:GuessNumber", middle=3)
  with pytest.raises(ValueError, match="pool 'fork'"):
    envs.make("", entry="examples.guess_number:GuessNumber", pool="fork")


def test_jax_environments_still_build_as_before():
  env = envs.make("sokoban", dim_room=(6, 6))
  assert isinstance(env, envs.Env) and not isinstance(env, envs.HostEnv)
  assert registry.option_defaults(type(env))["dim_room"] == (6, 6)
  with pytest.raises(ValueError, match="Unknown option 'dim'"):
    envs.make("sokoban", dim=(6, 6))


def test_a_text_environment_plays_by_hand():
  env = envs.make("countdown", num_numbers=3)
  with pytest.raises(RuntimeError, match="reset"):
    env.step("1 + 2")
  reference = envs.registry.REGISTRY["countdown"](num_numbers=3)
  assert env.reset(7) == reference.reset(7)
  answers, _ = env.instance.expert()
  assert env.step(answers[0]) == reference.step(answers[0])
  assert env == envs.make("countdown", num_numbers=3)  # playing changes no part of the spec
  assert hash(env) == hash(envs.make("countdown", num_numbers=3))


def test_reset_by_hand_closes_the_previous_instance():
  closed = []

  class Closing(envs.TextEnv):

    def reset(self, seed):
      return f"start {seed}"

    def step(self, action):
      return action, 0.0, True, {}

    def close(self):
      closed.append(self)

  env = envs.registry.HostEnv("closing", Closing)
  assert env.reset(1) == "start 1"
  first = env.instance
  assert env.reset(2) == "start 2" and closed == [first] and env.instance is not first
  env.close()
  assert len(closed) == 2

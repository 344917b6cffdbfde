"""Public names that moved fail with their new place named, and the new place holds them."""

import importlib

import pytest

from ragen_jax import moved


@pytest.mark.parametrize("old", sorted(moved.MODULES))
def test_an_old_module_path_names_its_new_place(old):
  new = moved.MODULES[old].split()[0]
  with pytest.raises(ImportError, match=f"{old} has moved: import {new}"):
    importlib.import_module(old)
  package, _, name = old.rpartition(".")
  if hasattr(importlib.import_module(package), name):  # envs.base: still the package's name
    assert getattr(importlib.import_module(package), name) is importlib.import_module(new)
  else:
    with pytest.raises(ImportError, match=f"has moved: import {new}"):
      exec(f"from {package} import {name}", {})  # pylint: disable=exec-used
  assert importlib.import_module(new).__name__ == new


@pytest.mark.parametrize(
    "module, name", [(m, n) for m, names in moved.ATTRIBUTES.items() for n in names]
)
def test_an_old_attribute_names_its_new_place(module, name):
  where = moved.ATTRIBUTES[module][name]
  with pytest.raises(AttributeError, match=f"{module}.{name} has moved: use {where.split()[0]}"):
    getattr(importlib.import_module(module), name)
  new_module, _, new_name = where.split()[0].rpartition(".")
  try:  # a module path, or a module's attribute
    importlib.import_module(where.split()[0])
  except ImportError:
    assert hasattr(importlib.import_module(new_module), new_name)


def test_a_name_that_never_existed_is_a_plain_error():
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("ragen_jax.no_such_module")
  with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
    getattr(importlib.import_module("ragen_jax.envs"), "no_such_name")


def test_the_public_faces_users_import_are_where_they_were():
  from ragen_jax import envs, models, sampling  # pylint: disable=import-outside-toplevel
  from ragen_jax.envs.text import TextEnv  # pylint: disable=import-outside-toplevel

  assert envs.TextEnv is TextEnv and callable(envs.make) and callable(envs.register)
  assert callable(envs.from_gymnasium) and envs.Sokoban and envs.FrozenLake and envs.Bandit
  assert models.Qwen2 and models.init_cache and sampling.SamplingOptions

"""Environments by name or import path: pure-JAX ones, registered text environments, HTTP.

    envs.register("guess", my_pkg.GuessNumber)          # a TextEnv class or factory function
    envs.make("guess", low=1, high=100)                  # -> HostEnv (one instance per episode)
    env = envs.make("countdown"); env.reset(7); env.step("11 + 13 - 5")   # played by hand
    envs.make("", entry="my_pkg.my_env:MyEnv")           # an import path, no registration
    envs.make("", entry="http://127.0.0.1:8000")         # served by `python -m ragen_jax.envs.serve`
    envs.make("sokoban", dim_room=(6, 6))                # -> the pure-JAX Sokoban (jitted, vmapped)
    envs.make("visual_sokoban").render_image(state)      # -> the same Sokoban, drawn: uint8 84x84x3

A name that is not registered, an import that fails, or options the factory does not take
raise a ValueError naming what failed, before anything compiles.
"""

import dataclasses
import functools
import importlib
import inspect
from typing import Any, Callable, Dict, Optional, Tuple

from ragen_jax.config_checks import check_arguments, check_fields, PositiveFloat
from ragen_jax.envs.device import base
from ragen_jax.envs.device.bandit import Bandit
from ragen_jax.envs.device.frozenlake import FrozenLake
from ragen_jax.envs.device.game2048 import Game2048
from ragen_jax.envs.device.sokoban import Sokoban
from ragen_jax.envs.device.visual import VisualFrozenLake
from ragen_jax.envs.device.visual import VisualSokoban
from ragen_jax.envs.host.records import MODES as POOL_MODES
from ragen_jax.envs.text.code_env import CodeEnv
from ragen_jax.envs.text.countdown import Countdown
from ragen_jax.envs.text.math_env import MathEnv
from ragen_jax.envs.text.search_qa import SearchQA
from ragen_jax.envs.text.sudoku import Sudoku

# name -> a pure-JAX `base.Env` dataclass, or a factory of text environments (envs.text).
REGISTRY: Dict[str, Callable[..., Any]] = {
    "sokoban": Sokoban,
    "frozenlake": FrozenLake,
    "bandit": Bandit,
    "2048": Game2048,
    # The grid worlds seen as images too (`render_image`), for vision-language policies.
    "visual_sokoban": VisualSokoban,
    "visual_frozenlake": VisualFrozenLake,
    # RAGEN's environments on free text, stepped on the host.
    "countdown": Countdown,
    "math": MathEnv,
    "sudoku": Sudoku,
    "code": CodeEnv,  # writing code against tests, run in ragen_jax.envs.text.sandbox
    "search": SearchQA,
}


@dataclasses.dataclass(frozen=True)
class HostEnv:
  """A text environment of one tag, stepped on the host: `new()` builds one episode's instance.

  `pool`, `workers` and `step_timeout_s` say how the rollout steps the instances
  (ragen_jax.envs.host.pool). To play by hand, `reset(seed)` builds a fresh instance (closing
  the previous one) and returns its first observation; `step(action)` steps it and returns
  (observation, reward, done, info); `instance` is the one being played (its `instruction`,
  `expert()`); `close()` closes it. The rollout never uses that instance: it builds its own.
  """

  name: str
  factory: Callable[..., Any]
  options: Tuple[Tuple[str, Any], ...] = ()
  pool: str = "thread"
  workers: Optional[int] = None
  step_timeout_s: PositiveFloat = 60.0
  # The instance `reset` / `step` play by hand: a one-element list (this dataclass is frozen).
  _played: list = dataclasses.field(default_factory=list, init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.pool not in POOL_MODES:
      raise ValueError(f"environment pool {self.pool!r} is not one of {POOL_MODES}")
    check_fields(self, self.name)

  def bound(self) -> Callable[[], Any]:
    """The zero-argument factory of one instance (picklable when `factory` is)."""
    return functools.partial(self.factory, **dict(self.options))

  def new(self):
    return self.bound()()

  def memory(self, history) -> str:
    """The environment class's `memory(history) -> str` (a static or class method: RAGEN's hook
    for context windows, rollout.windows), or "" when it defines none."""
    hook = getattr(self.factory, "memory", None)
    return hook(history) if callable(hook) else ""

  def reset(self, seed: int) -> str:
    """A new instance (the previous one closed), reset with `seed`: its first observation."""
    self.close()
    instance = self.new()
    self._played.append(instance)
    return instance.reset(seed)

  def step(self, action: str):
    """Steps the instance `reset` built: (observation, reward, done, info)."""
    return self.instance.step(action)

  @property
  def instance(self):
    if not self._played:
      raise RuntimeError(f"environment {self.name!r}: call reset(seed) before playing it")
    return self._played[0]

  def close(self) -> None:
    """Closes the instance being played by hand, if any."""
    while self._played:
      close = getattr(self._played.pop(), "close", None)
      if callable(close):
        close()


def is_jax(factory) -> bool:
  """Whether `factory` is a pure-JAX environment class (stepped on device, vmapped)."""
  return isinstance(factory, type) and issubclass(factory, base.Env)


def register(name: str, factory: Callable[..., Any], overwrite: bool = False) -> None:
  """Makes `factory` (a TextEnv class, a function returning one, or a `base.Env` dataclass)
  available as `envs.make(name, **options)` and as `envs.<tag>.name` in configs."""
  if not isinstance(name, str) or not name or ":" in name or "/" in name:
    raise ValueError(f"an environment name is a plain non-empty string, got {name!r}")
  if not callable(factory):
    raise ValueError(f"the factory of environment {name!r} is not callable: {factory!r}")
  if name in REGISTRY and REGISTRY[name] is not factory and not overwrite:
    raise ValueError(f"environment {name!r} is already registered; pass overwrite=True")
  REGISTRY[name] = factory


def import_attribute(path: str, what: str, form: str = "'package.module:Name'") -> Any:
  """The object "package.module:attr.sub" names; a ValueError naming `what` otherwise."""
  module_name, sep, attr = path.partition(":")
  if not sep or not module_name or not attr:
    raise ValueError(f"{what} {path!r} must be {form}")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # any import-time error is the path's fault; say which
    raise ValueError(f"{what} {path!r}: importing {module_name!r} failed: {e!r}") from e
  value = module
  for part in attr.split("."):
    if not hasattr(value, part):
      raise ValueError(f"{what} {path!r}: {module_name!r} has no attribute {attr!r}")
    value = getattr(value, part)
  return value


def load_entry(entry: str) -> Callable[..., Any]:
  """The factory an entry names: "package.module:Name" or an http(s) URL of a served env."""
  if entry.startswith(("http://", "https://")):
    from ragen_jax.envs.serve.client import HttpEnv  # pylint: disable=import-outside-toplevel

    return functools.partial(HttpEnv, entry)
  factory = import_attribute(
      entry, "environment entry", "'package.module:Name' or an http(s):// URL"
  )
  if not callable(factory):
    raise ValueError(f"environment entry {entry!r} is not callable")
  return factory


def resolve(name: str, entry: str = "") -> Callable[..., Any]:
  """The factory of `entry` when given, else of the registered `name`."""
  if entry:
    return load_entry(entry)
  if name not in REGISTRY:
    raise ValueError(
        f"Unknown environment {name!r}; valid names: {sorted(REGISTRY)} (or set an entry: "
        "'package.module:Name' or an http:// URL)."
    )
  return REGISTRY[name]


def option_defaults(factory: Callable[..., Any]) -> Dict[str, Any]:
  """The keyword options of `factory` with their defaults: a JAX environment's dataclass
  fields, or a text environment's keyword parameters that have defaults."""
  if is_jax(factory):
    return {
        f.name: f.default
        for f in dataclasses.fields(factory)
        if f.init and f.default is not dataclasses.MISSING
    }
  try:
    params = inspect.signature(factory).parameters.values()
  except (TypeError, ValueError):  # a builtin without a signature: no known options
    return {}
  kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
  return {p.name: p.default for p in params if p.kind in kinds and p.default is not p.empty}


def check_options(factory: Callable[..., Any], options: Dict[str, Any], label: str) -> None:
  """Raises a ValueError when `factory` cannot be called with `options` as keywords, or one
  lies outside the range its annotation declares (`ragen_jax.config_checks`)."""
  if is_jax(factory):
    base.check_options(factory, options)
    return
  try:
    signature = inspect.signature(factory)
  except (TypeError, ValueError):
    return  # nothing to check against; a bad option then fails at the first reset
  try:
    signature.bind(**options)
  except TypeError as e:
    raise ValueError(f"environment {label!r} does not take options {sorted(options)}: {e}") from e
  check_arguments(factory, options, label)  # a text environment is built per episode, later


def make(
    name: str,
    entry: str = "",
    pool: str = "thread",
    workers: Optional[int] = None,
    step_timeout_s: float = 60.0,
    **options: Any,
):
  """A pure-JAX environment instance, or a `HostEnv` for a text environment (see module doc)."""
  factory = resolve(name, entry)
  label = entry or name
  check_options(factory, options, label)
  if is_jax(factory):
    return factory(**options)
  return HostEnv(label, factory, tuple(sorted(options.items())), pool, workers, step_timeout_s)

"""The range of every numeric knob and the choices of every named one, declared in the knob's
annotation and checked by one function.

    actor_lr: PositiveFloat = 1e-6                        # a dataclass field (config section)
    gamma: Annotated[float, Range(0, 1)] = 1.0            # a range of its own
    kl_type: Annotated[str, OneOf(KL_KINDS)] = "k1"       # one of a few names
    def __init__(self, score: FiniteFloat = 1.0): ...     # a keyword option of an environment

    check_fields(self, "ppo")                             # in a dataclass's __post_init__
    check_arguments(Countdown, {"score": nan}, "envs.countdown.options")   # before building

`check_arguments` reads what a dataclass or any callable (an environment class, a factory function)
declares through `Annotated[float | int, Range(...)]` or `Annotated[str, OneOf(...)]` on its
fields or keyword parameters, so a user's own environment gets the same checks at config time by
annotating its options.

A number passes only when it is good: a real number (never a bool) of the annotated kind (float:
any int or float; int: an integer), finite, and inside the range; a choice only when it is one
of the choices. Written as "accept if inside",
NaN (every comparison false) and +-inf fail with the rest. The error is one line naming the key:
`ppo.actor_lr must be a finite number > 0, got inf`, or
`early_stop.empty_filter must be one of ('stop', 'warn', 'off'), got 'halt'`.
"""

import dataclasses
import functools
import inspect
import math
import numbers
import typing
from typing import Annotated, Any, Mapping, Tuple


@dataclasses.dataclass(frozen=True)
class Range:
  """[low, high], either end open; an infinite end is no bound (values stay finite)."""

  low: float = -math.inf
  high: float = math.inf
  open_low: bool = False
  open_high: bool = False

  def holds(self, value) -> bool:
    try:
      finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
      finite = False
    above = self.low < value if self.open_low else self.low <= value
    below = value < self.high if self.open_high else value <= self.high
    return finite and above and below

  def __str__(self) -> str:
    """What the error message says: "> 0", "in (0, 1]", or "" (any finite value)."""
    if math.isfinite(self.low) and math.isfinite(self.high):
      left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
      return f"in {left}{self.low:g}, {self.high:g}{right}"
    if math.isfinite(self.low):
      return f"{'>' if self.open_low else '>='} {self.low:g}"
    if math.isfinite(self.high):
      return f"{'<' if self.open_high else '<='} {self.high:g}"
    return ""

  def check(self, key: str, value: Any, kind: type) -> None:
    """Raises ValueError unless `value` is a real number of `kind` (never a bool) in the range."""
    number = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, number) and not isinstance(value, bool) and self.holds(value):
      return
    what = "an integer" if kind is int else "a finite number"
    raise ValueError(f"{key} must be {what}{' ' if str(self) else ''}{self}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class OneOf:
  """A choice among a few values (names of modes, formats, splits); the error lists them."""

  choices: Tuple[Any, ...]

  def check(self, key: str, value: Any, kind: type) -> None:
    """Raises ValueError unless `value` is one of the choices."""
    del kind  # the choices are the whole declaration
    if value not in self.choices:
      raise ValueError(f"{key} must be one of {self.choices}, got {value!r}")


Rule = Range | OneOf  # what an annotation declares; `check(key, value, kind)` enforces it


FiniteFloat = Annotated[float, Range()]  # rewards, penalties
PositiveFloat = Annotated[float, Range(0, open_low=True)]  # learning rates, temperatures, clips
NonNegativeFloat = Annotated[float, Range(0)]  # coefficients, weight decay
UnitFloat = Annotated[float, Range(0, 1)]  # probabilities, shares, discounts
PositiveInt = Annotated[int, Range(1)]  # sizes, step counts, patience
NonNegativeInt = Annotated[int, Range(0)]  # counts that may be 0, seeds


def _declaration(annotation) -> Tuple[type, Rule] | None:
  if typing.get_origin(annotation) is not Annotated:
    return None
  kind, *extras = typing.get_args(annotation)
  rules = [e for e in extras if isinstance(e, Rule)]
  return (kind, rules[0]) if rules else None


def _read(owner) -> Tuple[Tuple[str, type, Rule], ...]:
  try:
    try:  # a module under `from __future__ import annotations` holds them as strings
      params = inspect.signature(owner, eval_str=True).parameters.values()
    except NameError:
      params = inspect.signature(owner).parameters.values()
  except (TypeError, ValueError):  # a builtin without a signature declares nothing
    return ()
  found = ((p.name, _declaration(p.annotation)) for p in params)
  return tuple((name, *spec) for name, spec in found if spec)


_read_once = functools.lru_cache(maxsize=256)(_read)  # reading a signature takes ~0.1 ms


def _declared(owner) -> Tuple[Tuple[str, type, Rule], ...]:
  """(name, kind, rule) of every parameter of `owner` (a dataclass: its init fields) whose
  annotation carries a `Range` or a `OneOf`."""
  try:
    return _read_once(owner)
  except TypeError:  # an unhashable callable object: read it every time
    return _read(owner)


def check_arguments(owner, values: Mapping[str, Any], where: str) -> None:
  """Raises ValueError for the first of `values` outside the range or choices `owner` declares
  for it; the key in the message is `where.name`."""
  for name, kind, rule in _declared(owner):
    if name in values:
      rule.check(f"{where}.{name}" if where else name, values[name], kind)


def check_value(key: str, value: Any, annotation) -> None:
  """Raises ValueError unless `value` is good for `annotation` (e.g. `PositiveFloat`): for a
  knob that cannot carry its range or choices in its type."""
  kind, rule = _declaration(annotation)
  rule.check(key, value, kind)


def check_fields(obj, where: str) -> None:
  """`check_arguments` of a dataclass instance's own fields (call it from `__post_init__`)."""
  check_arguments(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)

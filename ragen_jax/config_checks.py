"""The range of every numeric knob, declared in the knob's annotation and checked by one function.

    actor_lr: PositiveFloat = 1e-6                        # a dataclass field (config section)
    gamma: Annotated[float, Range(0, 1)] = 1.0            # a range of its own
    def __init__(self, score: FiniteFloat = 1.0): ...     # a keyword option of an environment

    check_fields(self, "ppo")                             # in a dataclass's __post_init__
    check_arguments(Countdown, {"score": nan}, "envs.countdown.options")   # before building

`check_arguments` reads what a dataclass or any callable (an environment class, a factory function)
declares through `Annotated[float | int, Range(...)]` on its fields or keyword parameters, so a
user's own environment gets the same checks at config time by annotating its options.

A value passes only when it is good: a real number (never a bool) of the annotated kind (float:
any int or float; int: an integer), finite, and inside the range. Written as "accept if inside",
NaN (every comparison false) and +-inf fail with the rest. The error is one line naming the key:
`ppo.actor_lr must be a finite number > 0, got inf`.
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


FiniteFloat = Annotated[float, Range()]  # rewards, penalties
PositiveFloat = Annotated[float, Range(0, open_low=True)]  # learning rates, temperatures, clips
NonNegativeFloat = Annotated[float, Range(0)]  # coefficients, weight decay
UnitFloat = Annotated[float, Range(0, 1)]  # probabilities, shares, discounts
PositiveInt = Annotated[int, Range(1)]  # sizes, step counts, patience
NonNegativeInt = Annotated[int, Range(0)]  # counts that may be 0, seeds


def _check(key: str, value: Any, kind: type, bounds: Range) -> None:
  number = numbers.Integral if kind is int else numbers.Real
  if isinstance(value, number) and not isinstance(value, bool) and bounds.holds(value):
    return
  what = "an integer" if kind is int else "a finite number"
  raise ValueError(f"{key} must be {what}{' ' if str(bounds) else ''}{bounds}, got {value!r}")


def _declaration(annotation) -> Tuple[type, Range] | None:
  if typing.get_origin(annotation) is not Annotated:
    return None
  kind, *extras = typing.get_args(annotation)
  ranges = [e for e in extras if isinstance(e, Range)]
  return (kind, ranges[0]) if ranges else None


def _read(owner) -> Tuple[Tuple[str, type, Range], ...]:
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


def _declared(owner) -> Tuple[Tuple[str, type, Range], ...]:
  """(name, kind, range) of every parameter of `owner` (a dataclass: its init fields) whose
  annotation carries a `Range`."""
  try:
    return _read_once(owner)
  except TypeError:  # an unhashable callable object: read it every time
    return _read(owner)


def check_arguments(owner, values: Mapping[str, Any], where: str) -> None:
  """Raises ValueError for the first of `values` outside the range `owner` declares for it;
  the key in the message is `where.name`."""
  for name, kind, bounds in _declared(owner):
    if name in values:
      _check(f"{where}.{name}" if where else name, values[name], kind, bounds)


def check_value(key: str, value: Any, annotation) -> None:
  """Raises ValueError unless `value` is good for `annotation` (e.g. `PositiveFloat`): for a
  knob that cannot carry its range in its type."""
  _check(key, value, *_declaration(annotation))


def check_fields(obj, where: str) -> None:
  """`check_arguments` of a dataclass instance's own fields (call it from `__post_init__`)."""
  check_arguments(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)

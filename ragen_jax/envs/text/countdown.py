"""Countdown (TinyZero's numbers game, RAGEN's `_4_countdown`) as a host text environment.

    env = Countdown(num_numbers=3, max_target=100)
    env.reset(seed=7)          # "Target: 19, nums: [11, 5, 13]"
    env.step("11 + 13 - 5")    # ("Correct.", 1.0, True, {"success": True, ...})
    env.expert()               # (["11 + 13 - 5"], "Target 19 from 11, 5, 13: 11 + 13 - 5 = 19.")

Rules. The observation gives a target and a list of numbers ("Target: T, nums: [a, b, c]",
RAGEN's form). The answer is one arithmetic expression that uses each listed number exactly once
(as a multiset: a number listed twice is used twice, and no other number may appear), with
`+ - * /`, unary minus and parentheses. Division is exact (`fractions.Fraction`), so intermediate
results need not be integers: `8 / 3 * 3` is 8. One answer ends the episode.

Reward (RAGEN's): 1.0 when the numbers are right and the value equals the target; 0.1 when the
numbers are right but the value misses (the format score); 0.0 otherwise: wrong numbers, or text
that is no valid expression (syntax error, division by zero, a limit below). RAGEN checks the
numbers with a digit regex and the value with Python's `eval`, so there any text whose digit runs
match the numbers scores 0.1 even when `eval` fails; here an expression must parse to score.
`info`: `success` (reward 1), `action_is_valid` (the text parsed), `action_is_effective` (always
True: every answer is judged) and `value` (the expression's value as a float, or None).

Levels are drawn from `random.Random(seed)` (no data file): numbers uniform in
[min_number, max_number], then a random expression over all of them with positive integer
intermediate results (`a - b` only when a > b, `a / b` only when b divides a); its value is the
target, redrawn until it lies in [1, max_target]. Every level is therefore solvable, and the
expert (`Countdown.expert`, an exhaustive search, `solve`) always finds a solution.

The parser (`evaluate`) is a small recursive descent over integers, `+ - * / ( )` and unary minus;
it never calls `eval`. Limits, each an invalid expression rather than an exception: empty text,
more than 1000 characters, any other character, a number longer than 6 digits, more than 64
tokens, parentheses nested deeper than 16. A final `= <integer>` (the model restating the
result) is tolerated and ignored: the value judged is always the left-hand side's.

Why host side (Python) rather than JAX: the action is free text, and judging it takes a parser
over a variable-length string with exact rational arithmetic, which is host work; the level
itself (a few integers) gains nothing from a device.
"""

import math
import random
from fractions import Fraction
from typing import Dict, List, Optional, Sequence, Tuple

from ragen_jax.config_checks import check_arguments, FiniteFloat
from ragen_jax.envs import text

MAX_CHARS = 1000  # longer answers are rejected before tokenizing: the work stays bounded
MAX_DIGITS = 6
MAX_TOKENS = 64
MAX_DEPTH = 16  # parentheses nesting; also bounds the parser's recursion
MAX_NUMBERS = 6
FRACTION_SEARCH_MAX = 5  # the expert's fraction-intermediate search is cubic-ish beyond this

INSTRUCTION = (
    "You are solving the Countdown puzzle. Use each number in nums exactly once, with + - * / "
    "and parentheses, to write an expression that equals the target. Answer with only the "
    "expression, like <answer>(3 + 5) * 2</answer>."
)

# Operator precedence for rendering: atoms bind tightest, then * /, then + -.
_ATOM, _MUL, _ADD = 3, 2, 1
_PREC = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL}
_SYMBOLS = "+-*/()="

Expr = Tuple[str, int]  # (text, precedence of its outermost operator)


class _ParseError(Exception):
  pass


# --------------------------------------------------------------------------------------- parser


def _tokenize(source: str) -> List[str]:
  tokens = []
  i, n = 0, len(source)
  while i < n:
    c = source[i]
    if c.isspace():
      i += 1
      continue
    if "0" <= c <= "9":  # ASCII only: str.isdigit() accepts superscripts int() rejects
      j = i
      while j < n and "0" <= source[j] <= "9":
        j += 1
      if j - i > MAX_DIGITS:
        raise _ParseError(f"a number longer than {MAX_DIGITS} digits")
      tokens.append(source[i:j])
      i = j
    elif c in _SYMBOLS:
      tokens.append(c)
      i += 1
    else:
      raise _ParseError(f"unexpected character {c!r}")
    if len(tokens) > MAX_TOKENS:
      raise _ParseError(f"more than {MAX_TOKENS} tokens")
  return tokens


class _Parser:
  """expr := term (('+' | '-') term)*;  term := unary (('*' | '/') unary)*;
  unary := '-'* primary;  primary := NUMBER | '(' expr ')'.  Left-associative."""

  def __init__(self, tokens: List[str]):
    self.tokens = tokens
    self.pos = 0
    self.depth = 0
    self.numbers: List[int] = []

  def peek(self) -> Optional[str]:
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self) -> Optional[str]:
    token = self.peek()
    self.pos += 1
    return token

  def expr(self) -> Fraction:
    value = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      right = self.term()
      value = value + right if op == "+" else value - right
    return value

  def term(self) -> Fraction:
    value = self.unary()
    while self.peek() in ("*", "/"):
      op = self.take()
      right = self.unary()
      if op == "*":
        value = value * right
      elif right == 0:
        raise _ParseError("division by zero")
      else:
        value = value / right
    return value

  def unary(self) -> Fraction:
    negate = False
    while self.peek() == "-":  # a loop, not recursion: the token limit bounds it
      self.take()
      negate = not negate
    value = self.primary()
    return -value if negate else value

  def primary(self) -> Fraction:
    token = self.take()
    if token is None:
      raise _ParseError("the expression ends early")
    if token.isdigit():
      self.numbers.append(int(token))
      return Fraction(int(token))
    if token == "(":
      self.depth += 1
      if self.depth > MAX_DEPTH:
        raise _ParseError(f"parentheses nested deeper than {MAX_DEPTH}")
      value = self.expr()
      if self.take() != ")":
        raise _ParseError("a '(' is not closed")
      self.depth -= 1
      return value
    raise _ParseError(f"expected a number or '(' but found {token!r}")


def evaluate(source: str) -> Tuple[Optional[Fraction], Optional[List[int]], Optional[str]]:
  """Parses and evaluates one arithmetic expression exactly.

  Returns (value, numbers, None) with the numbers in order of appearance, or (None, None, error)
  for anything that is not a valid expression (see the module doc for the grammar and limits).
  Never raises, whatever the input; a trailing `= <integer>` is accepted and ignored.
  """
  if not isinstance(source, str):
    return None, None, "not a string"
  source = source.strip()
  if len(source) > MAX_CHARS:
    return None, None, f"longer than {MAX_CHARS} characters"
  try:
    tokens = _tokenize(source)
    if not tokens:
      raise _ParseError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() == "=":  # "expr = 12": the model restating its result; not judged
      parser.take()
      if parser.peek() == "-":
        parser.take()
      if not (parser.take() or "").isdigit():
        raise _ParseError("expected a number after '='")
    if parser.peek() is not None:
      raise _ParseError(f"unexpected {parser.peek()!r} after the expression")
  except _ParseError as e:
    return None, None, str(e)
  return value, parser.numbers, None


# --------------------------------------------------------------------------------------- search


def _render(op: str, left: Expr, right: Expr) -> Expr:
  """`left op right` with minimal parentheses (exact arithmetic makes + and * associative)."""
  p = _PREC[op]
  left_text = left[0] if left[1] >= p else f"({left[0]})"
  right_bare = right[1] > p or (right[1] == p and op in "+*")
  right_text = right[0] if right_bare else f"({right[0]})"
  return f"{left_text} {op} {right_text}", p


def _combinations(a, ea: Expr, b, eb: Expr, integer_only: bool):
  """(value, expression) of every way to combine a and b. integer_only: positive integer
  results only (values are ints then, which hash and compare equal to Fractions)."""
  yield a + b, _render("+", ea, eb)
  yield a * b, _render("*", ea, eb)
  if integer_only:
    if a > b:
      yield a - b, _render("-", ea, eb)
    elif b > a:
      yield b - a, _render("-", eb, ea)
    if a % b == 0:
      yield a // b, _render("/", ea, eb)
    if b % a == 0 and a != b:  # a == b: the same value as a / b
      yield b // a, _render("/", eb, ea)
    return
  yield a - b, _render("-", ea, eb)
  yield b - a, _render("-", eb, ea)
  if b != 0:
    yield Fraction(a) / b, _render("/", ea, eb)
  if a != 0:
    yield Fraction(b) / a, _render("/", eb, ea)


def _splits(mask: int):
  """Ordered-free splits (part, mask ^ part) of a set bitmask into two non-empty parts."""
  low = mask & -mask  # the part holding the lowest element: each split once
  part = (mask - 1) & mask
  while part:
    if part & low:
      yield part, mask ^ part
    part = (part - 1) & mask


def _search(numbers: Sequence[int], target: int, integer_only: bool) -> Optional[str]:
  n = len(numbers)
  if n == 1:
    return str(numbers[0]) if numbers[0] == target else None
  full = (1 << n) - 1
  start = int if integer_only else Fraction
  # Reachable values of every proper subset (value -> expression), built from smaller subsets.
  values: Dict[int, Dict] = {1 << i: {start(x): (str(x), _ATOM)} for i, x in enumerate(numbers)}
  for mask in range(1, full):
    if mask & (mask - 1) == 0:
      continue
    table: Dict = {}
    for part, rest in _splits(mask):
      for a, ea in values[part].items():
        for b, eb in values[rest].items():
          for v, e in _combinations(a, ea, b, eb, integer_only):
            table.setdefault(v, e)
    values[mask] = table
  # The full set only needs the target: look up the partner each operator would need.
  t = Fraction(target)
  for part, rest in _splits(full):
    there = values[rest]
    for a, ea in values[part].items():
      wanted = [("+", t - a, False), ("-", a - t, False), ("-", t + a, True)]
      if a != 0:
        wanted += [("*", t / a, False), ("/", t * a, True)]
      if t != 0:
        wanted.append(("/", a / t, False))
      for op, b, b_first in wanted:
        if b in there and not (op == "/" and not b_first and b == 0):
          eb = there[b]
          return (_render(op, eb, ea) if b_first else _render(op, ea, eb))[0]
      if a == 0 and t == 0:  # 0 * anything
        return _render("*", ea, next(iter(there.values())))[0]
  return None


def solve(numbers: Sequence[int], target: int) -> Optional[str]:
  """An expression using each number exactly once that equals `target`, or None.

  Exhaustive over all expression trees: first with positive integer intermediates only (fast,
  and complete for the levels `Countdown.reset` draws), then, for up to FRACTION_SEARCH_MAX
  numbers, with any exact rational intermediates (`6 / (1 - 3 / 4)` is 24).
  """
  numbers = [int(x) for x in numbers]
  if not numbers:
    return None
  if all(x > 0 for x in numbers):
    found = _search(numbers, target, integer_only=True)
    if found is not None:
      return found
  if len(numbers) <= FRACTION_SEARCH_MAX:
    return _search(numbers, target, integer_only=False)
  return None


def _random_expression(rng: random.Random, numbers: Sequence[int]) -> Tuple[int, str]:
  """A random expression over all `numbers` with positive integer intermediate results."""
  items = [(int(x), (str(x), _ATOM)) for x in numbers]
  while len(items) > 1:
    i, j = rng.sample(range(len(items)), 2)
    (a, ea), (b, eb) = items[i], items[j]
    choices = list(_combinations(a, ea, b, eb, integer_only=True))  # a + b is always there
    items = [x for k, x in enumerate(items) if k not in (i, j)]
    items.append(rng.choice(choices))
  value, (expression, _) = items[0]
  return value, expression


# ------------------------------------------------------------------------------------ environment


def _show(value: Fraction) -> str:
  shown = str(value)
  return shown if len(shown) <= 32 else f"{_as_float(value):.6g}"


def _as_float(value: Fraction) -> float:
  try:
    return float(value)
  except OverflowError:
    return math.copysign(math.inf, value)


def _check_int(name: str, value, low: int, high: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"{name} must be an int, got {value!r}")
  if not low <= value <= high:
    raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


class Countdown(text.TextEnv):
  """One level: reach the target with each number once; one answer ends the episode.

  The level is `numbers` and `target` (public: set them to pose a level by hand);
  `solution` is the expression the level was drawn from.
  """

  instruction = INSTRUCTION
  action_names = None  # free text: the expression goes to `step` verbatim
  max_actions_per_turn = 1

  def __init__(
      self,
      *,
      num_numbers: int = 3,
      min_number: int = 1,
      max_number: int = 20,
      max_target: int = 100,
      score: FiniteFloat = 1.0,
      format_score: FiniteFloat = 0.1,
  ):
    """num_numbers: numbers per level (2..6); min_number, max_number: their range (1..999999,
    writable within the parser's 6 digits); max_target: targets lie in [1, max_target];
    score, format_score: RAGEN's rewards for a right answer and for right numbers only."""
    limit = 10**MAX_DIGITS - 1
    _check_int("num_numbers", num_numbers, 2, MAX_NUMBERS)
    _check_int("min_number", min_number, 1, limit)
    _check_int("max_number", max_number, min_number, limit)
    # With n equal numbers x, (x + ... + x) / x = n - 1 (n - 1 terms): a level always exists.
    _check_int("max_target", max_target, num_numbers - 1, limit)
    check_arguments(Countdown, {"score": score, "format_score": format_score}, "")
    self.num_numbers, self.min_number, self.max_number = num_numbers, min_number, max_number
    self.max_target = max_target
    self.score, self.format_score = float(score), float(format_score)
    self.numbers: List[int] = []
    self.target: Optional[int] = None
    self.solution: Optional[str] = None
    self._expert_cache: Dict[Tuple[Tuple[int, ...], int], Optional[str]] = {}

  def reset(self, seed: int) -> str:
    rng = random.Random(seed)  # same seed, same level (an env group shares it)
    for _ in range(1000):
      numbers = [rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)]
      for _ in range(10):
        value, expression = _random_expression(rng, numbers)
        if 1 <= value <= self.max_target:
          self.numbers, self.target, self.solution = numbers, value, expression
          return self.observation()
    # Only ranges where almost no draw lands in [1, max_target] get here (e.g. huge numbers and
    # max_target = num_numbers - 1): equal numbers x give (x + ... + x) / x = num_numbers - 1.
    x = rng.randint(self.min_number, self.max_number)
    total: Expr = (str(x), _ATOM)
    for _ in range(self.num_numbers - 2):
      total = _render("+", total, (str(x), _ATOM))
    self.numbers, self.target = [x] * self.num_numbers, self.num_numbers - 1
    self.solution = _render("/", total, (str(x), _ATOM))[0]
    return self.observation()

  def observation(self) -> str:
    """The level in RAGEN's form, e.g. "Target: 16, nums: [3, 5, 2]"."""
    return f"Target: {self.target}, nums: {list(self.numbers)}"

  def step(self, action: str) -> text.StepOutput:
    if self.target is None:
      raise RuntimeError("Countdown.step before reset")
    value, used, error = evaluate(action)
    info = {"success": False, "action_is_valid": error is None, "action_is_effective": True}
    info["value"] = None if value is None else _as_float(value)
    if error is not None:
      return f"Invalid expression: {error}.", 0.0, True, info
    if sorted(used) != sorted(self.numbers):
      return f"Wrong numbers: use each of {list(self.numbers)} exactly once.", 0.0, True, info
    if value == self.target:
      info["success"] = True
      return "Correct.", self.score, True, info
    wrong = f"Wrong: the expression equals {_show(value)}, not {self.target}."
    return wrong, self.format_score, True, info

  def expert(self) -> Tuple[Optional[List[str]], str]:
    """([an expression `step` scores 1.0], a short reasoning text), or (None, text) when no
    expression reaches the target; the search (`solve`) is cached per level."""
    if self.target is None:
      raise RuntimeError("Countdown.expert before reset")
    key = (tuple(self.numbers), self.target)
    if key not in self._expert_cache:
      self._expert_cache[key] = solve(self.numbers, self.target)
    found = self._expert_cache[key]
    head = f"Target {self.target} from {', '.join(map(str, self.numbers))}"
    if found is None:
      return None, f"{head}: no expression reaches it."
    return [found], f"{head}: {found} = {self.target}."

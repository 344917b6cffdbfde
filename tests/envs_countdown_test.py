"""Countdown: rewards worked by hand, the parser against a tree evaluator, hostile text, levels
that are deterministic, in range and solvable, and an expert that always scores."""

import itertools
import re
from fractions import Fraction

import hypothesis
import pytest
from hypothesis import strategies as st

from ragen_jax.envs.text import countdown
from ragen_jax.envs import text

OBS = re.compile(r"^Target: (\d+), nums: \[(\d+(?:, \d+)*)\]$")


def level(numbers, target):
  """A fresh environment posed a level by hand."""
  env = countdown.Countdown(num_numbers=len(numbers))
  env.reset(0)
  env.numbers, env.target = list(numbers), target
  return env


# ------------------------------------------------------------------------------ hand-worked rewards


@pytest.mark.parametrize(
    "answer, reward, valid, value",
    [
        ("(3 + 5) * 2", 1.0, True, 16.0),
        ("2*(5+3)", 1.0, True, 16.0),
        ("  (3 + 5) * 2 = 16 ", 1.0, True, 16.0),  # a restated result is tolerated
        ("(3 + 5) * 2 = 12", 1.0, True, 16.0),  # ... and not judged: the left side is
        ("3 + 5 + 2", 0.1, True, 10.0),  # right numbers, wrong value: the format score
        ("3 * 5 - 2", 0.1, True, 13.0),
        ("2 - 3 / 5", 0.1, True, 1.4),  # a non-integer final value just misses
        ("(3 + 5) * 2 * 2", 0.0, True, 32.0),  # 2 used twice
        ("(3 + 5) * 8", 0.0, True, 64.0),  # 2 missing, 8 foreign
        ("3 + 5", 0.0, True, 8.0),  # 2 missing
        ("(3 + 5) * 2 + 0", 0.0, True, 16.0),  # a foreign 0 still counts as a number
        ("(3 + 5 * 2", 0.0, False, None),  # unclosed parenthesis
        ("3 + 5 +* 2", 0.0, False, None),
        ("(3 + 5) x 2", 0.0, False, None),  # stray character
        ("3.0 + 5 * 2", 0.0, False, None),  # no decimals
        ("", 0.0, False, None),
        ("16", 0.0, True, 16.0),  # the target alone: wrong numbers
    ],
)
def test_rewards_by_hand(answer, reward, valid, value):
  env = level([3, 5, 2], 16)
  obs, r, done, info = env.step(answer)
  assert r == reward
  assert done
  assert info["success"] == (reward == 1.0)
  assert info["action_is_valid"] == valid
  assert info["action_is_effective"] is True
  if value is None:
    assert info["value"] is None
  else:
    assert info["value"] == pytest.approx(value)
  if reward == 1.0:
    assert obs == "Correct."
  elif reward == 0.1:
    assert obs.startswith("Wrong: the expression equals") and obs.endswith("not 16.")
  elif valid:
    assert obs == "Wrong numbers: use each of [3, 5, 2] exactly once."
  else:
    assert obs.startswith("Invalid expression: ")


def test_wrong_value_is_named():
  env = level([3, 5, 2], 12)
  assert env.step("3 * 5 - 2")[0] == "Wrong: the expression equals 13, not 12."
  assert env.step("2 / 3 + 5")[0] == "Wrong: the expression equals 17/3, not 12."


def test_repeated_numbers_are_a_multiset():
  env = level([4, 4, 2], 10)
  assert env.step("4 + 4 + 2")[1] == 1.0
  assert env.step("4 + 2 + 2 + 2")[1] == 0.0  # 4 once, 2 three times
  assert env.step("4 + 4 + 2 + 4")[1] == 0.0  # 4 three times


def test_division_by_zero_is_invalid():
  env = level([5, 5, 2], 2)
  obs, r, done, info = env.step("2 / (5 - 5)")
  assert (r, done, info["action_is_valid"], info["value"]) == (0.0, True, False, None)
  assert obs == "Invalid expression: division by zero."
  assert env.step("2 * (5 - 5)")[1] == 0.1  # zero itself is fine, only dividing by it


def test_fraction_intermediates_are_exact():
  # 8 / 3 is not an integer, but exact arithmetic brings it back: allowed.
  assert level([8, 3, 3], 8).step("8 / 3 * 3")[1] == 1.0
  assert level([8, 3, 3], 8).step("3 * (8 / 3)")[1] == 1.0
  assert level([1, 3, 4, 6], 24).step("6 / (1 - 3 / 4)")[1] == 1.0
  # Floating point would give 0.30000000000000004 here; exact arithmetic gives 3/10.
  assert countdown.evaluate("1/10 + 2/10")[0] == Fraction(3, 10)


def test_unary_minus_and_precedence():
  assert countdown.evaluate("-3 + 5 * 2")[:2] == (7, [3, 5, 2])
  assert countdown.evaluate("2 - -3")[0] == 5
  assert countdown.evaluate("--3")[0] == 3
  assert countdown.evaluate("-(3 - 5) * 2")[0] == 4
  assert countdown.evaluate("20 / 5 / 2")[0] == 2  # left-associative
  assert countdown.evaluate("20 - 5 - 2")[0] == 13
  assert countdown.evaluate("(2 + 3) * 4 = -1")[:2] == (20, [2, 3, 4])
  assert level([3, 5, 2], 7).step("-3 + 5 * 2")[1] == 1.0


def test_limits_are_invalid_not_exceptions():
  ok = lambda s: countdown.evaluate(s)[2] is None
  assert ok("999999 + 1") and not ok("1000000 + 1")  # 6 digits
  assert ok("+".join(["1"] * 32)) and not ok("+".join(["1"] * 33))  # 63 vs 65 tokens
  assert ok("(" * 16 + "1" + ")" * 16) and not ok("(" * 17 + "1" + ")" * 17)
  assert not ok("(" * 10000 + "1" + ")" * 10000)  # no RecursionError
  assert ok("1" + " " * 2000)  # surrounding space is stripped before the length check
  assert not ok("1 +" + " " * 1000 + "1")  # over the character limit
  for bad in (
      "",
      "   ",
      "()",
      "1 2",
      "(1))",
      "1 +",
      "= 3",
      "1 = 2 = 3",
      "1 = x",
      "2 ** 3",
      "2 ^ 3",
      "²",
      "٣",
      "__import__('os')",
      "1e3",
      None,
      12,
  ):
    value, numbers, error = countdown.evaluate(bad)
    assert (value, numbers) == (None, None) and error, bad


def test_one_step_ends_the_episode_and_protocol():
  env = countdown.Countdown()
  assert isinstance(env, text.TextEnv)
  assert env.action_names is None and env.max_actions_per_turn == 1
  assert "exactly once" in env.instruction and "<answer>(3 + 5) * 2</answer>" in env.instruction
  with pytest.raises(RuntimeError):
    env.step("1 + 2")
  env.reset(3)
  for answer in (env.expert()[0][0], "1 +", "1 + 2"):
    assert env.step(answer)[2] is True


@pytest.mark.parametrize(
    "options",
    [
        dict(num_numbers=1),
        dict(num_numbers=7),
        dict(num_numbers=3.0),
        dict(num_numbers=True),
        dict(min_number=0),
        dict(min_number=5, max_number=4),
        dict(max_number=10**6),
        dict(max_target=0),
        dict(num_numbers=4, max_target=2),  # below num_numbers - 1: maybe no level
        dict(score=float("nan")),
        dict(format_score="0.1"),
    ],
)
def test_bad_options_raise(options):
  with pytest.raises(ValueError):
    countdown.Countdown(**options)


# --------------------------------------------------------------------- parser against a reference

OPS = "+-*/"


@st.composite
def trees(draw, depth=3):
  """("num", n) | ("neg", tree) | (op, left, right) with small nesting (within the limits)."""
  if depth == 0 or draw(st.integers(0, 2)) == 0:
    return ("num", draw(st.integers(0, 999999) | st.integers(0, 12)))
  kind = draw(st.sampled_from(OPS + "n"))
  if kind == "n":
    return ("neg", draw(trees(depth - 1)))
  return (kind, draw(trees(depth - 1)), draw(trees(depth - 1)))


def reference(tree):
  """The tree's value straight from its structure (ZeroDivisionError on a zero divisor)."""
  if tree[0] == "num":
    return Fraction(tree[1])
  if tree[0] == "neg":
    return -reference(tree[1])
  a, b = reference(tree[1]), reference(tree[2])
  if tree[0] == "+":
    return a + b
  if tree[0] == "-":
    return a - b
  if tree[0] == "*":
    return a * b
  return a / b  # Fraction raises ZeroDivisionError on a zero divisor


def leaves(tree):
  if tree[0] == "num":
    return [tree[1]]
  return [n for child in tree[1:] for n in leaves(child)]


def full_text(tree, space):
  """Every compound operand in parentheses."""
  if tree[0] == "num":
    return str(tree[1])
  wrap = lambda t: full_text(t, space) if t[0] == "num" else f"({full_text(t, space)})"
  if tree[0] == "neg":
    return "-" + wrap(tree[1])
  return wrap(tree[1]) + space + tree[0] + space + wrap(tree[2])


def minimal_text(tree):
  """Parentheses only where precedence or left-associativity needs them; returns (text, prec)."""
  if tree[0] == "num":
    return str(tree[1]), 3
  if tree[0] == "neg":
    inner, p = minimal_text(tree[1])
    return "-" + (inner if p == 3 else f"({inner})"), 3
  p = 1 if tree[0] in "+-" else 2
  (lt, lp), (rt, rp) = minimal_text(tree[1]), minimal_text(tree[2])
  lt = lt if lp >= p else f"({lt})"
  rt = rt if rp > p else f"({rt})"  # a - (b - c), a / (b * c) keep theirs
  return f"{lt} {tree[0]} {rt}", p


@hypothesis.settings(max_examples=300)
@hypothesis.given(trees(), st.sampled_from(["", " ", "  ", "\t"]))
def test_parser_matches_the_tree(tree, space):
  try:
    expected = reference(tree)
  except ZeroDivisionError:
    expected = None
  for source in (full_text(tree, space), minimal_text(tree)[0]):
    value, numbers, error = countdown.evaluate(source)
    if expected is None:
      assert (value, numbers, error) == (None, None, "division by zero"), source
    else:
      assert error is None, (source, error)
      assert value == expected, source
      assert numbers == leaves(tree), source


# ------------------------------------------------------------------------------------ hostile text


@hypothesis.settings(max_examples=200)
@hypothesis.given(st.text() | st.text(alphabet="0123456789+-*/() =.x\n", max_size=80))
def test_hostile_text_never_raises(source):
  value, numbers, error = countdown.evaluate(source)
  assert (error is None) == (value is not None) == (numbers is not None)
  if error is None:
    assert isinstance(value, Fraction) and all(isinstance(n, int) for n in numbers)
  env = level([3, 5, 2], 16)
  obs, reward, done, info = env.step(source)
  assert reward in (0.0, 0.1, 1.0) and done and isinstance(obs, str)
  assert info["action_is_valid"] == (error is None)


# ------------------------------------------------------------------------------ levels and expert


def reachable(numbers):
  """Every value of every expression using all `numbers` once: split the multiset into two
  parts in every way (an algorithm unlike the solver's), exact rationals."""
  if len(numbers) == 1:
    return {Fraction(numbers[0])}
  out = set()
  n = len(numbers)
  for r in range(1, n):
    for chosen in itertools.combinations(range(n), r):
      left = [numbers[i] for i in chosen]
      right = [numbers[i] for i in range(n) if i not in chosen]
      for a in reachable(left):
        for b in reachable(right):
          out.update((a + b, a - b, a * b))
          if b:
            out.add(a / b)
  return out


def test_reset_is_deterministic_in_range_and_solvable():
  env, again = countdown.Countdown(), countdown.Countdown()
  seen = set()
  for seed in range(60):
    obs = env.reset(seed)
    assert obs == again.reset(seed)
    match = OBS.match(obs)
    assert match, obs
    target, numbers = int(match.group(1)), [int(x) for x in match.group(2).split(", ")]
    assert (target, numbers) == (env.target, env.numbers)
    assert len(numbers) == 3 and all(1 <= x <= 20 for x in numbers)
    assert 1 <= target <= 100
    assert Fraction(target) in reachable(numbers)
    value, used, _ = countdown.evaluate(env.solution)
    assert value == target and sorted(used) == sorted(numbers)
    seen.add(obs)
  assert len(seen) > 50  # seeds differ


def test_options_shape_the_levels():
  env = countdown.Countdown(num_numbers=5, min_number=10, max_number=30, max_target=50)
  for seed in range(20):
    match = OBS.match(env.reset(seed))
    numbers = [int(x) for x in match.group(2).split(", ")]
    assert len(numbers) == 5 and all(10 <= x <= 30 for x in numbers)
    assert 1 <= int(match.group(1)) <= 50
  # Far out of reach of random draws: the equal-numbers fallback still yields a level.
  env = countdown.Countdown(num_numbers=3, min_number=999990, max_number=999999, max_target=2)
  for seed in range(3):
    env.reset(seed)
    assert 1 <= env.target <= 2
    assert env.step(env.expert()[0][0])[1] == 1.0


def test_expert_scores_on_200_seeds():
  for seed in range(200):
    env = countdown.Countdown()
    env.reset(seed)
    answers, thought = env.expert()
    assert len(answers) == 1 and str(env.target) in thought
    fresh = countdown.Countdown()
    fresh.reset(seed)
    assert fresh.step(answers[0])[1] == 1.0, (seed, fresh.observation(), answers)


def test_expert_on_six_numbers():
  env = countdown.Countdown(num_numbers=6, max_number=100, max_target=1000)
  for seed in range(5):
    env.reset(seed)
    answers, _ = env.expert()
    assert env.step(answers[0])[1] == 1.0


def test_expert_needs_fractions_and_gives_up():
  for numbers, target in (([1, 5, 6, 7], 21), ([1, 3, 4, 6], 24), ([3, 3, 8, 8], 24)):
    env = level(numbers, target)
    answers, _ = env.expert()
    assert env.step(answers[0])[1] == 1.0, answers
  env = level([1, 1], 5)  # 1 + 1, 1 * 1, 1 - 1, 1 / 1: never 5
  assert Fraction(5) not in reachable([1, 1])
  answers, thought = env.expert()
  assert answers is None and "no expression" in thought
  assert countdown.solve([2, 3, 7], 1000) is None and countdown.solve([2, 3, 7], 42) is not None

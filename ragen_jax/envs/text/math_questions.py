"""Short arithmetic word problems with whole-number answers: the shipped set of `MathEnv`.

    python -m ragen_jax.envs.text.math_questions --out ragen_jax/assets/math/questions.jsonl \
        --n 2000 --seed 0

writes one JSON object a line: {"question", "answer", "reasoning", "kind"}. `answer` is the
integer as a string (what `MathEnv` compares), `reasoning` the computation in a few tokens
("4 * 6 = 24, 24 + 3 = 27": the expert's thought in the supervised warm start) and `kind` the
problem type. The same (n, seed) always gives the same lines, and no question repeats.

Kinds, with the numbers a, b, c appearing in the question in this order:
  sum        a + b          difference  a - b          product  a * b
  quotient   a / b (exact)  add_product a * b + c      two_takes a - b - c
  change     c - a * b      (a items at b dollars each, paid with c dollars)
Numbers stay small (mostly below 100) so a tiny model can learn the arithmetic.
"""

import argparse
import json
import random
from typing import Callable, Dict, List

# fmt: off
NAMES = (
    "Ana", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
    "Milo", "Nia", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tess", "Uma", "Vik", "Wren", "Yara",
)
ITEMS = (
    "apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "coins", "cards",
    "stamps", "eggs", "balloons", "buttons", "candles", "plums", "beads",
)
# fmt: on
GOODS = ("pens", "notebooks", "toys", "tickets", "cups", "hats", "kites", "mugs")
BOXES = ("boxes", "bags", "jars", "packs", "crates", "baskets")

Problem = Dict[str, str]


def _sum(rng: random.Random) -> Problem:
  a, b = rng.randint(2, 60), rng.randint(2, 60)
  name, item = rng.choice(NAMES), rng.choice(ITEMS)
  q = f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?"
  return _problem(q, a + b, f"{a} + {b} = {a + b}", "sum")


def _difference(rng: random.Random) -> Problem:
  b = rng.randint(1, 40)
  a = b + rng.randint(1, 50)  # a > b: no negative answers
  name, item = rng.choice(NAMES), rng.choice(ITEMS)
  q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
  return _problem(q, a - b, f"{a} - {b} = {a - b}", "difference")


def _product(rng: random.Random) -> Problem:
  a, b = rng.randint(2, 12), rng.randint(2, 12)
  item, box = rng.choice(ITEMS), rng.choice(BOXES)
  q = f"There are {a} {box} with {b} {item} in each. How many {item} are there in all?"
  return _problem(q, a * b, f"{a} * {b} = {a * b}", "product")


def _quotient(rng: random.Random) -> Problem:
  b, answer = rng.randint(2, 10), rng.randint(2, 12)
  a = b * answer  # built from the answer, so the division is exact
  item = rng.choice(ITEMS)
  q = f"{a} {item} are shared equally among {b} friends. How many {item} does each friend get?"
  return _problem(q, answer, f"{a} / {b} = {answer}", "quotient")


def _add_product(rng: random.Random) -> Problem:
  a, b, c = rng.randint(2, 9), rng.randint(2, 10), rng.randint(1, 20)
  name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(BOXES)
  q = (
      f"{name} has {a} {box} of {b} {item} and {c} loose {item}. "
      f"How many {item} does {name} have?"
  )
  ab = a * b
  return _problem(q, ab + c, f"{a} * {b} = {ab}, {ab} + {c} = {ab + c}", "add_product")


def _two_takes(rng: random.Random) -> Problem:
  b, c = rng.randint(1, 25), rng.randint(1, 25)
  a = b + c + rng.randint(0, 40)
  name, item = rng.choice(NAMES), rng.choice(ITEMS)
  friend = rng.choice([n for n in NAMES if n != name])
  q = (
      f"{name} had {a} {item}, gave {b} to {friend} and lost {c}. "
      f"How many {item} does {name} have left?"
  )
  ab = a - b
  return _problem(q, ab - c, f"{a} - {b} = {ab}, {ab} - {c} = {ab - c}", "two_takes")


def _change(rng: random.Random) -> Problem:
  a, b = rng.randint(2, 8), rng.randint(2, 9)
  c = rng.choice([bill for bill in (10, 20, 50, 100) if bill >= a * b])
  name, good = rng.choice(NAMES), rng.choice(GOODS)
  q = (
      f"{name} buys {a} {good} at {b} dollars each and pays with {c} dollars. "
      f"How many dollars of change does {name} get?"
  )
  ab = a * b
  return _problem(q, c - ab, f"{a} * {b} = {ab}, {c} - {ab} = {c - ab}", "change")


def _problem(question: str, answer: int, reasoning: str, kind: str) -> Problem:
  return {"question": question, "answer": str(answer), "reasoning": reasoning, "kind": kind}


KINDS: Dict[str, Callable[[random.Random], Problem]] = {
    "sum": _sum,
    "difference": _difference,
    "product": _product,
    "quotient": _quotient,
    "add_product": _add_product,
    "two_takes": _two_takes,
    "change": _change,
}


def generate(n: int, seed: int = 0) -> List[Problem]:
  """`n` distinct problems, the same for the same (n, seed); kinds drawn uniformly."""
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  rng = random.Random(seed)
  kinds = list(KINDS.values())
  problems: List[Problem] = []
  seen = set()
  for _ in range(100 * n):  # duplicates are rare; the bound only guards an impossible n
    problem = rng.choice(kinds)(rng)
    if problem["question"] not in seen:
      seen.add(problem["question"])
      problems.append(problem)
      if len(problems) == n:
        return problems
  raise ValueError(f"could not draw {n} distinct problems")


def to_jsonl(problems: List[Problem]) -> str:
  """One JSON object a line, ending with a newline."""
  return "".join(json.dumps(p) + "\n" for p in problems)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--out", required=True, help="the JSONL file to write")
  parser.add_argument("--n", type=int, default=2000, help="how many problems")
  parser.add_argument("--seed", type=int, default=0, help="the random seed")
  args = parser.parse_args(argv)
  with open(args.out, "w", encoding="utf-8", newline="\n") as f:
    f.write(to_jsonl(generate(args.n, args.seed)))


if __name__ == "__main__":
  main()

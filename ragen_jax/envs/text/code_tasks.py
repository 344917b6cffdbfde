"""Small generated function-writing tasks (templates x parameters) for the code environment.

    problem = generate(seed=3, split="train")   # a code_problems.Problem, functional tests

Each template holds a description, a reference solution (source text, the expert's answer) and
an independent way to compute the expected outputs here (a Python function), so a test that runs
the reference against the computed outputs checks both. A task is one template with its
parameters; tasks are split by a hash of (template, parameters): about a fifth are "test"
(held out), and `generate(seed, "test")` never returns a task `generate(_, "train")` can. The
same seed and split give the same problem.
"""

import dataclasses
import random
import zlib
from typing import Any, Callable, Dict, List, Tuple

from ragen_jax.envs.text import code_problems as cp

SPLITS = ("train", "test")
HELD_OUT_EVERY = 5  # tasks whose hash is 0 modulo this are the "test" split
TESTS_PER_TASK = 5


@dataclasses.dataclass(frozen=True)
class Template:
  name: str  # the function's name, formatted with the parameters
  signature: str  # its arguments
  description: str  # formatted with the parameters
  solution: str  # the reference's body, formatted with the parameters
  params: Callable[[random.Random], Dict[str, Any]]
  inputs: Callable[[random.Random, Dict[str, Any]], Tuple]
  expected: Callable[..., Any]  # (params, *inputs) -> the output, computed independently


def _ints(rng: random.Random, low: int = -20, high: int = 20) -> List[int]:
  return [rng.randint(low, high) for _ in range(rng.randint(0, 8))]


def _word(rng: random.Random) -> str:
  return "".join(rng.choice("abcdeiou xyz") for _ in range(rng.randint(0, 14)))


TEMPLATES = (
    Template(
        "sum_multiples_of_{k}",
        "nums",
        "returns the sum of the numbers in the list nums that are divisible by {k}",
        "    return sum(x for x in nums if x % {k} == 0)",
        lambda r: {"k": r.randint(2, 9)},
        lambda r, p: (_ints(r),),
        lambda p, nums: sum(filter(lambda x: not x % p["k"], nums)),
    ),
    Template(
        "scale_{a}_shift_{b}",
        "nums",
        "returns a new list with each number x of nums replaced by x * {a} + {b}",
        "    return [x * {a} + {b} for x in nums]",
        lambda r: {"a": r.randint(2, 6), "b": r.randint(0, 9)},
        lambda r, p: (_ints(r),),
        lambda p, nums: list(map(lambda x: p["a"] * x + p["b"], nums)),
    ),
    Template(
        "clip_{lo}_{hi}",
        "nums",
        "returns nums with every number below {lo} raised to {lo} and above {hi} lowered to {hi}",
        "    return [min(max(x, {lo}), {hi}) for x in nums]",
        lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(1, 15)})(r.randint(-10, 5)),
        lambda r, p: (_ints(r),),
        lambda p, nums: [p["lo"] if x < p["lo"] else p["hi"] if x > p["hi"] else x for x in nums],
    ),
    Template(
        "rotate_left_{k}",
        "nums",
        "returns the list nums rotated left by {k} places (the first {k} items move to the end, "
        "wrapping around for short lists; an empty list stays empty)",
        "    if not nums:\n        return []\n    k = {k} % len(nums)\n    return nums[k:] + nums[:k]",
        lambda r: {"k": r.randint(1, 4)},
        lambda r, p: (_ints(r),),
        lambda p, nums: [nums[(i + p["k"]) % len(nums)] for i in range(len(nums))],
    ),
    Template(
        "count_{c}",
        "s",
        "returns how many times the letter '{c}' occurs in the string s",
        "    return s.count('{c}')",
        lambda r: {"c": r.choice("aeiouxyz")},
        lambda r, p: (_word(r),),
        lambda p, s: sum(ch == p["c"] for ch in s),
    ),
    Template(
        "replace_vowels_with_{c}",
        "s",
        "returns the string s with every vowel (a, e, i, o, u) replaced by '{c}'",
        "    return ''.join('{c}' if ch in 'aeiou' else ch for ch in s)",
        lambda r: {"c": r.choice("bcdfgxz")},
        lambda r, p: (_word(r),),
        lambda p, s: s.translate(str.maketrans("aeiou", p["c"] * 5)),
    ),
    Template(
        "every_{k}th",
        "nums",
        "returns every {k}th item of nums starting with the first (indices 0, {k}, 2*{k}, ...)",
        "    return nums[::{k}]",
        lambda r: {"k": r.randint(2, 5)},
        lambda r, p: (_ints(r),),
        lambda p, nums: [x for i, x in enumerate(nums) if i % p["k"] == 0],
    ),
    Template(
        "power_sum_{p}",
        "nums",
        "returns the sum of x ** {p} over the numbers x in nums",
        "    return sum(x ** {p} for x in nums)",
        lambda r: {"p": r.randint(2, 4)},
        lambda r, p: (_ints(r, -9, 9),),
        lambda p, nums: sum(pow(x, p["p"]) for x in nums),
    ),
    Template(
        "words_longer_than_{n}",
        "s",
        "returns how many of the space-separated words of s are longer than {n} characters",
        "    return len([w for w in s.split() if len(w) > {n}])",
        lambda r: {"n": r.randint(1, 4)},
        lambda r, p: (_word(r),),
        lambda p, s: sum(1 for w in s.split(" ") if len(w) > p["n"]),
    ),
    Template(
        "prefix_sums_mod_{m}",
        "nums",
        "returns the running totals of nums (the i-th item is the sum of the first i + 1 numbers), "
        "each taken modulo {m} (Python's %, never negative)",
        "    out, total = [], 0\n    for x in nums:\n        total += x\n"
        "        out.append(total % {m})\n    return out",
        lambda r: {"m": r.randint(3, 11)},
        lambda r, p: (_ints(r),),
        lambda p, nums: [sum(nums[: i + 1]) % p["m"] for i in range(len(nums))],
    ),
)


def split_of(template: Template, params: Dict[str, Any]) -> str:
  """Which split a task belongs to: a stable hash of its template and parameters."""
  key = f"{template.name}|{sorted(params.items())}".encode()
  return "test" if zlib.crc32(key) % HELD_OUT_EVERY == 0 else "train"


def task_key(problem: cp.Problem) -> str:
  """What identifies a generated task (its function name carries the parameters)."""
  return problem.func_name


def generate(seed: int, split: str = "train") -> cp.Problem:
  """The task of `seed` in `split` (see the module doc)."""
  if split not in SPLITS:
    raise ValueError(f"code task split {split!r} is not one of {SPLITS}")
  rng = random.Random(f"{split}:{int(seed)}")
  while True:  # about 1 draw in 5 (test) or 5 in 4 (train) lands in the split
    template = rng.choice(TEMPLATES)
    params = template.params(rng)
    if split_of(template, params) == split:
      break
  name = template.name.format(**params).replace("-", "minus")  # clip_minus3_0
  tests = []
  for _ in range(TESTS_PER_TASK):
    args = template.inputs(rng, params)
    tests.append(cp.Test("functional", repr(args), template.expected(params, *args)))
  example_args = template.inputs(rng, params)
  while not example_args[0]:  # an example with an empty list or string shows little
    example_args = template.inputs(rng, params)
  example = f"{name}({', '.join(map(repr, example_args))})"
  shown = template.expected(params, *example_args)
  prompt = (
      f"Write a Python function {name}({template.signature}) that "
      f"{template.description.format(**params)}.\nExample: {example} returns {shown!r}."
  )
  solution = f"def {name}({template.signature}):\n" + template.solution.format(**params) + "\n"
  return cp.Problem(
      source="generated", prompt=prompt, tests=tuple(tests), func_name=name, solution=solution
  )

"""Coding problems for ragen_jax.envs.text.code_env: the record formats, code extraction, and the
programs that run a candidate against one test in the sandbox.

Formats, told apart by their fields (one JSON object a line):
  DeepCoder (RAGEN's preprocessed records): `question` or `problem`; `tests` or `ground_truth`
      (a list, or its JSON text, of {"input", "output", "testtype": "stdin_stdout" |
      "functional"}; or {"inputs": [...], "outputs": [...]}, stdin tests); `metadata` (a dict or
      its JSON text) with `func_name` for functional tests; optional `starter_code`, `solution`.
  HumanEval: `prompt`, `entry_point`, `test` (defining check(candidate)), `canonical_solution`.
  MBPP: `text`, `test_list` (assert lines), optional `code`, `test_setup_code`.
Fields of none of these raise a ValueError naming them.

Tests (`Test.kind`):
  "stdin"       the program runs with `input` on stdin; its stdout must equal `output` after
                stripping, line by line (trailing spaces ignored).
  "functional"  the candidate's `func_name` (a method of `Solution` when it defines one) is called
                with the arguments; the result, written as JSON on a line marked by a random
                token, must equal `output` (floats to 1e-6); judged here, outside the sandbox.
  "assert"      the test's own code runs after the candidate (HumanEval's check, MBPP's asserts)
                and prints the token when no assertion failed (the verdict comes from inside
                the sandbox: docs/sandbox.md).
"""

import ast
import dataclasses
import json
import math
import re
from typing import Any, Dict, Optional, Tuple

MARK = "@@ragen-judge-"  # + a random token per step: the harness's result line

FORMATS = {  # format -> the fields it may carry
    "deepcoder": {
        "question", "problem", "tests", "ground_truth", "metadata", "starter_code", "solution",
        "data_source", "uid", "index", "task_id", "difficulty", "source",
    },
    "humaneval": {"task_id", "prompt", "entry_point", "test", "canonical_solution"},
    "mbpp": {"task_id", "text", "test_list", "code", "test_setup_code", "challenge_test_list"},
}  # fmt: skip
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_LANGUAGES = {"", "python", "python3", "py", "py3"}
_TYPING = "from typing import *  # noqa\n"


@dataclasses.dataclass(frozen=True)
class Test:
  kind: str  # "stdin" | "functional" | "assert"
  input: str  # stdin text | repr of the argument tuple | the test's code
  output: Any = None  # the expected stdout text | the expected value | None


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem: `prompt` is the observation; `solution` the reference (may be "")."""

  source: str  # "deepcoder" | "humaneval" | "mbpp" | "generated"
  prompt: str
  tests: Tuple[Test, ...]
  func_name: str = ""  # functional tests' function; HumanEval's entry point
  starter_code: str = ""
  prefix: str = ""  # code placed before the candidate (HumanEval's prompt)
  solution: str = ""


def extract_code(text: str) -> str:
  """The code of a free-text answer: the first fenced (triple-backtick) block tagged Python or
  untagged, else the whole text; leading and trailing blank lines dropped, indentation kept."""
  text = "" if text is None else str(text)
  for match in _FENCE.finditer(text):
    if match.group(1).lower() in _CODE_LANGUAGES:
      return match.group(2).strip("\n")
  return text.strip("\n")


def assemble(problem: Problem, code: str) -> str:
  """The candidate program: RAGEN's starter-code rules (a bare `def` becomes the method of the
  starter's `class Solution`; a candidate with its own class replaces the starter), HumanEval's
  prompt first (a body-only completion then continues it; a full function redefines it).
  Functional problems get `from typing import *` first (starter signatures use List etc.)."""
  if problem.prefix:
    head = problem.prefix if problem.prefix.endswith("\n") else problem.prefix + "\n"
    return head + code
  header = _TYPING if problem.func_name else ""
  starter = problem.starter_code.strip("\n")
  if "class Solution" in code or not starter:
    return header + code
  if "class Solution" in starter and code.startswith("def "):
    # The starter's class with its body-less method replaced by the candidate's.
    indented = "\n".join(("    " + line) if line.strip() else "" for line in code.splitlines())
    return f"{header}class Solution:\n{indented}"
  return f"{header}{starter}\n\n{code}"


def program_for(problem: Problem, candidate: str, test: Test, token: str) -> Tuple[str, str]:
  """(program, stdin) running `candidate` (assembled) against `test`."""
  mark = MARK + token
  if test.kind == "stdin":
    return candidate + "\n", test.input
  if test.kind == "assert":
    return f"{candidate}\n\n{test.input}\n\nprint({mark!r})\n", ""
  name = problem.func_name
  harness = (
      "\n\nimport json as _rj_json, sys as _rj_sys\n"
      f"_rj_f = (getattr(Solution(), {name!r}) if 'Solution' in globals() and "
      f"hasattr(Solution, {name!r}) else {name})\n"
      f"_rj_r = _rj_f(*{test.input})\n"
      f"_rj_sys.stdout.write('\\n' + {mark!r} + _rj_json.dumps(_rj_r, default=repr) + '\\n')\n"
  )
  return candidate + harness, ""


def marked(stdout: str, token: str) -> Optional[str]:
  """The text after the last line's mark, or None when the harness did not finish."""
  mark = MARK + token
  for line in reversed(stdout.splitlines()):
    if line.startswith(mark):
      return line[len(mark) :]
  return None


def same_value(got: Any, expected: Any) -> bool:
  """Equal as JSON values (tuples as lists), floats to a relative 1e-6."""
  if isinstance(got, bool) or isinstance(expected, bool):
    return got is expected
  if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
    return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
  if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
    return len(got) == len(expected) and all(map(same_value, got, expected))
  if isinstance(got, dict) and isinstance(expected, dict):
    return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in got)
  return got == expected or str(got) == str(expected)


def same_stdout(got: str, expected: str) -> bool:
  lines = lambda s: [line.rstrip() for line in str(s).strip().splitlines()]
  return lines(got) == lines(expected)


# ------------------------------------------------------------------------------------- formats


def detect(obj: Dict[str, Any], where: str) -> str:
  if "entry_point" in obj:
    fmt = "humaneval"
  elif "test_list" in obj:
    fmt = "mbpp"
  elif "tests" in obj or "ground_truth" in obj:
    fmt = "deepcoder"
  else:
    raise ValueError(
        f"{where}: cannot tell the problem format from the fields {sorted(obj)}; expected "
        "DeepCoder (question|problem, tests|ground_truth), HumanEval (prompt, entry_point, test) "
        "or MBPP (text, test_list)"
    )
  unknown = sorted(set(obj) - FORMATS[fmt])
  if unknown:
    raise ValueError(
        f"{where}: unknown fields {unknown} for a {fmt} problem (known: {sorted(FORMATS[fmt])})"
    )
  return fmt


def parse(obj: Any, where: str) -> Problem:
  """The problem of one record (see the module doc); a ValueError naming `where` otherwise."""
  if not isinstance(obj, dict):
    raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
  fmt = detect(obj, where)
  return {"deepcoder": _deepcoder, "humaneval": _humaneval, "mbpp": _mbpp}[fmt](obj, where)


def _text(obj: dict, name: str, where: str, default: Optional[str] = None) -> str:
  value = obj.get(name, default)
  if not isinstance(value, str):
    raise ValueError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
  return value


def _json_or(value: Any, name: str, where: str) -> Any:
  if not isinstance(value, str):
    return value
  try:
    return json.loads(value)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: {name!r} is a string but not JSON ({e.msg})") from e


def _humaneval(obj: dict, where: str) -> Problem:
  entry = _text(obj, "entry_point", where)
  prompt = _text(obj, "prompt", where)
  solution = _text(obj, "canonical_solution", where, "")
  test = Test("assert", f"{_text(obj, 'test', where)}\n\ncheck({entry})")
  return Problem(
      source="humaneval",
      prompt=f"Complete the Python function {entry}:\n\n{prompt}",
      tests=(test,),
      func_name=entry,
      prefix=prompt,
      solution=(prompt + solution) if solution else "",
  )


def _mbpp(obj: dict, where: str) -> Problem:
  asserts = obj["test_list"]
  if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
    raise ValueError(f"{where}: 'test_list' must be a non-empty list of strings")
  setup = _text(obj, "test_setup_code", where, "")
  tests = tuple(Test("assert", f"{setup}\n{line}") for line in asserts)
  listed = "\n".join(asserts)
  return Problem(
      source="mbpp",
      prompt=f"{_text(obj, 'text', where)}\nYour code should pass these tests:\n\n{listed}",
      tests=tests,
      solution=_text(obj, "code", where, ""),
  )


def _deepcoder(obj: dict, where: str) -> Problem:
  question_field = "question" if "question" in obj else "problem"
  question = _text(obj, question_field, where)
  tests_field = "tests" if "tests" in obj else "ground_truth"
  raw = _json_or(obj[tests_field], tests_field, where)
  if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:
    raw = [{"input": i, "output": o, "testtype": "stdin_stdout"} for i, o in zip(*raw.values())]
  if not isinstance(raw, list) or not raw:
    raise ValueError(f"{where}: {tests_field!r} must be a non-empty list of tests")
  metadata = _json_or(obj.get("metadata", {}), "metadata", where) or {}
  if not isinstance(metadata, dict):
    raise ValueError(f"{where}: 'metadata' must be an object")
  func_name = str(metadata.get("func_name") or "")
  tests = tuple(_deepcoder_test(t, func_name, f"{where}, test {i}") for i, t in enumerate(raw))
  starter = _text(obj, "starter_code", where, "") or ""
  prompt = f"{question}\n\nStarter code:\n{starter}" if starter.strip() else question
  return Problem(
      source="deepcoder",
      prompt=prompt,
      tests=tests,
      func_name=func_name,
      starter_code=starter,
      solution=_text(obj, "solution", where, "") or "",
  )


def _deepcoder_test(test: Any, func_name: str, where: str) -> Test:
  if not isinstance(test, dict) or "input" not in test or "output" not in test:
    raise ValueError(f"{where}: a test is an object with 'input' and 'output'")
  kind = test.get("testtype", "stdin_stdout")
  if kind == "stdin_stdout":
    return Test("stdin", str(test["input"]), str(test["output"]))
  if kind != "functional":
    raise ValueError(f"{where}: testtype {kind!r} is not 'stdin_stdout' or 'functional'")
  if not func_name.isidentifier():
    raise ValueError(f"{where}: a functional test needs metadata.func_name, got {func_name!r}")
  raw = test["input"]
  args = (
      [_literal(p, where) for p in raw.splitlines() if p.strip()] if isinstance(raw, str) else raw
  )
  expected = _literal(test["output"], where) if isinstance(test["output"], str) else test["output"]
  return Test("functional", repr(tuple(args) if isinstance(args, list) else (args,)), expected)


def _literal(text: str, where: str) -> Any:
  """JSON, else a Python literal (never evaluated code), else the text itself."""
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    pass
  try:
    return ast.literal_eval(text.strip())
  except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
    return text

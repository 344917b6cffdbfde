"""MathEnv (RAGEN's MetaMathQA rules) and the generator of its shipped question set."""

import json
import random
import re
import threading

import hypothesis
from hypothesis import strategies as st
import pytest

from ragen_jax.envs.text import math_env
from ragen_jax.envs.text import math_questions
from ragen_jax.envs import text

RETRY = "Incorrect. Please think again."  # RAGEN's feedback, written out to catch a changed one


@pytest.fixture(autouse=True)
def _fresh_cache():
  math_env.clear_cache()
  yield
  math_env.clear_cache()


def _write(tmp_path, lines, name="q.jsonl"):
  path = tmp_path / name
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


def _one_question(tmp_path, answer="42", max_attempts=3, **fields):
  line = json.dumps({"question": "What is 6 * 7?", "answer": answer, **fields})
  return math_env.MathEnv(path=_write(tmp_path, [line]), max_attempts=max_attempts)


def _play(env, answers):
  env.reset(0)
  return [env.step(a) for a in answers]


# --- RAGEN's reward: 1 / 2**k after k wrong answers -------------------------------------------


@pytest.mark.parametrize(
    "answers, reward",
    [
        (["42"], 1.0),
        (["41", "42"], 0.5),
        (["41", "40", "42"], 0.25),
    ],
)
def test_right_after_k_wrong_pays_half_to_the_k(tmp_path, answers, reward):
  outs = _play(_one_question(tmp_path), answers)
  for i, (obs, r, done, info) in enumerate(outs[:-1]):  # the wrong ones
    assert (obs, r, done) == (RETRY, 0.0, False)
    assert info == {
        "success": False,
        "action_is_valid": True,
        "action_is_effective": True,
        "attempt": i + 1,
    }
  obs, r, done, info = outs[-1]
  assert (obs, r, done) == ("Correct!", reward, True)
  assert info["success"] and info["attempt"] == len(answers)


def test_all_wrong_ends_unsolved_after_max_attempts(tmp_path):
  env = _one_question(tmp_path)
  outs = _play(env, ["1", "2", "3"])
  assert [o[0] for o in outs] == [RETRY, RETRY, "Incorrect."]
  assert [o[1] for o in outs] == [0.0, 0.0, 0.0]
  assert [o[2] for o in outs] == [False, False, True]
  assert [o[3]["success"] for o in outs] == [False] * 3
  assert [o[3]["attempt"] for o in outs] == [1, 2, 3]
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("42")
  env.reset(0)  # a new episode starts afresh
  assert env.step("42")[1] == 1.0


def test_max_attempts_option(tmp_path):
  outs = _play(_one_question(tmp_path, max_attempts=5), ["0"] * 4 + ["42"])
  assert [o[1] for o in outs] == [0.0] * 4 + [1 / 16]
  assert [o[2] for o in outs] == [False] * 4 + [True]
  obs, reward, done, info = _play(_one_question(tmp_path, max_attempts=1), ["41"])[0]
  assert (obs, reward, done, info["success"]) == ("Incorrect.", 0.0, True, False)
  with pytest.raises(ValueError, match="max_attempts"):
    _one_question(tmp_path, max_attempts=0)


def test_empty_answer_is_invalid_and_uses_an_attempt(tmp_path):
  outs = _play(_one_question(tmp_path), ["  ", "The answer is:", "42"])
  assert [o[3]["action_is_valid"] for o in outs] == [False, False, True]
  assert [o[3]["action_is_effective"] for o in outs] == [False, False, True]
  assert outs[-1][1] == 0.25


def test_step_before_reset_raises(tmp_path):
  env = _one_question(tmp_path)
  with pytest.raises(RuntimeError, match="before reset"):
    env.step("42")
  with pytest.raises(RuntimeError, match="before reset"):
    env.expert()


# --- normalisation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, answer, right",
    [
        ("The answer is: 42", " 42 ", True),  # MetaMathQA's marker, outer whitespace
        ("Six sevens.\nSo x = 42.\nThe answer is: 42", "42", True),
        ("42", "The answer is: 42", True),  # the model's answer is extracted too
        ("42", "so the ANSWER IS:\n42", True),  # the model's marker in any case
        ("The answer is: \\Frac{1}{2}", "\\frac{1}{2}", True),  # lower case
        ("The answer is: B", "b", True),
        ("3 / 4", "3/4", True),  # inner whitespace removed
        ("x = 2,\ty = 3", "X=2,Y=3", True),
        ("48 / 2 = 24 clips in May.\n24 + 48 = 72\n#### 72", "72", True),  # GSM8K
        ("72", "#### 72", True),
        ("#### 7 2", "72", True),
        ("The answer is: 42", "42.0", False),  # nothing else forgiven, as in RAGEN
        ("The answer is: 42", "42 apples", False),
        ("The answer is: 42", "The answer is 42", False),  # no colon: no extraction
        ("The answer is: 42", "43", False),
        ("#### 72", "The answer is: 27", False),
    ],
)
def test_normalisation(tmp_path, reference, answer, right):
  _, reward, done, info = _play(_one_question(tmp_path, answer=reference), [answer])[0]
  assert info["success"] is right
  assert reward == (1.0 if right else 0.0)
  assert done is right


def test_normalize_strings():
  assert math_env.normalize("The answer is: \\Frac {1} {2}\n") == "\\frac{1}{2}"
  assert math_env.normalize("a\nThe answer is: 1\nThe answer is: 2") == "2"  # the last one
  assert math_env.normalize("step #### 1 000") == "1000"
  assert math_env.extract_final("  The answer is:  B  ") == "B"
  assert math_env.extract_final("no marker ") == "no marker"


# --- files ---------------------------------------------------------------------------------------

GOOD = json.dumps({"question": "1 + 1?", "answer": "2"})


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "not JSON"),
        (json.dumps({"question": "1 + 1?"}), "no 'answer' or 'response' field"),
        (json.dumps({"answer": "2"}), "no 'question' or 'query' field"),
        (json.dumps({"question": "1 + 1?", "answer": 2}), "'answer' must be a string"),
        (json.dumps({"question": ["1 + 1?"], "answer": "2"}), "'question' must be a string"),
        (json.dumps(["1 + 1?", "2"]), "expected a JSON object"),
        (json.dumps({"question": "1 + 1?", "answer": "The answer is: "}), "empty"),
        (json.dumps({"question": "  ", "answer": "2"}), "question is empty"),
        (json.dumps({"question": "1 + 1?", "answer": "2", "reasoning": 3}), "reasoning"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, message):
  path = _write(tmp_path, [GOOD, "", bad_line, GOOD])  # a blank line 2 is skipped, yet counted
  with pytest.raises(ValueError, match=re.escape(f"{path}, line 3")) as e:
    math_env.MathEnv(path=path)
  assert message in str(e.value)


def test_missing_or_empty_file(tmp_path):
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(ValueError, match=re.escape(missing)):
    math_env.MathEnv(path=missing)
  empty = _write(tmp_path, ["", " "], name="empty.jsonl")
  with pytest.raises(ValueError, match=re.escape(empty) + ".*no questions"):
    math_env.MathEnv(path=empty)


def test_metamathqa_and_gsm8k_fields(tmp_path):
  path = _write(
      tmp_path,
      [
          json.dumps({"query": "Q0", "response": "2 + 2 = 4.\nThe answer is: 4", "type": "GSM_x"}),
          json.dumps({"question": "Q1", "answer": "5 + 5 = 10\n#### 10"}),
          json.dumps({"question": "Q2", "answer": "3", "reasoning": " 1 + 2 = 3 "}),
      ],
  )
  env = math_env.MathEnv(path=path)
  assert [env.reset(s) for s in range(3)] == ["Q0", "Q1", "Q2"]
  env.reset(0)
  assert env.expert() == (["4"], "The answer is 4.")
  env.reset(1)
  assert env.expert() == (["10"], "The answer is 10.")
  assert env.step("10")[1] == 1.0
  assert env.expert() == (None, "")  # over: nothing left to answer
  env.reset(2)
  assert env.expert() == (["3"], "1 + 2 = 3")


def test_file_is_loaded_once_and_shared(tmp_path, monkeypatch):
  path = _write(tmp_path, [GOOD])
  reads = []
  real_read = math_env._read
  monkeypatch.setattr(math_env, "_read", lambda p: reads.append(p) or real_read(p))
  envs, errors = [], []

  def build():
    try:
      envs.append(math_env.MathEnv(path=path))
    except Exception as e:  # surfaced below: a thread's exception is otherwise lost
      errors.append(e)

  threads = [threading.Thread(target=build) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not any(t.is_alive() for t in threads) and not errors and len(envs) == 8
  assert len(reads) == 1
  assert all(e.questions is envs[0].questions for e in envs)


# --- episodes over the question set ---------------------------------------------------------------


def test_reset_picks_seed_modulo_the_set(tmp_path):
  questions = [f"Question {i}?" for i in range(5)]
  path = _write(
      tmp_path, [json.dumps({"question": q, "answer": str(i)}) for i, q in enumerate(questions)]
  )
  env = math_env.MathEnv(path=path)
  for seed in (0, 3, 4, 5, 12, 10**9 + 7):
    assert env.reset(seed) == questions[seed % 5]
  assert math_env.MathEnv(path=path).reset(12) == env.reset(12)  # same seed, same start
  env.reset(7)
  assert env.step("2")[1] == 1.0 and env.expert() == (None, "")


def test_env_contract():
  env = math_env.MathEnv()
  assert isinstance(env, text.TextEnv)
  assert env.action_names is None and env.max_actions_per_turn == 1
  for part in ("<think></think>", "<answer></answer>", "3 tries"):
    assert part in env.instruction
  assert "tries" not in math_env.MathEnv(max_attempts=1).instruction
  assert math_env.MathEnv(instruction="Solve it.").instruction == "Solve it."


def test_shipped_set_loads_and_the_expert_solves_it():
  env = math_env.MathEnv()
  assert len(env.questions) == 2000
  for seed in random.Random(0).sample(range(100_000), 200):
    question = env.reset(seed)
    assert question == env.questions[seed % 2000].question
    answers, thought = env.expert()
    assert len(answers) == 1 and re.fullmatch(r"\d+", answers[0])
    assert 0 < len(thought) <= 40 and thought.endswith(f"= {answers[0]}")
    obs, reward, done, info = env.step(answers[0])
    assert (obs, reward, done, info["success"]) == ("Correct!", 1.0, True, True)


# --- the generator ------------------------------------------------------------------------------

# Each kind's answer from the question's numbers (in the order they appear), written out here
# independently of the generator.
FORMULAS = {
    "sum": lambda a, b: a + b,
    "difference": lambda a, b: a - b,
    "product": lambda a, b: a * b,
    "quotient": lambda a, b: a // b if a % b == 0 else None,
    "add_product": lambda a, b, c: a * b + c,
    "two_takes": lambda a, b, c: a - b - c,
    "change": lambda a, b, c: c - a * b,
}


def test_generator_is_deterministic():
  assert math_questions.generate(300, seed=3) == math_questions.generate(300, seed=3)
  assert math_questions.generate(300, seed=3) != math_questions.generate(300, seed=4)
  assert math_questions.generate(300, seed=3)[:10] == math_questions.generate(10, seed=3)


def test_shipped_file_is_the_generators_output(tmp_path):
  out = tmp_path / "q.jsonl"
  math_questions.main(["--out", str(out), "--n", "2000", "--seed", "0"])
  with open(math_env.DEFAULT_PATH, encoding="utf-8") as f:
    shipped = f.read()
  assert out.read_text(encoding="utf-8") == shipped
  assert shipped == math_questions.to_jsonl(math_questions.generate(2000, seed=0))


def test_generated_answers_are_right():
  problems = math_questions.generate(2000, seed=0)
  assert len({p["question"] for p in problems}) == 2000
  assert set(p["kind"] for p in problems) == set(FORMULAS)
  for p in problems:
    numbers = [int(n) for n in re.findall(r"\d+", p["question"])]
    answer = FORMULAS[p["kind"]](*numbers)
    assert answer is not None and answer >= 0, p
    assert p["answer"] == str(answer), p
    # The expert's thought ends with the answer, and its arithmetic holds.
    for lhs, rhs in re.findall(r"(\d+ [-+*/] \d+) = (\d+)", p["reasoning"]):
      a, op, b = lhs.split()
      assert FORMULAS[{"+": "sum", "-": "difference", "*": "product", "/": "quotient"}[op]](
          int(a), int(b)
      ) == int(rhs), p
    assert p["reasoning"].endswith(f"= {answer}")


def test_generator_hand_checked():
  # Hand-worked: the formulas above on problems read by eye.
  assert FORMULAS["change"](5, 8, 50) == 10  # 5 mugs at 8 dollars, paid with 50
  assert FORMULAS["add_product"](5, 10, 5) == 55
  assert FORMULAS["two_takes"](46, 3, 22) == 21
  first = math_questions.generate(1, seed=0)[0]
  numbers = [int(n) for n in re.findall(r"\d+", first["question"])]
  assert int(first["answer"]) == FORMULAS[first["kind"]](*numbers)
  with pytest.raises(ValueError):
    math_questions.generate(0)


# --- any answer text --------------------------------------------------------------------------

ANSWERS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["42", " 42 ", "The answer is: 42", "#### 42", "4 2", "42.0", ""]),
)


@hypothesis.settings(max_examples=150)
@hypothesis.given(answers=st.lists(ANSWERS, min_size=1, max_size=4))
def test_any_answer_text_never_raises(tmp_path_factory, answers):
  env = _one_question(tmp_path_factory.mktemp("h"))
  env.reset(0)
  for k, answer in enumerate(answers):
    obs, reward, done, info = env.step(answer)
    assert isinstance(obs, str)
    assert reward in (0.0, 0.5**k)
    assert info["success"] is (reward > 0)
    assert info["attempt"] == k + 1
    if info["success"]:
      assert math_env.normalize(answer) == "42"
    if done:
      assert info["success"] or k + 1 == 3
      break
    assert k + 1 < 3

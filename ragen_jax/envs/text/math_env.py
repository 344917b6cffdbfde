"""RAGEN's MetaMathQA environment (`_5_metamathqa`): one math question, answered with retries.

In a config, a text-environment tag with this class as its entry (options are the keywords of
`MathEnv`):

    envs:
      math:
        entry: ragen_jax.envs.text.math_env:MathEnv
        options: {"max_attempts": 3}      # path unset: the shipped arithmetic set

Rules. reset(seed) asks question `seed % len(questions)` (the observation is its text); the
model answers in free text, one answer a turn. An answer is *right* when its normalised form
equals the reference's. RAGEN's reward: right after k wrong answers pays 1 / 2**k and ends the
episode (1 on the first try, 1/2 on the second, 1/4 on the third); a wrong answer pays 0 and
the model sees "Incorrect. Please think again." until `max_attempts` answers are used, then the
episode ends unsolved ("Incorrect.", success False). RAGEN's own environment has no cap (its
rollout's max_turn ends the episode); set the rollout's max_turns >= max_attempts here.
`info`: `success`, `action_is_valid` and `action_is_effective` (a non-empty normalised answer;
an empty one still uses an attempt, as in RAGEN) and the 1-based `attempt`.

Normalisation (`normalize`), applied to the reference and to the model's answer alike:
  1. GSM8K: if the text contains "####", keep what follows the last one.
  2. MetaMathQA: if it contains "The answer is:" (any case), keep what follows the last one.
     RAGEN extracts the reference with `The answer is: (.*)` (the first occurrence, case and
     the space after the colon required); MetaMathQA's responses end with exactly one such
     line, where both rules agree, and the model may write "the answer is: 42" too.
  3. Lower case, and every whitespace character removed ("3 / 4" == "3/4").
Nothing else is forgiven, as in RAGEN: "42.0", "$42" and "42 apples" are not "42".

Questions. `path=None` loads the shipped set (ragen_jax/assets/math/questions.jsonl, 2000 short
arithmetic word problems with integer answers from `python -m ragen_jax.envs.text.math_questions`),
so the environment runs with no download. Your own set: a JSONL file, one object a line, with
a question and an answer string, e.g.

    --config.envs.math.options.path=/data/metamathqa.jsonl

  * {"question": ..., "answer": ...}: the answer as is (after the normalisation above);
  * MetaMathQA's own fields {"query": ..., "response": ...} are read as question and answer:
    the response's final "The answer is: X" gives the reference X (rule 2);
  * GSM8K's {"question": ..., "answer": "...#### 72"}: the reference is 72 (rule 1);
  * an optional "reasoning" string is the expert's thought (the shipped set has one).
Files are read once per path and shared by every instance (the rollout builds one instance per
episode, possibly from several threads). A missing file, a line that is not JSON, or a line
without question and answer strings raises ValueError naming the file and the line.

`expert()` is the scripted demonstrator of the supervised warm start: the reference answer and
a short thought (the file's "reasoning", else "The answer is X.").
"""

import dataclasses
import os
import re
import threading
from typing import Dict, List, Optional, Tuple

from ragen_jax.config_checks import check_arguments, PositiveInt
from ragen_jax.envs import text
from ragen_jax.envs.text import jsonl

DEFAULT_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "assets",
    "math",
    "questions.jsonl",
)
GSM8K_MARKER = "####"
# RAGEN's MetaMathQA feedback and the answer format (reasoning-gym's bridge words its the same).
INCORRECT_FEEDBACK = "Incorrect. Please think again."
CORRECT_FEEDBACK = "Correct!"
FINAL_INCORRECT = "Incorrect."
DEFAULT_INSTRUCTION = (
    "Solve the problem. Reason inside <think></think>, then give only the final answer inside "
    "<answer></answer>, with no units, words or explanation, e.g. <answer>42</answer>."
)
_ANSWER_IS = re.compile(r"the answer is:", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
_RETRY_SENTENCE = " If an answer is wrong you are told so and may try again ({n} tries in all)."
# Field names tried in order: ours (and GSM8K's), then MetaMathQA's.
_QUESTION_FIELDS = ("question", "query")
_ANSWER_FIELDS = ("answer", "response")


def extract_final(answer: str) -> str:
  """The final-answer part of `answer` (normalisation steps 1 and 2), stripped."""
  answer = answer.rsplit(GSM8K_MARKER, 1)[-1]
  return _ANSWER_IS.split(answer)[-1].strip()


def normalize(answer: str) -> str:
  """The form answers are compared in: the final answer, lower case, no whitespace."""
  return _WHITESPACE.sub("", extract_final(answer).lower())


@dataclasses.dataclass(frozen=True)
class Question:
  """One question; `answer` is the reference's final answer as written, `key` its normal form."""

  question: str
  answer: str
  key: str
  reasoning: str


_CACHE: Dict[str, Tuple[Question, ...]] = {}
_CACHE_LOCK = threading.Lock()  # the rollout may build envs from several threads


def load_questions(path: Optional[str] = None) -> Tuple[Question, ...]:
  """The questions of the JSONL file `path` (None: the shipped set), read once and shared."""
  path = os.path.abspath(DEFAULT_PATH if path is None else os.path.expanduser(path))
  with _CACHE_LOCK:
    if path not in _CACHE:
      _CACHE[path] = _read(path)
    return _CACHE[path]


def clear_cache() -> None:
  """Forgets every loaded file (tests, or a process whose files changed)."""
  with _CACHE_LOCK:
    _CACHE.clear()


def _read(path: str) -> Tuple[Question, ...]:
  questions = tuple(_parse(obj, where) for _, where, obj in jsonl.objects(path, "math questions"))
  if not questions:
    raise ValueError(f"{path}: no questions (one JSON object a line expected)")
  return questions


def _parse(obj: dict, where: str) -> Question:
  question = _field(obj, _QUESTION_FIELDS, where)
  raw_answer = _field(obj, _ANSWER_FIELDS, where)
  reasoning = obj.get("reasoning", "")
  if not isinstance(reasoning, str):
    raise ValueError(f'{where}: "reasoning" must be a string')
  if not question.strip():
    raise ValueError(f"{where}: the question is empty")
  answer = extract_final(raw_answer)
  key = normalize(raw_answer)
  if not key:  # no answer could ever match it
    raise ValueError(f"{where}: the answer {raw_answer[-80:]!r} is empty after normalisation")
  return Question(question=question, answer=answer, key=key, reasoning=reasoning.strip())


def _field(obj: dict, names: Tuple[str, ...], where: str) -> str:
  for name in names:
    if name in obj:
      if not isinstance(obj[name], str):
        raise ValueError(f"{where}: {name!r} must be a string, got {type(obj[name]).__name__}")
      return obj[name]
  raise ValueError(f"{where}: no {' or '.join(map(repr, names))} field (keys: {sorted(obj)})")


def default_instruction(max_attempts: int) -> str:
  """The system-prompt text: solve, think in <think>, answer alone in <answer>; retries."""
  if max_attempts > 1:
    return DEFAULT_INSTRUCTION + _RETRY_SENTENCE.format(n=max_attempts)
  return DEFAULT_INSTRUCTION


class MathEnv(text.TextEnv):
  """One question per episode, answered with up to `max_attempts` tries; see the module doc."""

  action_names = None  # free text: the parsed answer reaches `step` verbatim
  max_actions_per_turn = 1

  def __init__(
      self,
      path: Optional[str] = None,
      max_attempts: PositiveInt = 3,
      instruction: Optional[str] = None,
  ):
    check_arguments(MathEnv, {"max_attempts": max_attempts}, "")
    self.max_attempts = max_attempts
    self.questions = load_questions(path)  # here, so a bad file fails at construction
    self.instruction = (
        default_instruction(self.max_attempts) if instruction is None else instruction
    )
    self.item: Optional[Question] = None
    self._attempts = 0
    self._done = False

  def reset(self, seed: int) -> str:
    self.item = self.questions[int(seed) % len(self.questions)]
    self._attempts = 0
    self._done = False
    return self.item.question

  def step(self, action: str) -> text.StepOutput:
    if self.item is None:
      raise RuntimeError("MathEnv.step called before reset")
    if self._done:
      raise RuntimeError("MathEnv.step called after the episode ended; call reset")
    key = normalize("" if action is None else str(action))
    valid = bool(key)
    right = valid and key == self.item.key
    wrong_before = self._attempts
    self._attempts += 1
    if right:
      observation, reward, done = CORRECT_FEEDBACK, 0.5**wrong_before, True
    else:
      done = self._attempts >= self.max_attempts
      observation, reward = (FINAL_INCORRECT if done else INCORRECT_FEEDBACK), 0.0
    self._done = done
    info = {
        "success": right,
        "action_is_valid": valid,
        "action_is_effective": valid,
        "attempt": self._attempts,
    }
    return observation, reward, done, info

  def expert(self) -> Tuple[Optional[List[str]], str]:
    """This turn's answers and a short thought: the reference; (None, "") once it is over."""
    if self.item is None:
      raise RuntimeError("MathEnv.expert called before reset")
    if self._done:
      return None, ""
    return [self.item.answer], self.item.reasoning or f"The answer is {self.item.answer}."

"""RAGEN's SearchQA: answer a question, searching a corpus first (HotpotQA-style, multi-turn).

    env = envs.make("search", split="val")         # the shipped fictional encyclopedia, BM25
    env.reset(seed=1)      # "Question: Who founded Velrin Optics?\\nAvailable actions: ..."
    env.step("search[Velrin Optics]")              # results, reward 0, not done
    env.step("finish[Lyncor Ostvel]")              # "Your answer: ... Reward: 1.00", done

Options (keywords of `SearchQA`):
  data, val_data   question files (JSONL: "question" with "golden_answers", "answer" or "answers"
                   (a string or a list); optional "searches", the titles the expert looks up);
                   unset: the shipped train / validation questions
  split            "train" reads `data`, "val" reads `val_data` (a config's validation sets
                   val_options.split="val"; RAGEN's validation reads its training file)
  corpus           a JSONL corpus searched in-process with BM25 (ragen_jax.envs.text.retrievers);
                   unset, with no retriever: the shipped encyclopedia
  retriever        "http://host:port" of a retrieval server instead, speaking `retriever_api`
                   ("ragen" or "search_r1"), with `retrieval_timeout_s` and an optional bearer
                   token read from the environment variable `retriever_token_env`
  max_search_results, max_doc_chars, max_total_chars   RAGEN's 5, 800 and 4000
  max_steps        RAGEN's 10: the search (or empty answer) that uses the last step ends the
                   episode unanswered ("Maximum search steps reached...", reward 0)
  f1_threshold, correct_reward, incorrect_reward       RAGEN's 0.3, 1 and 0
  tools            declare the tools `search(query)` and `finish(answer)` (TOOLS): the prompt
                   shows them and a reply may call them (ragen_jax.envs.tools); default off

Actions (RAGEN's, case-sensitive): `search[query]` and `finish[answer]` (the text starts with
"search[" or "finish[" and ends with "]"). Any other non-empty text is a fallback answer: an
answer is extracted (`extract_answer`), scored, the episode ends and `action_is_valid` is False.
Empty text is invalid and ends nothing. A query is cut at MAX_QUERY_CHARS before searching.
A `ToolCall` of TOOLS is the same action as its text form (`search[query]`, `finish[answer]`),
whether or not `tools` is on; another call is invalid.

Reward (`score`, SQuAD's normalisation: lower case, no punctuation, no articles a/an/the,
whitespace collapsed): an exact match with any golden answer pays `correct_reward`; otherwise the
best token F1 pays `correct_reward * F1` when F1 >= f1_threshold, else `incorrect_reward`. When
either side normalises to yes / no / noanswer and they differ, F1 is 0. `success`: exact match or
a positive reward.
"""

import collections
import dataclasses
import os
import re
import string
import threading
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

from ragen_jax.config_checks import check_arguments, FiniteFloat, PositiveFloat, PositiveInt
from ragen_jax.config_checks import OneOf, UnitFloat
from ragen_jax.envs import text
from ragen_jax.envs import tools as tools_lib
from ragen_jax.envs.text import jsonl
from ragen_jax.envs.text import retrievers

ASSETS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets", "search"
)
SHIPPED_CORPUS = os.path.join(ASSETS, "corpus.jsonl")
SHIPPED_DATA = {
    "train": os.path.join(ASSETS, "train.jsonl"),
    "val": os.path.join(ASSETS, "val.jsonl"),
}
SPLITS = ("train", "val")
MAX_QUERY_CHARS = 2000
ACTIONS_LINE = "Available actions: search[<query>], finish[<answer>]"
INVALID = "Invalid action. Use search[<query>] to search or finish[<answer>] to answer."
MAX_STEPS_TEXT = "Maximum search steps reached. Episode ended without an answer."
INSTRUCTION = (
    "Answer the question. The facts are in an encyclopedia you can search: reply "
    "search[<query>] to see the passages that best match the query, and finish[<answer>] to "
    "give your final answer (a short name, year, or yes / no). Search for each entity the "
    "question needs before answering, e.g. <answer>search[Velrin Optics]</answer>, then "
    "<answer>finish[Lyncor Ostvel]</answer>."
)
# The tool form of the two actions: (tool, the argument its text form brackets).
_TOOL_ARGUMENT = {"search": "query", "finish": "answer"}
TOOLS = (
    tools_lib.Tool(
        "search",
        "Search the encyclopedia: returns the passages that best match the query.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    ),
    tools_lib.Tool(
        "finish",
        "Give the final answer (a short name, year, or yes / no); ends the episode.",
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    ),
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_YES_NO = ("yes", "no", "noanswer")


# ------------------------------------------------------------------------------------ reward


def normalize_answer(s: str) -> str:
  """SQuAD's normal form: lower case, punctuation removed, articles removed, spaces collapsed."""
  return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def f1(prediction: str, truth: str) -> float:
  """Token F1 of the normal forms; 0 when a yes / no / noanswer side differs from the other."""
  pred, gold = normalize_answer(prediction), normalize_answer(truth)
  if (pred in _YES_NO or gold in _YES_NO) and pred != gold:
    return 0.0
  pred_tokens, gold_tokens = pred.split(), gold.split()
  same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def score(
    answer: str,
    golden: Sequence[str],
    f1_threshold: float = 0.3,
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> Tuple[float, bool]:
  """(reward, exact match) of `answer` against the golden answers (module doc)."""
  if any(normalize_answer(answer) == normalize_answer(g) for g in golden):
    return correct, True
  best = max((f1(answer, g) for g in golden), default=0.0)
  return (correct * best if best >= f1_threshold else incorrect), False


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
_BOLD = (re.compile(r"\*\*([^*]+)\*\*"), re.compile(r"\*([^*]+)\*"))
_ANSWER_IS = re.compile(r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)", re.IGNORECASE)
_SO = re.compile(r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)", re.IGNORECASE)
_EDGES = re.compile(r"^\W+|\W+$")


def extract_answer(response: str) -> str:
  """RAGEN's fallback answer of free text: \\boxed{}, then bold text, then "the answer is ..."
  or "therefore ...", then the first sentence longer than five characters."""
  response = " ".join(_THINK.sub("", response).split())
  if not response:
    return ""
  boxed = _BOXED.search(response)
  if boxed:
    return boxed.group(1).strip()
  for pattern in _BOLD:
    found = [m.strip() for m in pattern.findall(response)]
    found = [m for m in found if len(m) > 2 and re.search(r"\w", m)]
    if found:
      return found[0]
  for pattern in (_ANSWER_IS, _SO):
    match = pattern.search(response)
    if match:
      answer = _EDGES.sub("", match.group(1).strip())
      if len(answer) > 3:
        return answer
  sentences = [s.strip() for s in re.split(r"[.!?]+", response) if len(s.strip()) > 5]
  return sentences[0] if sentences else response[:100].strip()


def parse_action(action) -> Tuple[str, str]:
  """("search" | "finish" | "fallback" | "invalid", its argument) of one action text or
  `ToolCall`."""
  if isinstance(action, tools_lib.ToolCall):
    if tools_lib.check_call(action, TOOLS):
      return "invalid", ""
    return action.name, action.arguments[_TOOL_ARGUMENT[action.name]]
  action = action.strip() if isinstance(action, str) else ""
  if not action:
    return "invalid", ""
  for kind in ("search", "finish"):
    if action.startswith(kind + "[") and action.endswith("]"):
      return kind, action[len(kind) + 1 : -1]
  return "fallback", action


# -------------------------------------------------------------------------------- questions


@dataclasses.dataclass(frozen=True)
class Question:
  question: str
  golden: Tuple[str, ...]
  searches: Tuple[str, ...]  # the titles a solver looks up, hop by hop (may be empty)


_CACHE: Dict[str, Tuple[Question, ...]] = {}
_CACHE_LOCK = threading.Lock()


def _answers(obj: dict, where: str) -> Tuple[str, ...]:
  for key in ("golden_answers", "answer", "answers"):
    if key in obj:
      value = obj[key]
      values = [value] if isinstance(value, str) else value
      if (
          not isinstance(values, list)
          or not values
          or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values)
      ):
        raise ValueError(f"{where}: {key!r} must be a string or a non-empty list of strings")
      return tuple(str(v) for v in values)
  raise ValueError(f'{where}: no "golden_answers" or "answer" field (keys: {sorted(obj)})')


def _parse(obj: dict, where: str) -> Question:
  question = obj.get("question")
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f'{where}: "question" must be a non-empty string')
  searches = obj.get("searches", [])
  if not isinstance(searches, list) or not all(isinstance(s, str) for s in searches):
    raise ValueError(f'{where}: "searches" must be a list of strings')
  return Question(question.strip(), _answers(obj, where), tuple(searches))


def load_questions(path: str) -> Tuple[Question, ...]:
  """The questions of the JSONL file `path`, read once per process; ValueError names the line."""
  path = os.path.abspath(os.path.expanduser(path))
  with _CACHE_LOCK:
    if path not in _CACHE:
      out = [_parse(obj, where) for _, where, obj in jsonl.objects(path, "SearchQA questions")]
      if not out:
        raise ValueError(f"{path}: no questions (one JSON object a line expected)")
      _CACHE[path] = tuple(out)
    return _CACHE[path]


# ------------------------------------------------------------------------------ environment


class SearchQA(text.TextEnv):
  """One question per episode; search, then finish (module doc)."""

  instruction = INSTRUCTION
  action_names = None  # free text
  max_actions_per_turn = 1

  def __init__(
      self,
      data: str = "",
      val_data: str = "",
      split: Annotated[str, OneOf(SPLITS)] = "train",
      corpus: str = "",
      retriever: str = "",
      retriever_api: Annotated[str, OneOf(retrievers.APIS)] = retrievers.API_RAGEN,
      retrieval_timeout_s: PositiveFloat = 30.0,
      retriever_token_env: str = "",
      max_search_results: PositiveInt = 5,
      max_doc_chars: PositiveInt = 800,
      max_total_chars: PositiveInt = 4000,
      max_steps: PositiveInt = 10,
      f1_threshold: UnitFloat = 0.3,
      correct_reward: FiniteFloat = 1.0,
      incorrect_reward: FiniteFloat = 0.0,
      tools: bool = False,
  ):
    check_arguments(SearchQA, dict(locals()), "")
    if split == "val" and data and not val_data:
      raise ValueError(
          "split='val' with your own data needs val_data=FILE (set it to the training file to "
          "validate on it, as RAGEN does)"
      )
    path = (
        (data or SHIPPED_DATA["train"]) if split == "train" else (val_data or SHIPPED_DATA["val"])
    )
    self.questions = load_questions(path)
    if corpus and retriever:
      raise ValueError("SearchQA takes corpus=FILE or retriever=URL, not both")
    self.retriever = retrievers.make_retriever(
        corpus=corpus or ("" if retriever else SHIPPED_CORPUS),
        url=retriever,
        api=retriever_api,
        timeout_s=retrieval_timeout_s,
        token_env=retriever_token_env,
    )
    self.max_search_results, self.max_steps = max_search_results, max_steps
    self.max_doc_chars, self.max_total_chars = max_doc_chars, max_total_chars
    self.f1_threshold = f1_threshold
    self.correct_reward, self.incorrect_reward = float(correct_reward), float(incorrect_reward)
    self.tools = TOOLS if tools else ()
    self.item: Optional[Question] = None
    self.steps = 0
    self.searches_done = 0
    self.done = False

  def reset(self, seed: int) -> str:
    self.item = self.questions[int(seed) % len(self.questions)]
    self.steps, self.searches_done, self.done = 0, 0, False
    return f"Question: {self.item.question}\n{ACTIONS_LINE}"

  def step(self, action: str) -> text.StepOutput:
    if self.item is None:
      raise RuntimeError("SearchQA.step before reset")
    if self.done:
      raise RuntimeError("SearchQA.step after the episode ended; call reset")
    self.steps += 1
    last = self.steps >= self.max_steps
    kind, argument = parse_action(action)
    info = {"success": False, "action_is_valid": kind in ("search", "finish")}
    info["action_is_effective"] = kind != "invalid"
    if kind == "invalid":
      self.done = last
      return f"{INVALID}\n{ACTIONS_LINE}", 0.0, last, info
    if kind == "search":
      self.searches_done += 1
      self.done = last
      results = self.search(argument)
      tail = MAX_STEPS_TEXT if last else ACTIONS_LINE
      return f"Search results for '{argument}':\n{results}\n\n{tail}", 0.0, last, info
    answer = argument if kind == "finish" else extract_answer(argument)
    reward, exact = score(
        answer, self.item.golden, self.f1_threshold, self.correct_reward, self.incorrect_reward
    )
    info["success"] = exact or reward > 0
    self.done = True
    label = "Your answer" if kind == "finish" else "Your answer (extracted)"
    return f"{label}: {answer}. Reward: {reward:.2f}", reward, True, info

  def search(self, query: str) -> str:
    """The result text of `query` (RAGEN's format and truncation), or the retriever's error."""
    hits, error = self.retriever.search(query[:MAX_QUERY_CHARS], self.max_search_results)
    if error is not None:
      return error
    return retrievers.format_hits(
        hits, self.max_search_results, self.max_doc_chars, self.max_total_chars
    )

  def expert(self) -> Tuple[Optional[List[str]], str]:
    """Searches each hop's title (the question itself when the data lists none), then
    answers the first golden answer; (None, "") once the episode is over."""
    if self.item is None:
      raise RuntimeError("SearchQA.expert before reset")
    if self.done:
      return None, ""
    hops = self.item.searches or (self.item.question,)
    if self.searches_done < len(hops) and self.steps + 1 < self.max_steps:
      hop = hops[self.searches_done]
      return [f"search[{hop}]"], f"I need the passage on {hop}."
    answer = self.item.golden[0]
    return [f"finish[{answer}]"], f"The passages give {answer}."

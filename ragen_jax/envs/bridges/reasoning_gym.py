"""reasoning-gym's procedural tasks as free-text `TextEnv`s, graded by each task's own scorer.

In a ragen_jax config, an env tag names the class as its entry and passes the constructor's
keywords as options:

    envs:
      arithmetic:
        entry: ragen_jax.envs.bridges.reasoning_gym:ReasoningGymEnv
        options: {"dataset": "basic_arithmetic", "max_attempts": 3}

or by hand:

    env = ReasoningGymEnv("basic_arithmetic", max_attempts=3)
    question = env.reset(seed=7)          # entry 7 % size of the dataset, the same every time
    obs, reward, done, info = env.step("42")

One episode asks one question. reset(seed) picks entry `seed % size` of
`reasoning_gym.create_dataset(dataset, size=size, seed=dataset_seed, **config)`; step(answer)
grades the answer text verbatim with `dataset.score_answer(answer=..., entry=...)`.

An answer is *right* when its score is >= 1.0 (reasoning-gym scores lie in [0, 1], and some
scorers give partial credit, e.g. for an answer that merely contains the reference).
  max_attempts == 1: reward = the score (partial credit kept), and the episode ends.
  max_attempts > 1:  RAGEN's MetaMathQA rule. A right answer after k wrong ones pays 1 / 2**k
                     and ends the episode; a wrong one (partial credit included) pays 0 and the
                     model sees "Incorrect. Please think again." until the attempts run out.
`info` holds `success` (score >= 1), `action_is_valid` (a non-blank answer),
`action_is_effective` (the same), the raw `score` and the 1-based `attempt`.

The rollout builds one instance per episode, so datasets are built once per (name, config,
size, dataset_seed) and shared (`get_dataset`); entries are generated on demand by reasoning-gym.
"""

import difflib
import json
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ragen_jax.envs import text
from ragen_jax.envs.text.math_env import CORRECT_FEEDBACK
from ragen_jax.envs.text.math_env import DEFAULT_INSTRUCTION
from ragen_jax.envs.text.math_env import FINAL_INCORRECT
from ragen_jax.envs.text.math_env import INCORRECT_FEEDBACK

RIGHT_SCORE = 1.0
_RETRY_INSTRUCTION = (
    " You have {n} attempts: after a wrong answer you are told so and may answer again."
)

_CACHE: Dict[Tuple[str, str, int, int], Any] = {}
_CACHE_LOCK = threading.Lock()  # the rollout may build envs from several threads


def _import_reasoning_gym():
  try:
    import reasoning_gym
    from reasoning_gym import factory
  except ImportError as e:
    raise ImportError(
        "ReasoningGymEnv needs the reasoning-gym package: pip install reasoning-gym"
    ) from e
  return reasoning_gym, factory


def dataset_names() -> List[str]:
  """The names reasoning-gym's registry knows, sorted."""
  _, factory = _import_reasoning_gym()
  return sorted(factory.DATASETS)


def _config_key(config: Mapping[str, Any]) -> str:
  # Canonical text of the config: equal dicts (any key order, list or tuple) share one dataset.
  # Values JSON cannot write fall back to repr, which at worst builds an extra dataset.
  return json.dumps(config, sort_keys=True, default=repr)


def get_dataset(
    name: str, config: Optional[Mapping[str, Any]] = None, size: int = 10000, seed: int = 0
) -> Any:
  """reasoning-gym's dataset `name`, built once per (name, config, size, seed) and then shared.

  Raises ValueError for an unknown name or a config reasoning-gym rejects.
  """
  reasoning_gym, factory = _import_reasoning_gym()
  config = dict(config or {})
  if name not in factory.DATASETS:
    close = difflib.get_close_matches(name, list(factory.DATASETS), n=3)
    hint = f" Did you mean {close}?" if close else ""
    raise ValueError(
        f"Unknown reasoning_gym dataset {name!r}.{hint} "
        "Known names: ragen_jax.envs.bridges.reasoning_gym.dataset_names() "
        f"({len(factory.DATASETS)} of them)."
    )
  clash = sorted({"size", "seed"} & set(config))
  if clash:
    raise ValueError(
        f"config for {name!r} sets {clash}; pass size= and dataset_seed= to ReasoningGymEnv."
    )
  key = (name, _config_key(config), int(size), int(seed))
  with _CACHE_LOCK:
    if key not in _CACHE:
      try:
        _CACHE[key] = reasoning_gym.create_dataset(name, size=int(size), seed=int(seed), **config)
      except (TypeError, AssertionError) as e:
        # Unknown config keys (TypeError) and failed `validate` checks (assert) are config
        # mistakes; say which dataset and config they came from.
        raise ValueError(f"reasoning_gym rejected config {config} for {name!r}: {e}") from e
    return _CACHE[key]


def clear_dataset_cache() -> None:
  """Forgets every shared dataset (tests, or a process that switches tasks)."""
  with _CACHE_LOCK:
    _CACHE.clear()


class ReasoningGymEnv(text.TextEnv):
  """One reasoning-gym question per episode, answered in free text; see the module doc."""

  action_names = None  # free text: the parsed answer reaches `step` verbatim
  max_actions_per_turn = 1

  def __init__(
      self,
      dataset: str,
      max_attempts: int = 1,
      config: Optional[Dict[str, Any]] = None,
      size: int = 10000,
      dataset_seed: int = 0,
      instruction: Optional[str] = None,
  ):
    if int(max_attempts) < 1:
      raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if int(size) < 1:
      raise ValueError(f"size must be >= 1, got {size}")
    self.dataset_name = dataset
    self.max_attempts = int(max_attempts)
    self.size = int(size)
    # Built (or fetched from the cache) here, so a bad name or config fails at construction.
    self.dataset = get_dataset(dataset, config, self.size, dataset_seed)
    if instruction is None:
      instruction = DEFAULT_INSTRUCTION
      if self.max_attempts > 1:
        instruction += _RETRY_INSTRUCTION.format(n=self.max_attempts)
    self.instruction = instruction
    self.entry: Optional[Dict[str, Any]] = None
    self._attempts = 0
    self._done = False

  def reset(self, seed: int) -> str:
    self.entry = self.dataset[int(seed) % self.size]
    self._attempts = 0
    self._done = False
    return self.entry["question"]

  def step(self, action: str) -> text.StepOutput:
    if self.entry is None:
      raise RuntimeError("ReasoningGymEnv.step called before reset")
    if self._done:
      raise RuntimeError("ReasoningGymEnv.step called after the episode ended; call reset")
    try:
      score = float(self.dataset.score_answer(answer=action, entry=self.entry))
    except Exception as e:
      # Not swallowed: the rollout reports exceptions from step as an environment error.
      raise RuntimeError(
          f"reasoning_gym {self.dataset_name!r} scorer failed on answer {action!r:.200}: {e!r}"
      ) from e
    wrong_before = self._attempts
    self._attempts += 1
    right = score >= RIGHT_SCORE
    if self.max_attempts == 1:
      reward, done = score, True
    elif right:
      reward, done = 0.5**wrong_before, True
    else:
      reward, done = 0.0, self._attempts >= self.max_attempts
    self._done = done
    if right:
      observation = CORRECT_FEEDBACK
    else:
      observation = FINAL_INCORRECT if done else INCORRECT_FEEDBACK
    valid = isinstance(action, str) and bool(action.strip())
    info = {
        "success": right,
        "action_is_valid": valid,
        "action_is_effective": valid,
        "score": score,
        "attempt": self._attempts,
    }
    return observation, reward, done, info

"""ReasoningGymEnv against reasoning-gym itself, on two cheap deterministic tasks."""

import sys

import hypothesis
from hypothesis import strategies as st
import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

# pylint: disable=wrong-import-position
from ragen_jax.envs.bridges import reasoning_gym as rga
from ragen_jax.envs import text

# basic_arithmetic grades with reasoning-gym's default scorer (exact match, else partial credit
# for an answer containing the reference); chain_sum with a numeric one.
TASKS = ("basic_arithmetic", "chain_sum")
SIZE = 10000  # the adapter's default


def _reference(task, size=SIZE, seed=0, **config):
  """An independent copy of the dataset the adapter should use, built by reasoning-gym."""
  return reasoning_gym.create_dataset(task, size=size, seed=seed, **config)


def _wrong(answer):
  return str(int(float(answer)) + 1)


@pytest.fixture(autouse=True)
def _fresh_cache():
  rga.clear_dataset_cache()
  yield
  rga.clear_dataset_cache()


@pytest.mark.parametrize("task", TASKS)
def test_question_is_the_dataset_entry(task):
  ref = _reference(task)
  env = rga.ReasoningGymEnv(task)
  for seed in (0, 1, 7, 12345, SIZE + 3):
    assert env.reset(seed) == ref[seed % SIZE]["question"]
  assert env.reset(SIZE + 3) == env.reset(3)
  # Another instance, same seed: same question (an env group shares its seed).
  assert rga.ReasoningGymEnv(task).reset(12345) == env.reset(12345)
  questions = {env.reset(seed) for seed in range(20)}
  assert len(questions) >= 15  # generally different


def test_config_size_and_dataset_seed_reach_reasoning_gym():
  config = {"min_terms": 2, "max_terms": 3, "max_digits": 2}
  ref = _reference("chain_sum", size=50, seed=5, **config)
  env = rga.ReasoningGymEnv("chain_sum", config=config, size=50, dataset_seed=5)
  for seed in (0, 4, 49, 50, 123):
    assert env.reset(seed) == ref[seed % 50]["question"]
  other = rga.ReasoningGymEnv("chain_sum", dataset_seed=6).reset(0)
  assert other == _reference("chain_sum", seed=6)[0]["question"]
  assert other != rga.ReasoningGymEnv("chain_sum").reset(0)


def test_contract_attributes():
  env = rga.ReasoningGymEnv("chain_sum")
  assert isinstance(env, text.TextEnv)
  assert env.action_names is None and env.max_actions_per_turn == 1
  assert "<answer></answer>" in env.instruction
  assert "3 attempts" in rga.ReasoningGymEnv("chain_sum", max_attempts=3).instruction
  assert rga.ReasoningGymEnv("chain_sum", instruction="Add.").instruction == "Add."
  env.close()


@pytest.mark.parametrize("task", TASKS)
def test_reference_answer_wins(task):
  ref = _reference(task)
  env = rga.ReasoningGymEnv(task)
  env.reset(11)
  obs, reward, done, info = env.step(ref[11]["answer"])
  assert (obs, reward, done) == (rga.CORRECT_FEEDBACK, 1.0, True)
  assert info["success"] and info["action_is_valid"] and info["score"] == 1.0


@pytest.mark.parametrize("task", TASKS)
def test_wrong_answers_score_what_the_scorer_gives(task):
  ref = _reference(task)
  entry = ref[11]
  answer = entry["answer"]
  for wrong in (_wrong(answer), "no idea", f"{answer}!!", f"x = {answer}", ""):
    expected = ref.score_answer(answer=wrong, entry=entry)
    env = rga.ReasoningGymEnv(task)
    env.reset(11)
    _, reward, done, info = env.step(wrong)
    assert reward == expected == info["score"]
    assert done
    assert info["success"] == (expected >= 1.0)
    assert info["action_is_valid"] == bool(wrong)
  # The default scorer's partial credit shows up as the single-turn reward.
  if task == "basic_arithmetic":
    env = rga.ReasoningGymEnv(task)
    env.reset(11)
    _, reward, _, info = env.step(f"x = {answer}")
    assert 0.0 < reward < 1.0 and not info["success"]


@pytest.mark.parametrize("wrong_first, expected", [(0, 1.0), (1, 0.5), (2, 0.25)])
def test_multi_turn_halves_the_reward_per_wrong_answer(wrong_first, expected):
  answer = _reference("chain_sum")[3]["answer"]
  env = rga.ReasoningGymEnv("chain_sum", max_attempts=3)
  env.reset(3)
  for attempt in range(1, wrong_first + 1):
    obs, reward, done, info = env.step(_wrong(answer))
    assert (obs, reward, done) == ("Incorrect. Please think again.", 0.0, False)
    assert not info["success"] and info["attempt"] == attempt
  obs, reward, done, info = env.step(answer)
  assert (obs, reward, done) == (rga.CORRECT_FEEDBACK, expected, True)
  assert info["success"] and info["attempt"] == wrong_first + 1
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step(answer)
  # reset starts a fresh episode with all attempts back.
  env.reset(3)
  assert env.step(answer)[1] == 1.0


def test_multi_turn_runs_out_of_attempts():
  answer = _reference("chain_sum")[3]["answer"]
  env = rga.ReasoningGymEnv("chain_sum", max_attempts=2)
  env.reset(3)
  assert env.step("1")[2] is False
  obs, reward, done, info = env.step("2")
  assert done and reward == 0.0 and not info["success"] and obs == rga.FINAL_INCORRECT
  with pytest.raises(RuntimeError):
    env.step(answer)


def test_multi_turn_partial_credit_is_wrong():
  entry = _reference("basic_arithmetic")[5]
  padded = f" {entry['answer']} "
  env = rga.ReasoningGymEnv("basic_arithmetic", max_attempts=3)
  env.reset(5)
  obs, reward, done, info = env.step(padded)
  assert 0.0 < info["score"] < 1.0
  assert (obs, reward, done, info["success"]) == (rga.INCORRECT_FEEDBACK, 0.0, False, False)
  assert env.step(entry["answer"])[1] == 0.5


def test_answer_reaches_the_scorer_verbatim(monkeypatch):
  seen = []
  dataset = rga.get_dataset("chain_sum")  # the instance every env of these options shares
  real = dataset.score_answer

  def spy(answer, entry):
    seen.append((answer, entry))
    return real(answer=answer, entry=entry)

  monkeypatch.setattr(dataset, "score_answer", spy)
  env = rga.ReasoningGymEnv("chain_sum")
  env.reset(2)
  odd = "  \t 4 2\u00a0</answer>?!\n"
  env.step(odd)
  assert seen == [(odd, _reference("chain_sum")[2])]
  assert seen[0][0] is odd


def test_scorer_errors_are_reported(monkeypatch):
  def broken(answer, entry):
    raise KeyError("metadata")

  dataset = rga.get_dataset("chain_sum")
  monkeypatch.setattr(dataset, "score_answer", broken)
  env = rga.ReasoningGymEnv("chain_sum")
  env.reset(0)
  with pytest.raises(RuntimeError, match="'chain_sum' scorer failed") as err:
    env.step("1")
  assert isinstance(err.value.__cause__, KeyError)


def test_bad_names_and_options():
  with pytest.raises(ValueError, match="no_such_task"):
    rga.ReasoningGymEnv("no_such_task")
  with pytest.raises(ValueError, match="chain_sum"):  # close-match hint
    rga.ReasoningGymEnv("chain_sums")
  with pytest.raises(ValueError, match="bogus"):
    rga.ReasoningGymEnv("chain_sum", config={"bogus": 1})
  with pytest.raises(ValueError, match="max_terms"):
    rga.ReasoningGymEnv("chain_sum", config={"min_terms": 5, "max_terms": 2})
  with pytest.raises(ValueError, match="dataset_seed"):
    rga.ReasoningGymEnv("chain_sum", config={"seed": 3})
  with pytest.raises(ValueError, match="max_attempts"):
    rga.ReasoningGymEnv("chain_sum", max_attempts=0)
  with pytest.raises(RuntimeError, match="before reset"):
    rga.ReasoningGymEnv("chain_sum").step("1")
  assert set(TASKS) <= set(rga.dataset_names())


def test_missing_package_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
  with pytest.raises(ImportError, match="pip install reasoning-gym"):
    rga.ReasoningGymEnv("chain_sum")


def test_many_instances_share_one_dataset(monkeypatch):
  builds = []
  real = reasoning_gym.create_dataset

  def counting(name, **kwargs):
    builds.append((name, kwargs))
    return real(name, **kwargs)

  monkeypatch.setattr(reasoning_gym, "create_dataset", counting)
  options = {"dataset": "basic_arithmetic", "max_attempts": 3, "config": {"max_terms": 3}}
  envs = [rga.ReasoningGymEnv(**options) for _ in range(128)]
  assert len(builds) == 1
  assert all(env.dataset is envs[0].dataset for env in envs)
  # An equal config spelled differently is the same dataset; another config is another one.
  rga.ReasoningGymEnv("basic_arithmetic", config={"max_terms": 3, **{}}, max_attempts=1)
  assert len(builds) == 1
  rga.ReasoningGymEnv("basic_arithmetic", config={"max_terms": 4})
  rga.ReasoningGymEnv("basic_arithmetic", config={"max_terms": 3}, dataset_seed=1)
  assert len(builds) == 3


_REFERENCES = {}


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(task=st.sampled_from(TASKS), seed=st.integers(0, 2**63 - 1))
def test_property_reset_is_deterministic_and_the_answer_scores_one(task, seed):
  if task not in _REFERENCES:
    _REFERENCES[task] = _reference(task)
  entry = _REFERENCES[task][seed % SIZE]
  env, twin = rga.ReasoningGymEnv(task), rga.ReasoningGymEnv(task)
  question = env.reset(seed)
  assert question == twin.reset(seed) == env.reset(seed) == entry["question"]
  _, reward, done, info = env.step(entry["answer"])
  assert reward == 1.0 and done and info["success"]

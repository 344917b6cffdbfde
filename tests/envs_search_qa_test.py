"""SearchQA (ragen_jax.envs.text.search_qa): reward, actions, BM25, the shipped encyclopedia."""

import dataclasses
import json
import os

import bm25s
import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.envs.host.pool import HostPool
from ragen_jax.envs.text import encyclopedia
from ragen_jax.envs.text import retrievers
from ragen_jax.envs.text import search_qa
from ragen_jax.envs.text.search_qa import SearchQA
from ragen_jax.warm_start import demos

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(name="env", scope="module")
def _env():
  return SearchQA()


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


# Reward: SQuAD's normalisation and F1, worked by hand.


@pytest.mark.parametrize(
    "answer, golden, reward, exact",
    [
        ("The  Eiffel Tower!", ["eiffel tower"], 1.0, True),  # case, article, punctuation
        ("Eiffel-Tower", ["eiffel tower"], 0.0, False),  # "-" is removed: one token "eiffeltower"
        ("an apple", ["Apple"], 1.0, True),
        ("Paris", ["London", "paris."], 1.0, True),  # any golden answer
        # "new york city" vs "new york": P = 2/3, R = 1, F1 = 0.8
        ("New York City", ["New York"], 0.8, False),
        # 1 of 6 tokens vs 1 of 1: P = 1/6, R = 1, F1 = 2/7 = 0.2857 < 0.3
        ("york is a big old town there", ["York"], 0.0, False),
        # 1 of 5 vs 1 of 1: P = 1/5, R = 1, F1 = 1/3 >= 0.3 (the threshold's edge)
        ("york is big old town", ["York"], 1 / 3, False),
        ("yes", ["no"], 0.0, False),  # a yes/no mismatch scores 0
        ("yes it is", ["yes"], 0.0, False),  # "yes it is" is not "yes": F1 forced to 0
        ("no answer", ["Brelsa"], 0.0, False),
        ("", ["Brelsa"], 0.0, False),
    ],
)
def test_the_reward_follows_squad(answer, golden, reward, exact):
  got, got_exact = search_qa.score(answer, golden)
  assert got == pytest.approx(reward) and got_exact == exact


def test_normalize_answer_by_hand():
  assert search_qa.normalize_answer("  The Quick, brown  FOX. ") == "quick brown fox"
  assert search_qa.normalize_answer("theatre") == "theatre"  # "the" only as a word


def test_rewards_are_configurable():
  assert search_qa.score("New York City", ["New York"], 0.9) == (0.0, False)
  assert search_qa.score("x", ["x"], correct=2.0) == (2.0, True)
  assert search_qa.score("q", ["x"], incorrect=-1.0) == (-1.0, False)


# Actions.


@pytest.mark.parametrize(
    "action, parsed",
    [
        ("search[Velrin Optics]", ("search", "Velrin Optics")),
        ("  finish[Lyncor Ostvel] ", ("finish", "Lyncor Ostvel")),
        ("search[a [nested] query]", ("search", "a [nested] query")),
        ("Search[x]", ("fallback", "Search[x]")),  # RAGEN's match is case-sensitive
        ("search[x", ("fallback", "search[x")),
        ("", ("invalid", "")),
        ("   \n", ("invalid", "")),
    ],
)
def test_parse_action(action, parsed):
  assert search_qa.parse_action(action) == parsed


@pytest.mark.parametrize(
    "text, answer",
    [
        ("<think>hmm</think> I think \\boxed{Brelsa} is it", "Brelsa"),
        ("It must be **Kesh Mills** surely", "Kesh Mills"),
        ("After reading, the answer is: Talin Morvay. Done", "Talin Morvay"),
        ("Reading it twice. Therefore Brelsa", "Brelsa"),
        ("Brelsa on the coast. Other words", "Brelsa on the coast"),
    ],
)
def test_the_fallback_extracts_an_answer(text, answer):
  assert search_qa.extract_answer(text) == answer


def test_an_episode_searches_then_finishes(env):
  observation = env.reset(0)
  question = env.item
  assert observation == f"Question: {question.question}\n{search_qa.ACTIONS_LINE}"
  observation, reward, done, info = env.step(f"search[{question.searches[0]}]")
  assert observation.startswith(f"Search results for '{question.searches[0]}':\n[Document 1]")
  assert observation.endswith(search_qa.ACTIONS_LINE) and reward == 0.0 and not done
  assert info == {"success": False, "action_is_valid": True, "action_is_effective": True}
  observation, reward, done, info = env.step(f"finish[{question.golden[0]}]")
  assert observation == f"Your answer: {question.golden[0]}. Reward: 1.00"
  assert (reward, done, info["success"]) == (1.0, True, True)
  with pytest.raises(RuntimeError):
    env.step("finish[again]")


def test_free_text_is_a_fallback_answer_and_empty_text_is_invalid(env):
  env.reset(0)
  golden = env.item.golden[0]
  observation, reward, done, info = env.step("")
  assert observation.startswith(search_qa.INVALID) and not done and reward == 0.0
  assert not info["action_is_valid"] and not info["action_is_effective"]
  observation, reward, done, info = env.step(f"The answer is {golden}")
  assert observation == f"Your answer (extracted): {golden}. Reward: 1.00"
  assert done and reward == 1.0 and info["success"] and not info["action_is_valid"]


def test_the_step_limit_ends_the_episode_unanswered():
  env = SearchQA(max_steps=3)
  env.reset(1)
  assert not env.step("search[Brelsa]")[2] and not env.step("")[2]
  observation, reward, done, _ = env.step("search[Brelsa]")
  assert done and reward == 0.0 and observation.endswith(search_qa.MAX_STEPS_TEXT)
  assert env.expert() == (None, "")


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.lists(
        st.one_of(
            st.text(max_size=300),
            st.builds(lambda s: f"search[{s}]", st.text(max_size=200)),
            st.builds(lambda s: f"finish[{s}]", st.text(max_size=200)),
            st.sampled_from(["**", "\\boxed{", "search[]", "finish[]", "<think>", "* *"]),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_hostile_text_never_crashes(actions):
  env = SearchQA(max_steps=3)
  env.reset(5)
  for action in actions:
    observation, reward, done, info = env.step(action)
    assert isinstance(observation, str) and isinstance(reward, float)
    assert 0.0 <= reward <= 1.0 and isinstance(info["success"], bool)
    if done:
      break


def test_results_are_cut_at_800_characters_each_and_4000_in_all():
  hits = [retrievers.Hit(str(i), "x" * 1000, 1.0) for i in range(6)]
  text = retrievers.format_hits(hits, 5, 800, 4000)
  assert len(text) == 4003 and text.endswith("...")
  one = retrievers.format_hits(hits[:1], 5, 800, 4000)
  assert one == "[Document 1] (ID: 0, Score: 1.000)\n" + "x" * 800 + "..."
  assert retrievers.format_hits([], 5, 800, 4000).startswith("No relevant documents")
  assert len(retrievers.format_hits(hits, 2, 800, 4000).split("[Document")) == 3


# BM25 against bm25s, the independent reference.


def test_bm25_scores_equal_bm25s_on_the_shipped_corpus():
  index = retrievers.bm25_index(search_qa.SHIPPED_CORPUS)
  tokens = [retrievers.tokenize(p.contents) for p in index.passages]
  reference = bm25s.BM25()  # Lucene's variant, k1 = 1.5, b = 0.75
  reference.index(tokens, show_progress=False)
  for query in ("Velrin Optics", "founded by the painter", "Brelsa mills company 1885", "zzz"):
    expected = reference.get_scores(retrievers.tokenize(query))
    np.testing.assert_allclose(index.scores(query), expected, rtol=1e-5, atol=1e-6)


def test_bm25_by_hand():
  # Two passages of 2 tokens each (the empty title adds none): "alpha beta", "beta gamma".
  index = retrievers.Bm25(
      [retrievers.Passage("0", "", '""\nalpha beta'), retrievers.Passage("1", "", '""\nbeta gamma')]
  )
  idf_alpha = np.log(1 + (2 - 1 + 0.5) / (1 + 0.5))  # ln 2
  # Both passages have 2 tokens = the mean: tf / (tf + k1) = 1 / 2.5
  np.testing.assert_allclose(index.scores("alpha"), [idf_alpha / 2.5, 0.0])
  hits, error = index.search("alpha beta", 5)
  assert error is None and [h.id for h in hits] == ["0", "1"]


def test_every_entity_is_the_first_hit_for_its_name():
  index = retrievers.bm25_index(search_qa.SHIPPED_CORPUS)
  for passage in index.passages:
    hits, _ = index.search(passage.title, 5)
    assert hits[0].id == passage.id, passage.title


# Corpora and question files.


@pytest.mark.parametrize(
    "lines, message",
    [
        ([], "no passages"),
        (['{"id": 1, "contents": "\\"T\\"\\ntext"}', "not json"], "line 2: not JSON"),
        (['{"title": "T"}'], 'line 1: expected {"id", "contents"} or {"title", "text"}'),
        (["[1, 2]"], "line 1: expected a JSON object"),
    ],
)
def test_a_bad_corpus_names_the_file_and_line(tmp_path, lines, message):
  path = _write(tmp_path / "corpus.jsonl", lines)
  with pytest.raises(ValueError, match="corpus.jsonl") as caught:
    SearchQA(corpus=path)
  assert message in str(caught.value)


def test_both_corpus_forms_and_both_answer_fields(tmp_path):
  corpus = _write(
      tmp_path / "c.jsonl",
      [
          json.dumps({"id": "a", "contents": '"Kesh"\nKesh is a city of Morvia.'}),
          json.dumps({"title": "Morvia", "text": "Morvia is a land."}),
      ],
  )
  data = _write(
      tmp_path / "q.jsonl",
      [
          json.dumps({"question": "Where is Kesh?", "answer": "Morvia"}),
          json.dumps({"question": "What is Morvia?", "golden_answers": ["a land", "land"]}),
      ],
  )
  env = envs.make("search", corpus=corpus, data=data)
  assert env.reset(0).startswith("Question: Where is Kesh?")
  observation, *_ = env.step("search[Kesh]")
  assert "(ID: a, Score:" in observation and '"Kesh"\nKesh is a city of Morvia.' in observation
  assert "(ID: 2, Score:" not in observation  # "Morvia" matches the second passage too...
  assert env.step("search[Morvia land]")[0].count("[Document") == 2  # ...here it shows, id 2
  assert env.step("finish[Morvia]")[1] == 1.0
  env.reset(1)
  assert env.instance.expert()[0] == ["search[What is Morvia?]"]  # no hops listed


def test_bad_question_files_and_splits(tmp_path):
  bad = _write(tmp_path / "q.jsonl", ['{"question": "Q?", "golden_answers": []}'])
  with pytest.raises(ValueError, match="q.jsonl, line 1"):
    SearchQA(data=bad)
  good = _write(tmp_path / "g.jsonl", ['{"question": "Q?", "answer": "A"}'])
  with pytest.raises(ValueError, match="val_data"):
    SearchQA(data=good, split="val")
  with pytest.raises(ValueError, match="split"):
    SearchQA(split="test")
  with pytest.raises(ValueError, match="retriever_api"):
    SearchQA(retriever_api="elastic")
  with pytest.raises(ValueError, match="not both"):
    SearchQA(corpus=good, retriever="http://127.0.0.1:1")
  with pytest.raises(ValueError, match="max_steps"):
    envs.make("search", max_steps=0)


# The shipped encyclopedia.


def test_validation_reads_its_own_split():
  train = {q.question for q in SearchQA().questions}
  val = SearchQA(split="val").questions
  assert len(val) == encyclopedia.QUESTIONS["val"] and not train & {q.question for q in val}


def test_the_shipped_files_are_the_generator_output():
  for name, records in encyclopedia.generate(0).items():
    with open(os.path.join(search_qa.ASSETS, f"{name}.jsonl"), encoding="utf-8") as f:
      assert f.read() == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
  assert encyclopedia.generate(1)["train"] != encyclopedia.generate(0)["train"]


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_expert_solves_every_shipped_question(split):
  env = SearchQA(split=split)
  kinds = {"one_hop": 0, "bridge": 0, "comparison": 0}
  with open(search_qa.SHIPPED_DATA[split], encoding="utf-8") as f:
    for line in f:
      kinds[json.loads(line)["kind"]] += 1
  assert all(kinds.values()), kinds
  for seed in range(len(env.questions)):
    env.reset(seed)
    searches = []
    while True:
      answers, _ = env.expert()
      observation, reward, done, _ = env.step(answers[0])
      if not done:
        title = answers[0][len("search[") : -1]
        assert observation.split("\n")[2] == f'"{title}"'  # the hop's passage comes first
        searches.append(title)
      else:
        break
    assert reward == 1.0 and tuple(searches) == env.item.searches


def test_make_plays_by_hand():
  env = envs.make("search")
  assert env.reset(3).startswith("Question: ")
  answers, _ = env.instance.expert()
  assert env.step(answers[0])[2] is False


def test_episodes_run_in_the_process_pool():
  # Worker processes build their own index of the shipped corpus; the expert's plans come back.
  env = envs.make("search", split="val")
  reference = SearchQA(split="val")
  pool = HostPool(env.bound(), mode="process", workers=1, step_timeout_s=120)
  try:
    starts = pool.reset([4, 5])
    assert [s.observation for s in starts] == [reference.reset(4), SearchQA(split="val").reset(5)]
    plans = pool.expert([0, 1])
    outcome = pool.step({0: list(plans[0].answers)})[0]
    assert outcome.observation == reference.step(plans[0].answers[0])[0] and outcome.valid
  finally:
    pool.close()


def test_the_experts_episodes_fit_the_configs_context():
  # configs/search_ppo.py's rollout sizes (1024 tokens, the best passage a search): the warm
  # start's demonstrations must end in answers, not in a truncated context.
  exp = schema.from_config(cli.load_config_file(os.path.join(ROOT, "configs", "search_ppo.py")))
  spec = exp.envs[0]
  config = dataclasses.replace(spec.rollout_config(exp.rollout, validation=True), env_groups=12)
  engine = rollout.Rollout(spec.make(validation=True), tokenizers.load("sentencepiece"), config)
  try:
    policy = demos.expert_policy(engine.env, config, random_prob=0.0, seed=0)
    result = engine.run_scripted(policy, jax.random.key(0), 0)
  finally:
    engine.close()
  assert result.summary["context_truncated"] == 0.0 and result.summary["success"] == 1.0

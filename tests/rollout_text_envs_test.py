"""Text environments in the rollout: free-text and vocabulary answers, faults that end one
episode only, the pure-JAX prompts unchanged, and a host environment equal to the JAX path.

Dimension legend: B episodes, T tokens.
"""

import json
import logging
import math
import os
import time

import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.envs.serve import server as env_server
from ragen_jax.warm_start import demos

from examples import guess_number

TOK = tokenizers.load("sentencepiece")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def config(**overrides):
  values = dict(
      env_groups=2,
      group_size=2,
      max_turns=3,
      max_actions_per_turn=2,
      max_actions_per_traj=10,
      max_new_tokens=48,
      max_context=1024,
      max_turn_tokens=256,
  )
  values.update(overrides)
  return rollout.RolloutConfig(**values)


def answer(text):
  """A scripted policy replying `text` (or text(state, episode)) as the answer."""
  return (
      lambda state, ep: f"ok</think><answer>{text(state, ep) if callable(text) else text}</answer>"
  )


class Recorder(envs.TextEnv):
  """Free text; records every action it receives (class-level, per seed)."""

  seen = {}

  def __init__(self, per_turn=None):
    self.max_actions_per_turn = per_turn

  def reset(self, seed):
    self.seed = seed
    Recorder.seen.setdefault(seed, [])
    return f"seed {seed}"

  def step(self, action):
    Recorder.seen[self.seed].append(action)
    return f"got {len(Recorder.seen[self.seed])}", 0.5, False, {"success": action == "win"}


class Words(envs.TextEnv):
  """A vocabulary environment that records the canonical names it receives."""

  instruction = "Say words."
  action_names = ("Alpha", "Beta")
  received = []

  def reset(self, seed):
    return "start"

  def step(self, action):
    Words.received.append(action)
    return f"after {action}", 1.0, False, {"action_is_effective": action == "Alpha"}


class Faulty(envs.TextEnv):
  """Fails in the way its options say, for the episodes of one group (seed 101)."""

  def __init__(self, fault="raise_step", hang_s=30.0):
    self.fault, self.hang_s = fault, hang_s

  def reset(self, seed):
    self.bad = seed == 101
    if self.bad and self.fault == "raise_reset":
      raise KeyError("no level for this seed")
    return "ready"

  def step(self, action):
    if self.bad:
      if self.fault == "raise_step":
        raise ZeroDivisionError("division by zero in the environment")
      if self.fault == "hang":
        time.sleep(self.hang_s)
      if self.fault == "bad_observation":
        return None, 1.0, False, {}
      if self.fault == "nan_reward":
        return "ready", math.nan, False, {}
    return "ready", 1.0, False, {}


def play(env, cfg=None, policy="7", seed=100):
  engine = rollout.Rollout(env, TOK, cfg or config())
  try:
    return engine.run_scripted(answer(policy), jax.random.key(0), seed=seed)
  finally:
    engine.close()


@pytest.mark.parametrize(
    "per_turn, reply, expected",
    [
        (None, "  x = 3 || y = 4  ", ["x = 3 || y = 4"]),  # one answer a turn: the whole text
        (2, " x = 3 || y = 4 || z ", ["x = 3", "y = 4"]),  # several: split, at most per_turn
        (None, " Ünïcode <b>&amp;</b> 'quotes' ", None),  # as its tokens decode
    ],
)
def test_free_text_answers_reach_step_verbatim(per_turn, reply, expected):
  Recorder.seen.clear()
  env = envs.registry.HostEnv("recorder", Recorder, (("per_turn", per_turn),))
  result = play(env, config(max_turns=2), policy=reply)
  if expected is None:  # the tiny tokenizer may not spell every character: what it decodes to
    expected = [TOK.decode(TOK.encode(f"<answer>{reply}</answer>"))[8:-9].strip()]
  # Two episodes per seed (a group), two turns each.
  assert sorted(Recorder.seen) == [100, 101]
  assert all(actions == expected * 4 for actions in Recorder.seen.values())
  assert result.summary["action_is_valid"] == 1.0 and result.summary["format_penalty"] == 0.0
  # No action list in the system prompt of a free-text environment.
  assert "Your available actions" not in result.episodes[0].messages[0]["content"]


def test_vocabulary_answers_are_matched_to_canonical_names():
  Words.received.clear()
  env = envs.registry.HostEnv("words", Words)
  result = play(env, config(max_turns=1), policy="alpha || BETA")
  assert Words.received == ["Alpha", "Beta"] * 4
  assert "Your available actions are:\nAlpha, Beta" in result.episodes[0].messages[0]["content"]
  assert result.metrics["action_is_effective"].tolist() == [0.5] * 4
  Words.received.clear()
  result = play(env, config(max_turns=1), policy="alpha || gamma")  # an unknown word
  assert Words.received == ["Alpha"] * 4
  np.testing.assert_allclose(result.metrics["format_penalty"], [-0.1] * 4)
  assert result.metrics["action_is_valid"].tolist() == [0.0] * 4


@pytest.mark.parametrize(
    "fault", ["raise_reset", "raise_step", "hang", "bad_observation", "nan_reward"]
)
def test_a_faulty_environment_ends_its_episodes_only(fault, caplog):
  clean = play(envs.registry.HostEnv("faulty", Faulty, (("fault", "none"),)))
  env = envs.registry.HostEnv("faulty", Faulty, (("fault", fault),), step_timeout_s=0.5)
  with caplog.at_level(logging.WARNING):
    tic = time.perf_counter()
    result = play(env)
    assert time.perf_counter() - tic < 20  # the hung step was abandoned, not awaited
  # Group 1 (seed 101, episodes 2 and 3) failed; group 0 played as in the clean run.
  assert result.metrics["env_error"].tolist() == [0.0, 0.0, 1.0, 1.0]
  assert [e.to_json() for e in result.episodes[:2]] == [e.to_json() for e in clean.episodes[:2]]
  for b in (2, 3):
    assert result.episodes[b].env_error
    assert result.batch.loss_mask_BxT[b].sum() == 0  # trains nothing
    assert result.batch.token_rewards_BxT[b].sum() == 0
    assert result.batch.attention_mask_BxT[b].sum() >= 1
  np.testing.assert_array_equal(result.batch.scores_B[2:], [0.0, 0.0])  # a wholly failed group
  kind = {"raise_reset": "raised", "raise_step": "raised", "hang": "timeout"}.get(fault, fault)
  kind = {"nan_reward": "bad_reward"}.get(kind, kind)
  assert result.episodes[2].env_error.startswith(kind)
  logged = [r for r in caplog.records if "failed" in r.getMessage()]
  assert len(logged) == 1 and "seed 101" in logged[0].getMessage()  # once per kind
  if fault.startswith("raise"):
    assert "Traceback" in logged[0].getMessage()


def test_a_failed_episode_takes_its_groups_mean_score():
  env = envs.registry.HostEnv("faulty", Faulty, (("fault", "raise_step"),))
  cfg = config(env_groups=1, group_size=4, max_turns=2)

  class Mixed(Faulty):

    def reset(self, seed):
      self.bad = False
      return "ready"

  # Episode 3 of the group fails at its first step; the others score 2 turns x 1.0.
  calls = {"n": 0}

  def policy(state, ep):
    del state
    calls["n"] += 1
    return "boom" if ep.seed == 100 and calls["n"] == 4 else "fine"

  class Picky(Mixed):

    def step(self, action):
      if action == "boom":
        raise RuntimeError("picky")
      return super().step(action)

  result = play(envs.registry.HostEnv("picky", Picky), cfg, policy=policy)
  assert result.metrics["env_error"].tolist() == [0.0, 0.0, 0.0, 1.0]
  np.testing.assert_allclose(result.batch.scores_B, [2.0, 2.0, 2.0, 2.0])
  assert result.batch.turns.mask_BxK.tolist() == [[1, 1]] * 3 + [[0, 0]]  # GiGPO skips it
  del env


def test_text_states_are_keyed_by_their_observation():
  """GiGPO's state keys of a text environment: equal exactly when the observations are, at any
  turn. The words show "start", then "after <the last action>" (texts of one length)."""

  class SameLength(Words):
    action_names = ("Alpha", "Gamma")

  words = ["Alpha", "Alpha", "Gamma", "Gamma"]
  policy = lambda state, ep: words[ep.index_in_group]
  result = play(envs.registry.HostEnv("words", SameLength), config(env_groups=1, group_size=4),
                policy=policy)  # fmt: skip
  keys = np.asarray(result.batch.turns.state_keys_BxK)
  assert (keys[:, 0] == keys[0, 0]).all()  # "start"
  assert keys[0, 1] == keys[1, 1] == keys[0, 2] != keys[2, 1] == keys[3, 2]  # "after Alpha" / Gamma
  assert keys[0, 0] not in keys[:, 1:]


def test_process_pool_plays_the_same_episodes_as_threads():
  import text_env_fixtures  # pylint: disable=import-outside-toplevel

  def host(pool):
    return envs.registry.HostEnv("guess", text_env_fixtures.GuessNumber, pool=pool, workers=2)

  guesses = lambda state, ep: str(10 + 7 * len(ep.turns))
  threads = play(host("thread"), policy=guesses)
  processes = play(host("process"), policy=guesses)
  assert [e.to_json() for e in threads.episodes] == [e.to_json() for e in processes.episodes]
  np.testing.assert_array_equal(threads.batch.tokens_BxT, processes.batch.tokens_BxT)


def test_served_environment_plays_like_the_class_in_process():
  import text_env_fixtures  # pylint: disable=import-outside-toplevel

  server = env_server.serve(text_env_fixtures.GuessNumber, "127.0.0.1", 0, {}, background=True)
  try:
    url = server.url
    guesses = lambda state, ep: str(20 + 3 * len(ep.turns))
    local = play(envs.make("", entry="text_env_fixtures:GuessNumber"), policy=guesses)
    remote = play(envs.make("", entry=url), policy=guesses)
    assert [e.to_json() for e in remote.episodes] == [e.to_json() for e in local.episodes]
    assert remote.summary["env_error"] == 0.0

    # The server goes away after the first turn: every episode ends as an environment error.
    def stop_after_first(state, ep):
      if ep.turns:
        server.close()
      return "5"

    cut = play(envs.make("", entry=url, step_timeout_s=5.0), policy=stop_after_first)
    assert cut.metrics["env_error"].tolist() == [1.0] * 4
    assert all(len(ep.messages) >= 4 for ep in cut.episodes)  # the first turn was played
  finally:
    server.close()


def test_reasoning_gym_retries_pay_half_per_wrong_answer_in_the_rollout():
  """reasoning-gym's chain_sum through the rollout: a wrong answer, RAGEN's feedback, then the
  dataset's own answer, which pays 1/2 on the second attempt."""
  from ragen_jax.envs.bridges import reasoning_gym as rga  # pylint: disable=import-outside-toplevel

  dataset = rga.get_dataset("chain_sum", None, 10000, 0)
  env = envs.make(
      "",
      entry="ragen_jax.envs.bridges.reasoning_gym:ReasoningGymEnv",
      dataset="chain_sum",
      max_attempts=3,
  )
  policy = lambda state, ep: dataset[ep.seed % 10000]["answer"] if ep.turns else "-1"
  result = play(env, config(max_turns=3), policy=policy)
  assert result.metrics["success"].tolist() == [1.0] * 4
  assert result.metrics["return"].tolist() == [0.5] * 4
  for ep in result.episodes:
    assert ep.messages[1]["content"].count(dataset[ep.group_id + 100]["question"]) == 1
    assert "Incorrect. Please think again." in ep.messages[3]["content"]
    assert [t.reward for t in ep.turns] == [0.0, 0.5]


class KnowingGuess(guess_number.GuessNumber):
  """The example game with an expert that knows the number (text environments' expert())."""

  def expert(self):
    return [str(self.target)], f"It is {self.target}."


class KnowingWords(Words):

  def expert(self):
    return ["beta"], "Beta."  # matched to the vocabulary ignoring case, as a reply would be


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_text_environment_experts_demonstrate_through_the_pool(pool):
  if pool == "process":  # process workers import the factory: a module-level class
    import text_env_fixtures  # pylint: disable=import-outside-toplevel

    del text_env_fixtures
    env = envs.make("", entry="examples.guess_number:GuessNumber", pool=pool, workers=2)
    with pytest.raises(ValueError, match="has no expert"):
      demos.expert_policy(env, config(), 0.0, seed=0)
    return
  env = envs.registry.HostEnv("knowing", KnowingGuess)
  cfg = config(max_actions_per_turn=1)
  engine = rollout.Rollout(env, TOK, cfg)
  result = engine.run_scripted(demos.expert_policy(env, cfg, 0.5, seed=0), jax.random.key(0), 7)
  engine.close()
  assert result.metrics["success"].tolist() == [1.0] * 4  # free text: no random replacement
  assert result.metrics["num_turns"].tolist() == [1.0] * 4
  reply = result.episodes[0].messages[2]["content"]
  assert reply.startswith("<think>It is ") and reply.endswith("</answer>")
  Words.received.clear()
  env = envs.registry.HostEnv("knowing_words", KnowingWords)
  engine = rollout.Rollout(env, TOK, config(max_turns=1))
  engine.run_scripted(demos.expert_policy(env, config(), 0.0, seed=0), jax.random.key(0), 7)
  engine.close()
  assert Words.received == ["Beta"] * 4


# ------------------------------------------------------------------ the pure-JAX environments


def test_builtin_prompts_are_unchanged():
  """Episodes of the three built-in environments, pinned from the version before environments
  owned their text (tests/data/builtin_prompts.json: a scripted expert's first episode)."""
  with open(os.path.join(DATA, "builtin_prompts.json"), encoding="utf-8") as fp:
    pinned = json.load(fp)
  cases = [
      ("sokoban", "grid_coord", {}),
      ("sokoban", "grid", {}),
      ("sokoban", "coord", {"dim_room": (7, 8)}),
      ("frozenlake", "grid_coord", {}),
      ("frozenlake", "grid", {"is_slippery": False}),
      ("bandit", "grid", {}),
      ("bandit", "grid", {"split": "test"}),
  ]
  for name, fmt, opts in cases:
    env = envs.make(name, **opts)
    for think in (True, False):
      cfg = config(
          env_groups=3,
          max_turns=4 if name != "bandit" else 1,
          max_actions_per_traj=10 if name != "bandit" else 1,
          max_new_tokens=64,
          max_context=1536,
          render_format=fmt,
          enable_think=think,
          unchanged_penalty=-0.05,
          use_turn_scores=think,
      )
      engine = rollout.Rollout(env, TOK, cfg)
      policy = demos.expert_policy(env, cfg, 0.5, seed=3, undo_prob=0.3)
      result = engine.run_scripted(policy, jax.random.key(1), seed=77)
      key = f"{name}-{fmt}-{sorted(opts.items())}-{think}"
      assert result.episodes[0].messages == pinned[key], key


class HostFrozenLake(envs.TextEnv):
  """RAGEN's FrozenLake (non-slippery) played one episode at a time on the host: the JAX
  environment's own functions behind the text interface (a second path to the same game)."""

  def __init__(self, render_format="grid_coord"):
    self.env = envs.make("frozenlake", is_slippery=False)
    self.fmt = render_format
    legend = ", ".join(f"{k}: {v}" for k, v in self.env.grid_vocab.items())
    self.instruction = (
        self.env.instruction(render_format)
        + "\nThe meaning of each symbol in the state is:\n"
        + legend
    )
    self.action_names = self.env.action_names

  def reset(self, seed):
    self.state = self.env.reset(jax.random.key(seed))
    return self.env.render(self.state, self.fmt)

  def step(self, action):
    index = self.action_names.index(action)
    old = self.env.render(self.state, self.fmt)
    self.state, reward, done, info = self.env.step(jax.random.key(0), self.state, index)
    text = self.env.render(self.state, self.fmt)
    return (
        text,
        float(reward),
        bool(done),
        {"success": bool(info["success"]), "action_is_effective": text != old},
    )


def test_a_host_environment_matches_the_jax_path_under_the_llm():
  """The same game through the JAX batch and through the host pool, sampled by the same model
  with the same key: the same conversations, batch and metrics."""
  model = models.Qwen2(models.PRESETS["tiny"], rngs=__import__("flax").nnx.Rngs(0))
  cfg = config(render_format="grid_coord", max_turns=3, temperature=1.0)
  jax_env = envs.make("frozenlake", is_slippery=False)
  host_env = envs.registry.HostEnv("host_frozenlake", HostFrozenLake)
  results = []
  for env in (jax_env, host_env):
    engine = rollout.Rollout(env, TOK, cfg)
    results.append(engine.run(rollout.ModelPolicy(model), jax.random.key(3), seed=40))
    engine.close()
  a, b = results
  assert [e.messages for e in a.episodes] == [e.messages for e in b.episodes]
  for field in ("tokens_BxT", "loss_mask_BxT", "logprobs_BxT", "token_rewards_BxT", "scores_B"):
    np.testing.assert_array_equal(getattr(a.batch, field), getattr(b.batch, field), field)
  for name in ("success", "num_actions", "action_is_valid", "num_turns", "return"):
    np.testing.assert_array_equal(a.metrics[name], b.metrics[name], name)

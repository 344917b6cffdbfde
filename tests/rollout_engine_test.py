"""The multi-turn rollout engine: KV-append decoding vs a full forward, and scripted episodes.

Two kinds of tests:
  * a random tiny model plays Sokoban; the log-probs the engine recorded (decoded turn by turn
    over a compacted, appended cache) must equal a full forward pass over the final sequences;
  * `sampling.extend` is replaced by a script of replies, so penalties, action budgets,
    rewards, success and the token layout are checked against hand-computed values and an
    independent BFS solver.
Dimension legend: B episodes, T sequence, N new tokens per turn, V vocab.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax.envs.device import sokoban
from ragen_jax.rollout import env_batch
from ragen_jax.rollout import policies
from tiny import rollout_config  # pylint: disable=g-bad-import-order

TOK = tokenizers.load("sentencepiece")


@pytest.fixture(scope="module")
def model():
  return models.create("tiny", jax.random.key(0))


def segments(mask_row):
  """(start, end) of each run of ones."""
  padded = np.concatenate([[0], mask_row, [0]])
  edges = np.flatnonzero(np.diff(padded))
  return list(zip(edges[::2], edges[1::2]))


def test_logprobs_equal_a_full_forward_over_the_final_sequences(model, monkeypatch):
  shared = []  # the first prompts' common system prompt is prefilled once, at batch 1
  prefill_shared = sampling.prefill_shared
  monkeypatch.setattr(
      sampling, "prefill_shared", lambda *a: shared.append(a[3].shape) or prefill_shared(*a)
  )
  engine = rollout.Rollout(envs.make("sokoban"), TOK, rollout_config())
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(1), seed=123)
  assert len(shared) == 1 and shared[0][0] == 1
  batch = result.batch
  tokens, mask = np.asarray(batch.tokens_BxT), np.asarray(batch.attention_mask_BxT)
  loss, lp = np.asarray(batch.loss_mask_BxT), np.asarray(batch.logprobs_BxT)
  logits = np.asarray(model(tokens, mask), np.float64) / 0.8
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  ref = np.take_along_axis(logits[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0] - logz[:, :-1]
  trained = loss[:, 1:] > 0
  assert trained.sum() == result.metrics["response_length"].sum() > 0
  assert np.max(np.abs(lp[:, 1:][trained] - ref[trained])) <= 1e-4
  assert np.all(lp[loss == 0] == 0) and np.all(loss <= mask)
  # One trained segment per played turn; each decodes to that turn's assistant message.
  for i, ep in enumerate(result.episodes):
    segs = segments(loss[i])
    assert len(segs) == len(ep.turns) == result.metrics["num_turns"][i]
    replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    assert replies == [turn.text for turn in ep.turns]
    for (a, b), turn in zip(segs, ep.turns):
      assert turn.text == "<think>" + TOK.decode(tokens[i, a:b])
  # The multi-turn cache appends instead of re-encoding the history.
  s = result.summary
  assert s["prefill_tokens_append"] < s["prefill_tokens_reencode"]


def test_groups_share_a_start_and_rewards_sit_on_the_last_trained_token(model):
  engine = rollout.Rollout(envs.make("sokoban"), TOK, rollout_config(max_turns=2))
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(2), seed=7)
  b = result.batch
  np.testing.assert_array_equal(np.asarray(b.group_ids_B), [0, 0, 1, 1])
  firsts = [ep.messages[1]["content"] for ep in result.episodes]
  assert firsts[0] == firsts[1] and firsts[2] == firsts[3] and firsts[0] != firsts[2]
  rewards, loss = np.asarray(b.token_rewards_BxT), np.asarray(b.loss_mask_BxT)
  for i in range(4):
    last = np.flatnonzero(loss[i])[-1]
    assert np.flatnonzero(rewards[i]).tolist() in ([last], [])
    np.testing.assert_allclose(rewards[i].sum(), float(b.scores_B[i]), atol=1e-6)
  # A random model writes junk: every turn is penalised, none crashes.
  np.testing.assert_allclose(
      result.metrics["format_penalty"], -0.1 * result.metrics["num_turns"], atol=1e-6
  )


def test_context_limit_stops_before_a_turn_and_is_counted(model):
  probe = rollout.Rollout(envs.make("sokoban"), TOK, rollout_config(max_turns=1))
  first = probe.run(rollout.ModelPolicy(model), jax.random.key(3), seed=5)
  prompt_len = int(
      np.asarray(first.batch.attention_mask_BxT).sum(1).max()
      - first.metrics["response_length"].min()
  )
  # Room for the first turn only.
  limit = prompt_len + 40
  turn_cap = 1536 - (-(-limit // 256) * 256)  # keeps the 1536-slot cache of the other tests
  engine = rollout.Rollout(
      envs.make("sokoban"), TOK, rollout_config(max_context=limit, max_turn_tokens=turn_cap)
  )
  assert engine.capacity == probe.capacity
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(3), seed=5)
  assert np.all(result.metrics["context_truncated"] == 1)
  assert np.all(result.metrics["num_turns"] == 1)
  loss = np.asarray(result.batch.loss_mask_BxT)
  mask = np.asarray(result.batch.attention_mask_BxT)
  assert np.all(loss[:, -1] == 1)  # the sequence ends with the (whole) first reply
  assert np.all(mask.sum(1) <= limit)


def test_new_turns_and_batches_do_not_recompile(model):
  engine = rollout.Rollout(envs.make("sokoban"), TOK, rollout_config())
  engine.run(rollout.ModelPolicy(model), jax.random.key(4), seed=11)
  programs = lambda: [
      f._cache_size() for f in (sampling._decode_jit, sampling.compact, sampling.prefill_shared)
  ]
  before = programs()
  engine.run(rollout.ModelPolicy(model), jax.random.key(5), seed=11)
  assert programs() == before


def test_a_shared_prefix_plays_as_the_whole_prompts(model, monkeypatch):
  """The first prompts' common beginning prefilled once and copied to every row: the same
  episodes, tokens and log-probs as each row prefilling its whole prompt (same key)."""
  config = rollout_config()
  play = lambda: rollout.Rollout(envs.make("sokoban"), TOK, config).run(
      rollout.ModelPolicy(model), jax.random.key(6), seed=40
  )
  shared = play()
  monkeypatch.setattr(policies, "split_shared_prefix", lambda *a, **k: None)
  whole = play()
  np.testing.assert_array_equal(shared.batch.tokens_BxT, whole.batch.tokens_BxT)
  np.testing.assert_array_equal(shared.batch.loss_mask_BxT, whole.batch.loss_mask_BxT)
  np.testing.assert_allclose(shared.batch.logprobs_BxT, whole.batch.logprobs_BxT, atol=2e-5)


def test_split_shared_prefix_by_hand():
  pad, c = -1, 256
  common = np.arange(100, 170)  # 70 tokens
  prompts = {0: [*common, 1, 2], 1: [*common, 3], 3: [*common, 4, 5, 6]}  # row 2 inactive
  ids = np.full((4, c), pad, np.int32)
  mask = np.zeros((4, c), np.int32)
  for i, p in prompts.items():
    ids[i, c - len(p) :], mask[i, c - len(p) :] = p, 1
  ids[2, -5:] = 7  # an inactive row's tokens are ignored
  active = np.array([True, True, False, True])
  prefix, prefix_mask, rest, rest_mask = policies.split_shared_prefix(ids, mask, active, pad)
  assert prefix.shape == prefix_mask.shape == (1, 128)  # bucket(70)
  np.testing.assert_array_equal(prefix[0, -70:], common)
  assert prefix_mask.sum() == 70 and prefix_mask[0, -70:].all()
  assert rest.shape == (4, 16)  # bucket(3)
  np.testing.assert_array_equal(rest[:, -3:], [[pad, 1, 2], [pad, pad, 3], [pad] * 3, [4, 5, 6]])
  np.testing.assert_array_equal(rest_mask.sum(1), [2, 1, 0, 3])
  # Identical prompts: every row keeps its last token.
  same = policies.split_shared_prefix(ids[[0, 0]], mask[[0, 0]], active[:2], pad)
  assert same[0][0, -71:].tolist() == [*common, 1] and same[2][:, -1].tolist() == [2, 2]
  # In 128 slots the 70 tokens (128 + 16 slots) do not fit; the first 64 (64 + 16) do.
  narrow = policies.split_shared_prefix(ids[:, -128:], mask[:, -128:], active, pad)
  np.testing.assert_array_equal(narrow[0], [common[:64]])
  np.testing.assert_array_equal(narrow[2][3, -9:], [*common[64:], 4, 5, 6])
  # Not worth it or not smaller: None.
  assert policies.split_shared_prefix(ids, mask, active, pad, min_prefix=71) is None
  assert policies.split_shared_prefix(ids[:, -73:], mask[:, -73:], active, pad) is None
  assert policies.split_shared_prefix(ids, mask, np.array([1, 0, 0, 0], bool), pad) is None


class Script:
  """Stands in for `sampling.extend`: row i's k-th call returns replies[i][k] (token ids)."""

  def __init__(self, replies):
    self.replies, self.calls = replies, 0

  def __call__(
      self,
      graphdef,
      params,
      cache,
      ids_BxC,
      mask_BxC,
      active_B,
      key,
      *,
      options,
      window=None,
      images=None,
  ):
    del window, images
    n = options.max_new_tokens
    tokens = np.full((len(self.replies), n), options.pad_id, np.int32)
    lengths = np.zeros(len(self.replies), np.int32)
    for i, active in enumerate(np.asarray(active_B)):
      if active:
        ids = TOK.encode(self.replies[i][self.calls])[:n]
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    self.calls += 1
    logprobs = np.where(tokens != options.pad_id, -0.5, 0.0).astype(np.float32)
    return sampling.SampleOutput(tokens, logprobs, lengths), cache


def scripted_run(monkeypatch, model, env, replies, config, seed):
  monkeypatch.setattr(sampling, "extend", Script(replies))
  return rollout.Rollout(env, TOK, config).run(
      rollout.ModelPolicy(model), jax.random.key(0), seed=seed
  )


def test_scripted_sokoban_solution_and_junk(monkeypatch, model):
  # Batch shapes match the other tests (B = 4): a Sokoban reset compiles in ~15 s per shape.
  env = envs.make("sokoban")
  reset, _ = env_batch.env_functions(env)
  starts = jax.device_get(reset(jax.vmap(jax.random.key)(jnp.arange(100, 104))))
  plans = [sokoban.solve(jax.tree.map(lambda x: x[i], starts), 10) for i in range(4)]
  i = next(i for i, p in enumerate(plans) if p and 3 <= len(p) <= 6)
  seed, plan = 100 + i, [env.action_names[a] for a in plans[i]]
  solve = [
      f"go</think><answer>{' || '.join(plan[k:k + 2])}</answer>" for k in range(0, len(plan), 2)
  ] + ["x"] * 5
  junk = [
      "\x00\ufffd<answer>",
      "</think><answer>Up || fly</answer>",
      "<think></think>",
      "</think><answer>UP||down||left</answer>",
      "",
  ]
  config = rollout_config(max_turns=5, max_new_tokens=32)
  result = scripted_run(monkeypatch, model, env, [solve, junk, ["x"] * 5, ["x"] * 5], config, seed)
  m = result.metrics
  turns = -(-len(plan) // 2)
  assert m["success"][:2].tolist() == [1.0, 0.0]
  assert m["num_turns"][:2].tolist() == [turns, 5]
  assert m["num_actions"][0] == len(plan)
  np.testing.assert_allclose(m["return"][0], 11 - 0.1 * len(plan), atol=1e-5)
  assert m["format_penalty"][0] == 0 and m["action_is_valid"][0] == 1
  # Junk: turns 1-3 penalised (no tags; unknown word; empty), turn 4 executes Up, Down (the
  # third word is dropped), and the empty fifth reply is penalised again.
  np.testing.assert_allclose(m["format_penalty"][1], -0.4, atol=1e-6)
  assert m["num_actions"][1] == 3 and m["action_is_valid"][1] == pytest.approx(0.2)
  assert result.summary["pass@2"] == 0.5  # group 0 solved, group 1 (all junk) not
  # turn_unchanged: every turn of the solution moves the board. The junk episode's turns 1, 3 and 5
  # move nothing; turn 2 plays Up, turn 4 Up then Down (replayed here); the "x" episodes never move.
  boards = [jax.tree.map(lambda x: x[i], starts)]
  for actions in ((0,), (0, 1)):
    board = boards[-1]
    for action in actions:
      board = env.step(jax.random.key(0), board, action)[0]
    boards.append(board)
  moved = sum(env.render(a) != env.render(b) for a, b in zip(boards, boards[1:]))
  assert m["turn_unchanged"].tolist() == [0.0, pytest.approx((5 - moved) / 5), 1.0, 1.0]
  # The "Reward:" message after turn 1 of the junk episode shows the penalty (no valid action).
  users = [msg["content"] for msg in result.episodes[1].messages if msg["role"] == "user"]
  assert users[1].startswith("Reward:\n-0.1\n\nTurn 2:\n")
  assert "You have 9 actions left" in users[3] and "You have 7 actions left" in users[4]
  # Trained tokens are exactly the scripted ids, and the turn end was appended (untrained).
  tokens, loss = np.asarray(result.batch.tokens_BxT), np.asarray(result.batch.loss_mask_BxT)
  for (a, b), reply in zip(segments(loss[0]), solve):
    assert tokens[0, a:b].tolist() == TOK.encode(reply)
    if b < tokens.shape[1]:
      assert tokens[0, b] == TOK.eos_id
  np.testing.assert_allclose(np.asarray(result.batch.logprobs_BxT)[loss > 0], -0.5)
  # The unchanged-turn penalty (-1 here) lowers each return by one per unchanged turn: 0 for the
  # solution, 5 - moved for the junk, 5 for each "x" episode. Format penalties and the "Reward:"
  # texts stay as they were.
  shaped = scripted_run(
      monkeypatch,
      model,
      env,
      [solve, junk, ["x"] * 5, ["x"] * 5],
      dataclasses.replace(config, unchanged_penalty=-1.0),
      seed,
  )
  np.testing.assert_allclose(
      shaped.metrics["return"] - m["return"], [0, moved - 5, -5, -5], atol=1e-5
  )
  np.testing.assert_allclose(shaped.batch.scores_B, shaped.metrics["return"])
  np.testing.assert_allclose(shaped.metrics["format_penalty"], m["format_penalty"])
  assert [e.messages for e in shaped.episodes] == [e.messages for e in result.episodes]


def test_scripted_budget_and_turn_scores(monkeypatch, model):
  """Budget 3 actions, per-turn rewards: each turn's reward (environment reward, format penalty
  and unchanged-turn penalty) sits on that turn's last reply token, and every other token's
  reward is 0."""
  env = envs.make("frozenlake", success_rate=1.0)  # deterministic ice
  left2, junk, left_fly = (
      "</think><answer>Left || Left</answer>",
      "no tags",
      "</think><answer>Left || fly</answer>",
  )
  # Each reply's actions and whether it is penalised (no tags; an unknown word).
  parsed = {left2: ([0, 0], False), junk: ([], True), left_fly: ([0], True)}
  replies = [[left2] * 5, [junk] + [left2] * 4, [left_fly] + [left2] * 4, [junk, left_fly] * 3]
  config = rollout_config(
      max_turns=5, max_actions_per_traj=3, use_turn_scores=True, unchanged_penalty=-0.5
  )
  result = scripted_run(monkeypatch, model, env, replies, config, seed=3)
  m = result.metrics
  rewards, loss = np.asarray(result.batch.token_rewards_BxT), np.asarray(result.batch.loss_mask_BxT)
  reset, _ = env_batch.env_functions(env)
  starts = reset(jax.vmap(jax.random.key)(jnp.array([3, 3, 4, 4])))
  turns, before_states = result.batch.turns, {}  # (episode, turn) -> replayed pre-action state
  for i in range(4):
    # Replay: at most 2 actions a turn, 3 in all; the episode ends when the lake says done or
    # the budget is spent.
    state, left, turn_rewards, actions = jax.tree.map(lambda x, i=i: x[i], starts), 3, [], 0
    for reply in replies[i][: config.max_turns]:
      before_states[i, len(turn_rewards)] = jax.device_get(state)
      wanted, penalised = parsed[reply]
      before, env_reward = env.render(state), 0.0
      for action in wanted[:left]:
        state, reward, _, _ = env.step(jax.random.key(0), state, action)
        env_reward += float(reward)
        left, actions = left - 1, actions + 1
        if bool(state.done):
          break
      unchanged = env.render(state) == before
      turn_rewards.append(env_reward - 0.1 * penalised - 0.5 * unchanged)
      if bool(state.done) or left == 0:
        break
    assert m["num_actions"][i] == actions and m["num_turns"][i] == len(turn_rewards)
    ends = [b - 1 for _, b in segments(loss[i])]
    assert len(ends) == len(turn_rewards)
    want = np.zeros(rewards.shape[1])
    want[ends] = turn_rewards
    np.testing.assert_allclose(rewards[i], want, atol=1e-6)  # values near 0: an absolute bound
    np.testing.assert_allclose(float(result.batch.scores_B[i]), sum(turn_rewards), rtol=1e-6)
    # The per-turn records (GiGPO): each turn's reward, its valid mark and its tokens' turn.
    n = len(turn_rewards)
    np.testing.assert_allclose(turns.rewards_BxK[i, :n], turn_rewards, atol=1e-6)
    assert turns.mask_BxK[i].tolist() == [1] * n + [0] * (config.max_turns - n)
    want_turns = np.full(rewards.shape[1], -1)
    for j, (a, b) in enumerate(segments(loss[i])):
      want_turns[a:b] = j
    np.testing.assert_array_equal(turns.token_turns_BxT[i], want_turns)
  # State keys: within a group, two turns share a key exactly when the replayed states before
  # them are equal leaf for leaf.
  for (i, j), x in before_states.items():
    for (i2, j2), y in before_states.items():
      if i // 2 == i2 // 2:
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))
        assert (turns.state_keys_BxK[i, j] == turns.state_keys_BxK[i2, j2]) == same
  assert turns.state_keys_BxK[0, 0] == turns.state_keys_BxK[1, 0]  # a group's shared start
  # Seeds 3 and 4 start at the left edge: Left never moves, so every turn pays -0.5 (and -0.1
  # more when penalised), and every turn's reward, not only the last, is non-zero.
  assert m["num_turns"].tolist() == [2, 3, 2, 5]
  np.testing.assert_allclose(m["return"], [-1.0, -1.6, -1.1, -3.0], rtol=1e-6)


def test_compact_prompts_play_the_same_episodes_in_fewer_tokens(monkeypatch, model):
  env = envs.make("frozenlake", success_rate=1.0)
  ragen = rollout_config(max_turns=3, max_actions_per_traj=4, enable_think=False)
  compact = dataclasses.replace(ragen, prompt_style="compact")
  replies = [["Left || Down</answer>", "Right</answer>", "x"]] * 4
  a, b = (scripted_run(monkeypatch, model, env, replies, c, seed=3) for c in (ragen, compact))
  for key in ("return", "num_actions", "num_turns", "success", "format_penalty"):
    np.testing.assert_array_equal(a.metrics[key], b.metrics[key])
  system, *turns = [m["content"] for m in b.episodes[0].messages if m["role"] != "assistant"]
  assert system.endswith(
      "Always output: <answer>...</answer> with no extra text. Strictly "
      "follow this format. Max response length: 100 words (tokens).\n"
  )
  assert turns[0].startswith("\nTurn 1:\n") and turns[0].endswith("\nActions left: 4\n")
  assert all("Always output" not in t and "State:" not in t for t in turns)
  # The same trained tokens, and fewer context tokens once the episode has a second turn.
  loss_a, loss_b = np.asarray(a.batch.loss_mask_BxT), np.asarray(b.batch.loss_mask_BxT)
  assert loss_a.sum() == loss_b.sum()
  length_a, length_b = (np.asarray(r.batch.attention_mask_BxT).sum(1) for r in (a, b))
  assert (length_b[a.metrics["num_turns"] > 1] < length_a[a.metrics["num_turns"] > 1]).all()


def test_scripted_bandit_uses_the_arm_names(monkeypatch, model):
  env = envs.make("bandit")
  config = rollout_config(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
  reset, _ = env_batch.env_functions(env)
  names = env.action_names_for(
      jax.tree.map(
          lambda x: x[0], jax.device_get(reset(jax.vmap(jax.random.key)(jnp.array([9, 9, 10, 10]))))
      )
  )
  hi = [n for n in names if n in {p[1] for p in env.pairs}][0]
  replies = [
      [f"</think><answer>{hi.lower()}</answer>"],
      ["</think><answer>Teacher?</answer>"],
      ["junk"],
      ["junk"],
  ]
  result = scripted_run(monkeypatch, model, env, replies, config, seed=9)
  assert result.metrics["success"][:2].tolist() == [1.0, 0.0]
  assert result.metrics["format_penalty"][:2].tolist() == [0.0, pytest.approx(-0.1)]
  assert result.metrics["num_turns"].tolist() == [1, 1, 1, 1]
  assert f"Your available actions are:\n{names[0]}, {names[1]}" in (
      result.episodes[0].messages[0]["content"]
  )

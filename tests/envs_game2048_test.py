"""2048: the move rule against a plain-Python one, spawns, rewards, the end, text and the expert
(its `:smoke` config trains in train_text_envs_test.py, beside RAGEN's other environments with
experts)."""

import math
import types

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import tokenizers
from ragen_jax.envs import game2048
from ragen_jax.train import batching
from ragen_jax.warm_start import demos

UP, RIGHT, DOWN, LEFT = range(4)
ENV = envs.make("2048")
STEP = jax.jit(ENV.step)
_TOKENIZER = tokenizers.load("sentencepiece")
SLIDE = jax.jit(game2048.slide)
KEY = jax.random.key(0)


def oracle_slide(board, action):
  """The rule written out plainly: each line read from the wall the tiles move to, its tiles
  merged pairwise from that end, each tile at most once."""
  n = len(board)
  out = [list(row) for row in board]
  score = 0
  for k in range(n):
    cells = {
        LEFT: [(k, j) for j in range(n)],
        RIGHT: [(k, n - 1 - j) for j in range(n)],
        UP: [(j, k) for j in range(n)],
        DOWN: [(n - 1 - j, k) for j in range(n)],
    }[action]
    tiles = [board[r][c] for r, c in cells if board[r][c]]
    line, i = [], 0
    while i < len(tiles):
      if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
        line.append(2 * tiles[i])
        score += 2 * tiles[i]
        i += 2
      else:
        line.append(tiles[i])
        i += 1
    line += [0] * (n - len(line))
    for (r, c), v in zip(cells, line):
      out[r][c] = v
  return out, score, out != [list(row) for row in board]


def _slide(board, action):
  new, score, moved = SLIDE(jnp.asarray(board, jnp.int32), action)
  return np.asarray(new).tolist(), int(score), bool(moved)


def _text(rows, score=0):
  board = np.asarray(rows, np.int32)
  state = game2048.Game2048State(
      jnp.asarray(board), jnp.int32(score), jnp.int32(0), jnp.bool_(False)
  )
  return ENV.render(state)


@pytest.mark.parametrize(
    "line, expected, score",
    [
        ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # no double merge: the new 4 does not meet the old one
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),
        ([4, 0, 4, 4], [8, 4, 0, 0], 8),  # the pair nearest the wall merges first
        ([4, 4, 8, 8], [8, 16, 0, 0], 24),
        ([2, 0, 2, 2], [4, 2, 0, 0], 4),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
    ],
)
def test_hand_worked_lines_in_each_direction(line, expected, score):
  empty = [[0] * 4 for _ in range(4)]

  def placed(values, action):  # `values` read from the wall that `action` slides towards
    board = [row[:] for row in empty]
    for j, v in enumerate(values):
      r, c = {LEFT: (1, j), RIGHT: (1, 3 - j), UP: (j, 2), DOWN: (3 - j, 2)}[action]
      board[r][c] = v
    return board

  for action in range(4):
    assert _slide(placed(line, action), action) == (
        placed(expected, action),
        score,
        expected != line,
    ), ENV.action_names[action]


def test_a_move_that_changes_nothing_is_reported():
  packed = [[2, 4, 8, 16], [4, 8, 16, 32], [0, 0, 0, 0], [0, 0, 0, 0]]
  assert _slide(packed, LEFT) == (packed, 0, False)
  assert _slide(packed, UP) == (packed, 0, False)
  assert _slide(packed, DOWN)[2] and not _slide(packed, RIGHT)[2]


TILES = st.sampled_from([0, 0, 0, 2, 2, 4, 4, 8, 16, 32, 2048])


@hypothesis.settings(max_examples=150)
@hypothesis.given(st.data(), st.sampled_from([2, 3, 4, 5]), st.integers(0, 3))
def test_slide_matches_the_plain_rule_on_random_boards(data, n, action):
  board = [data.draw(st.lists(TILES, min_size=n, max_size=n)) for _ in range(n)]
  assert _slide(board, action) == oracle_slide(board, action)
  # `movable` (the end-of-game test) says the same as the move itself.
  assert bool(game2048.movable(jnp.asarray(board))[action]) == oracle_slide(board, action)[2]
  assert bool(game2048.movable(np.asarray(board), np)[action]) == oracle_slide(board, action)[2]


def test_slide_under_jit_and_vmap_matches_the_plain_rule():
  rng = np.random.default_rng(0)
  boards = rng.choice([0, 0, 2, 4, 8, 16], size=(400, 4, 4)).astype(np.int32)
  actions = rng.integers(0, 4, size=400)
  new, score, moved = jax.jit(jax.vmap(game2048.slide))(boards, actions)
  assert new.shape == (400, 4, 4) and score.shape == moved.shape == (400,)
  for i in range(400):
    want = oracle_slide(boards[i].tolist(), int(actions[i]))
    assert (np.asarray(new[i]).tolist(), int(score[i]), bool(moved[i])) == want


def test_reset_draws_two_tiles_and_spawns_are_two_nine_times_in_ten():
  keys = jax.random.split(jax.random.key(1), 20000)
  boards = np.asarray(jax.jit(ENV.reset_batch)(keys).board_SxS)
  assert boards.shape == (20000, 4, 4)
  assert np.all((boards != 0).sum(axis=(1, 2)) == 2)
  tiles = boards[boards != 0]
  assert set(np.unique(tiles)) == {2, 4}
  # 40,000 tiles: the share of 4s has a standard deviation of 0.0015; 0.01 is 6.7 of them.
  assert abs(np.mean(tiles == 4) - 0.1) < 0.01
  per_cell = (boards != 0).mean(axis=0) / 2  # each cell holds 1/16 of the tiles
  np.testing.assert_allclose(per_cell, 1 / 16, atol=0.006)
  again = jax.jit(ENV.reset_batch)(keys[:8])
  np.testing.assert_array_equal(np.asarray(again.board_SxS), boards[:8])


def test_a_new_tile_lands_on_an_empty_cell_uniformly():
  state = ENV.from_text(_text([[2, 4, 8, 16], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2]]))
  keys = jax.random.split(jax.random.key(2), 8000)
  new = np.asarray(jax.jit(jax.vmap(ENV.step, (0, None, None)))(keys, state, LEFT)[0].board_SxS)
  slid = np.asarray(_slide(np.asarray(state.board_SxS), LEFT)[0])
  added = new - slid[None]
  assert np.all((added != 0).sum(axis=(1, 2)) == 1)  # exactly one new tile, on an empty cell
  assert np.all(slid[added.any(axis=0)] == 0)
  counts = (added != 0).sum(axis=0)[slid == 0]
  assert len(counts) == 11  # 8000 / 11 = 727 each, standard deviation 26
  assert counts.min() > 600 and counts.max() < 860


def test_rewards_raw_log_and_the_invalid_penalty():
  text = _text([[2, 2, 4, 4], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
  raw = envs.make("2048", use_log_reward=False)
  state, reward, done, info = raw.step(KEY, raw.from_text(text), LEFT)
  assert float(reward) == 12.0 and not bool(done)
  assert int(state.score) == 12 and int(state.num_steps) == 1
  assert bool(info["action_is_valid"]) and bool(info["action_is_effective"])
  assert int(info["max_tile"]) == 8
  _, reward, _, _ = ENV.step(KEY, ENV.from_text(text), LEFT)
  assert float(reward) == pytest.approx(0.1 * math.log2(13))
  _, reward, _, _ = ENV.step(KEY, ENV.from_text(text), DOWN)  # moves, merges nothing
  assert float(reward) == 0.0
  # Up changes nothing: the board stays (no new tile), and the penalty is paid as given, with
  # or without the log reward (RAGEN's log transform would make it 0).
  for env in (
      ENV,
      raw,
      envs.make("2048", invalid_penalty=-0.5),
      envs.make("2048", invalid_penalty=0.0),
  ):
    before = env.from_text(text)
    after, reward, done, info = env.step(KEY, before, UP)
    assert float(reward) == pytest.approx(env.invalid_penalty)
    np.testing.assert_array_equal(np.asarray(after.board_SxS), np.asarray(before.board_SxS))
    assert not bool(info["action_is_valid"]) and not bool(info["action_is_effective"])
    assert int(after.num_steps) == 1 and int(after.score) == 0 and not bool(done)
  # An action outside 0..3 is a no-op that costs no step and no penalty.
  after, reward, _, info = ENV.step(KEY, ENV.from_text(text), 7)
  assert float(reward) == 0.0 and int(after.num_steps) == 0 and not bool(info["action_is_valid"])


@pytest.mark.parametrize("corner, success", [(2048, True), (1024, False)])
def test_the_game_ends_when_nothing_moves_and_succeeds_with_2048(corner, success):
  rows = [[corner, 4, 8, 16], [4, 8, 16, 32], [8, 16, 32, 64], [128, 256, 512, 0]]
  state = ENV.from_text(_text(rows))
  assert not bool(state.done)
  assert ENV.render(state).count("Valid Actions: 1(Right), 2(Down).") == 1
  # Right fills the last cell's row; whatever tile spawns at (3, 0) (2 or 4), nothing can move.
  for seed in range(4):
    end, reward, done, info = STEP(jax.random.key(seed), state, RIGHT)
    assert bool(done) and bool(end.done) and float(reward) == 0.0
    assert bool(info["success"]) == success and int(info["max_tile"]) == max(corner, 512)
    assert "Valid Actions: None." in ENV.render(end)
    assert ENV.expert(end)[0] is None
    # A finished game ignores further moves.
    again, reward, done, info = STEP(KEY, end, LEFT)
    assert float(reward) == 0.0 and bool(done) and not bool(info["action_is_effective"])
    np.testing.assert_array_equal(np.asarray(again.board_SxS), np.asarray(end.board_SxS))
  assert bool(ENV.from_text(ENV.render(end)).done)


def test_render_is_ragens_text():
  rows = [[0, 2, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0], [0, 0, 0, 2]]
  assert _text(rows, score=36) == (
      "Current 2048 Grid:\n"
      "Row 1: [0, 2, 0, 0]\n"
      "Row 2: [0, 0, 0, 0]\n"
      "Row 3: [4, 0, 0, 0]\n"
      "Row 4: [0, 0, 0, 2]\n"
      "\n"
      "Valid Actions: 0(Up), 1(Right), 2(Down), 3(Left).\n"
      "Goal: Merge same numbers to reach 2048.\n"
      "Current Score: 36\n"
      "What is your next move?"
  )
  assert ENV.instruction().startswith("You are playing the 2048 game on a 4x4 grid.")
  assert ENV.instruction().endswith("Respond with a single action.\nExample: <answer>Up</answer>\n")
  assert ENV.grid_vocab == {} and ENV.action_names == ("Up", "Right", "Down", "Left")


@hypothesis.settings(max_examples=60)
@hypothesis.given(st.lists(TILES, min_size=16, max_size=16), st.integers(0, 10**6))
def test_render_and_from_text_round_trip(cells, score):
  text = _text(np.reshape(cells, (4, 4)), score)
  state = ENV.from_text(text)
  assert ENV.render(state) == text
  np.testing.assert_array_equal(np.asarray(state.board_SxS), np.reshape(cells, (4, 4)))
  assert int(state.score) == score
  assert bool(state.done) == (
      not any(oracle_slide(np.reshape(cells, (4, 4)).tolist(), a)[2] for a in range(4))
  )


@pytest.mark.parametrize(
    "text, message",
    [
        ("Row 1: [2, 4]\nRow 2: [0, 0]", r"'Row 1: \[...\]' to 'Row 4"),
        (
            _text(np.zeros((4, 4))).replace("[0, 0, 0, 0]", "[0, 0, 0]", 1),
            "cells, but this env has size=4",
        ),
        (_text(np.zeros((4, 4))).replace("[0, 0, 0, 0]", "[0, 3, 0, 0]", 1), "powers of two"),
        (_text(np.zeros((4, 4))).replace("[0, 0, 0, 0]", "[0, x, 0, 0]", 1), "integers"),
    ],
)
def test_from_text_names_what_is_wrong(text, message):
  with pytest.raises(ValueError, match=message):
    ENV.from_text(text)


@pytest.mark.parametrize(
    "options, key",
    [
        (dict(two_prob=1.5), "two_prob"),
        (dict(size=1), "size"),
        (dict(invalid_penalty=math.nan), "invalid_penalty"),
        (dict(use_log_reward="yes"), "use_log_reward"),
        (dict(two_probability=0.5), "two_probability"),
    ],
)
def test_bad_options_name_the_key(options, key):
  with pytest.raises(ValueError, match=key):
    envs.make("2048", **options)


def test_batched_play_keeps_the_rules_under_jit_and_vmap():
  """64 games of random moves in one jitted, vmapped step: every board holds powers of two,
  the score grows by the merges, and a finished game has no move left."""
  env = envs.make("2048", use_log_reward=False, invalid_penalty=0.0)
  step = jax.jit(jax.vmap(env.step))
  states = jax.jit(env.reset_batch)(jax.random.split(jax.random.key(3), 64))
  for t in range(60):
    keys = jax.random.split(jax.random.fold_in(KEY, t), 64)
    actions = jax.random.randint(jax.random.fold_in(keys[0], 1), (64,), 0, 4)
    before = states
    states, reward, done, _ = step(keys, states, actions)
    np.testing.assert_array_equal(np.asarray(states.score - before.score), np.asarray(reward))
  boards = np.asarray(states.board_SxS)
  tiles = boards[boards != 0]
  assert np.all(tiles & (tiles - 1) == 0)
  for i in np.flatnonzero(np.asarray(done)):
    assert not any(oracle_slide(boards[i].tolist(), a)[2] for a in range(4))


def _play(policy, seed, moves=3000):
  state = ENV.reset(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  for t in range(moves):
    if bool(state.done):
      break
    action = policy(state, rng)
    state, _, _, info = STEP(jax.random.fold_in(jax.random.key(seed), t), state, action)
    if policy is _expert:
      assert bool(info["action_is_valid"])  # the expert only plays moves that change the board
  return int(state.score)


def _expert(state, rng):
  del rng
  plan, thought = ENV.expert(state)
  assert len(plan) == 1 and thought.startswith(f"Max {int(state.board_SxS.max())}: ")
  # Its demonstration fits the smoke configs' 24 new tokens (variants._smoke_variant).
  reply = demos.reply_text(thought, [ENV.action_names[plan[0]]], True, "||")
  assert len(_TOKENIZER.encode(reply)) <= 24, reply
  return plan[0]


def test_the_expert_plays_legal_moves_and_beats_random_play():
  """Whole games (a few hundred moves for the expert): its mean final score is several times
  random play's (about 1,500 here)."""
  expert = np.mean([_play(_expert, seed) for seed in range(3)])
  random = np.mean([_play(lambda s, rng: int(rng.integers(4)), seed) for seed in range(3)])
  assert expert > 3 * random, (expert, random)


def test_episode_metrics_read_the_largest_tile_into_the_rollout_metrics():
  rows = [[0, 2, 0, 0], [0, 64, 0, 0], [4, 0, 0, 0], [0, 0, 0, 2]]
  assert ENV.episode_metrics(_text(rows)) == {"max_tile": 64.0}
  episodes = [types.SimpleNamespace(observation=_text(np.asarray(rows) * k)) for k in (1, 4)]
  result = types.SimpleNamespace(episodes=episodes, metrics={"success": np.zeros(2)})
  batching.add_env_metrics(ENV, result)
  np.testing.assert_array_equal(result.metrics["max_tile"], [64.0, 256.0])
  sokoban = types.SimpleNamespace(episodes=episodes, metrics={})
  batching.add_env_metrics(envs.make("sokoban"), sokoban)  # no figures of its own
  assert sokoban.metrics == {}

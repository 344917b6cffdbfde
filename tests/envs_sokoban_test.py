"""Sokoban rules, text, generator and solver, checked against hand-worked cases and a NumPy step."""

import collections

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax.envs.device import sokoban
from ragen_jax.envs.device import sokoban_generator

ENV1 = envs.make("sokoban", dim_room=(6, 6), num_boxes=1, max_steps=100)
ENV2 = envs.make("sokoban", dim_room=(6, 6), num_boxes=2, max_steps=100)
STEP1 = jax.jit(ENV1.step)
STEP2 = jax.jit(ENV2.step)
UP, DOWN, LEFT, RIGHT = range(4)


def _play(step, env, text, actions):
  state = env.from_text(text)
  rewards, dones, infos = [], [], []
  for a in actions:
    state, r, d, info = step(jax.random.PRNGKey(0), state, a)
    rewards.append(float(r))
    dones.append(bool(d))
    infos.append({k: bool(v) for k, v in info.items()})
  return state, rewards, dones, infos


def test_walk_and_wall_bump():
  text = "######\n#____#\n#_P__#\n#_X__#\n#_O__#\n######"
  state, rewards, dones, infos = _play(STEP1, ENV1, text, [UP, UP])
  assert ENV1.render(state) == "######\n#_P__#\n#____#\n#_X__#\n#_O__#\n######"
  np.testing.assert_allclose(rewards, [-0.1, -0.1], rtol=1e-6)  # The bump still costs a step.
  assert [i["action_is_effective"] for i in infos] == [True, False]
  assert int(state.num_steps) == 2 and dones == [False, False]


def test_push_onto_target_solves():
  text = "######\n#____#\n#_P__#\n#_X__#\n#_O__#\n######"
  state, rewards, dones, infos = _play(STEP1, ENV1, text, [DOWN])
  assert ENV1.render(state) == "######\n#____#\n#____#\n#_P__#\n#_√__#\n######"
  np.testing.assert_allclose(rewards, [-0.1 + 1.0 + 10.0], rtol=1e-6)
  assert dones == [True] and infos[0]["success"]
  # A finished episode ignores further actions.
  state2, r, d, _ = STEP1(jax.random.PRNGKey(0), state, DOWN)
  assert float(r) == 0.0 and bool(d) and ENV1.render(state2) == ENV1.render(state)


def test_push_off_target_and_blocked_pushes():
  text = "######\n#_P__#\n#_√__#\n#____#\n#_X_O#\n######"
  # Pushing the box on a target off it: -1 for the box, -0.1 for the step; player on target is S.
  state, rewards, _, _ = _play(STEP2, ENV2, text, [DOWN])
  after = "######\n#____#\n#_S__#\n#_X__#\n#_X_O#\n######"
  assert ENV2.render(state) == after
  np.testing.assert_allclose(rewards, [-1.1], rtol=1e-6)
  # A second box behind the first blocks the push: a no-op that still costs the step.
  state, rewards, _, infos = _play(STEP2, ENV2, after, [DOWN])
  assert ENV2.render(state) == after and int(state.num_steps) == 1
  np.testing.assert_allclose(rewards, [-0.1], rtol=1e-6)
  assert not infos[0]["action_is_effective"] and infos[0]["action_is_valid"]
  # A wall behind the box blocks it too.
  text = "######\n#XP__#\n#O___#\n#____#\n#_X_O#\n######"
  state, rewards, _, infos = _play(STEP2, ENV2, text, [LEFT])
  assert ENV2.render(state) == text and not infos[0]["action_is_effective"]
  np.testing.assert_allclose(rewards, [-0.1], rtol=1e-6)


def test_max_steps_ends_episode_and_invalid_actions_are_free():
  env = envs.make("sokoban", max_steps=3)
  step = jax.jit(env.step)
  text = "######\n#____#\n#_P__#\n#_X__#\n#_O__#\n######"
  state = env.from_text(text)
  state, r, d, info = step(jax.random.PRNGKey(0), state, 7)
  assert not bool(info["action_is_valid"]) and float(r) == 0.0 and int(state.num_steps) == 0
  dones = []
  for a in [LEFT, RIGHT, LEFT]:
    state, r, d, _ = step(jax.random.PRNGKey(0), state, a)
    dones.append(bool(d))
  assert dones == [False, False, True]


def test_render_formats_are_ragens():
  state = ENV2.from_text("######\n#_S__#\n#_X__#\n#_√__#\n#____#\n######")
  assert ENV2.render(state) == "######\n#_S__#\n#_X__#\n#_√__#\n#____#\n######"
  coord = (
      "Board size: 6 rows x 6 cols (zero-indexed).\nTargets: (1, 2), (3, 2)\n"
      "Boxes: (2, 2)\nBoxes on target: (3, 2)\nPlayer on target: (1, 2)"
  )
  assert ENV2.render(state, "coord") == coord
  assert ENV2.render(state, "grid_coord") == (
      "Coordinates: \n" + coord + "\nGrid Map: \n" + ENV2.render(state)
  )
  with pytest.raises(ValueError, match="render format"):
    ENV2.render(state, "ascii")


def test_from_text_errors():
  with pytest.raises(ValueError, match="unknown symbols"):
    ENV1.from_text("######\n#_P__#\n#_X__#\n#_O__#\n#__?_#\n######")
  with pytest.raises(ValueError, match="dim_room"):
    ENV1.from_text("#####\n#PXO#\n#####")
  with pytest.raises(ValueError, match="one player"):
    ENV1.from_text("######\n#_P__#\n#_X__#\n#_O__#\n#__P_#\n######")


# ------------------------------------------------------------ a second, NumPy implementation


def _numpy_step(fixed, boxes, player, action):
  """gym-sokoban's push rule written independently, for the property test."""
  dr, dc = [(-1, 0), (1, 0), (0, -1), (0, 1)][action]
  r, c = player
  nr, nc = r + dr, c + dc
  boxes = boxes.copy()
  if fixed[nr, nc] == sokoban.WALL:
    return boxes, player
  if boxes[nr, nc]:
    br, bc = nr + dr, nc + dc
    if fixed[br, bc] == sokoban.WALL or boxes[br, bc]:
      return boxes, player
    boxes[nr, nc], boxes[br, bc] = False, True
  return boxes, (nr, nc)


@pytest.fixture(scope="module")
def levels():
  env = envs.make("sokoban", dim_room=(7, 7), num_boxes=2)
  reset_batch = jax.jit(env.reset_batch)
  states = reset_batch(jax.random.split(jax.random.PRNGKey(7), 16))
  return env, jax.device_get(states), reset_batch


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    level=st.integers(0, 15), actions=st.lists(st.integers(0, 3), min_size=24, max_size=24)
)
def test_random_play_matches_numpy_and_conserves(levels, level, actions):
  env, states, _ = levels
  state = jax.tree.map(lambda x: jnp.asarray(x[level]), states)
  run = _scan_actions(env)
  final_fixed, (boxes_seq, player_seq) = jax.device_get(run(state, jnp.asarray(actions, jnp.int32)))
  fixed = np.asarray(state.fixed_HxW)
  np.testing.assert_array_equal(final_fixed, fixed)  # Walls and targets never move.
  assert (fixed == sokoban.TARGET).sum() == env.num_boxes
  boxes, player = np.asarray(state.boxes_HxW), tuple(int(x) for x in state.player_rc)
  for t, a in enumerate(actions):
    if (boxes & (fixed == sokoban.TARGET)).sum() == env.num_boxes:
      break  # Solved: the env freezes, the reference would keep going.
    boxes, player = _numpy_step(fixed, boxes, player, a)
    np.testing.assert_array_equal(boxes_seq[t], boxes)
    assert tuple(player_seq[t]) == player
    assert boxes.sum() == env.num_boxes  # boxes conserved
    assert fixed[player] != sokoban.WALL and not boxes[player]  # player on free floor
    assert not (boxes & (fixed == sokoban.WALL)).any()


_SCAN_CACHE = {}


def _scan_actions(env):
  if env not in _SCAN_CACHE:

    def run(state, actions):
      def body(s, a):
        s, *_ = env.step(jax.random.PRNGKey(0), s, a)
        return s, (s.boxes_HxW, s.player_rc)

      final, seq = jax.lax.scan(body, state, actions)
      return final.fixed_HxW, seq

    _SCAN_CACHE[env] = jax.jit(run)
  return _SCAN_CACHE[env]


# ------------------------------------------------------------ batching and generation


def test_vmap_and_batch_equal_unbatched(levels):
  env, states, reset_batch = levels
  batch = jax.tree.map(jnp.asarray, states)
  actions = jnp.arange(16) % 4
  vs, vr, vd, vi = jax.jit(jax.vmap(env.step, in_axes=(None, 0, 0)))(
      jax.random.PRNGKey(0), batch, actions
  )
  for i in [0, 5, 15]:
    s, r, d, info = env.step(jax.random.PRNGKey(0), jax.tree.map(lambda x: x[i], batch), actions[i])
    assert env.render(s) == env.render(jax.tree.map(lambda x: x[i], vs))
    assert float(r) == float(vr[i]) and bool(d) == bool(vd[i])
  # A key gives the same level in any batch position (retries are keyed per level).
  keys = jax.random.split(jax.random.PRNGKey(7), 16)
  flipped = reset_batch(keys[::-1])
  for i in range(16):
    assert env.render(jax.tree.map(lambda x: x[15 - i], flipped)) == env.render(
        jax.tree.map(lambda x: x[i], batch)
    )


def test_levels_are_the_same_in_chunks_or_in_one(levels):
  """A CPU generates large batches in chunks of 256 levels, an accelerator in one chunk; a key
  gives the same level either way."""
  assert sokoban_generator.chunk_size(512, "cpu") == 256
  assert sokoban_generator.chunk_size(512, "gpu") == sokoban_generator.chunk_size(512, "tpu") == 512
  assert sokoban_generator.chunk_size(16, "cpu") == 16
  env, states, _ = levels  # generated in one chunk of 16
  generate = jax.jit(sokoban_generator.generate, static_argnums=tuple(range(1, 8)))
  gen_steps = int(1.7 * sum(env.dim_room))
  _, _, boxes_BxK, player_B, accepted_B = generate(
      jax.random.split(jax.random.PRNGKey(7), 16),
      env.dim_room,
      env.num_boxes,
      gen_steps,
      env.search_depth,
      env.num_reverse_walks,
      env.num_candidates,
      4,
  )
  assert np.asarray(accepted_B).all()
  np.testing.assert_array_equal(boxes_BxK, states.boxes_K)
  np.testing.assert_array_equal(player_B, states.player)


def test_generated_6x6_levels_are_solvable_and_ragen_like():
  states = jax.device_get(jax.jit(ENV1.reset_batch)(jax.random.split(jax.random.PRNGKey(0), 500)))
  lengths = []
  for i in range(500):
    state = jax.tree.map(lambda x: x[i], states)
    path = sokoban.solve(state, max_depth=40)
    assert path is not None, ENV1.render(state)
    lengths.append(len(path))
  lengths = np.array(lengths)
  assert 3.0 <= lengths.mean() <= 5.5, collections.Counter(lengths.tolist())
  assert (lengths <= 10).mean() >= 0.97
  assert (lengths == 1).mean() <= 1 / 3
  assert (lengths >= 1).all()  # Never generated already solved.


def test_generated_8x8_two_box_levels_are_solvable():
  env = envs.make("sokoban", dim_room=(8, 8), num_boxes=2, search_depth=10)
  states = jax.device_get(jax.jit(env.reset_batch)(jax.random.split(jax.random.PRNGKey(1), 40)))
  for i in range(40):
    state = jax.tree.map(lambda x: x[i], states)
    assert np.asarray(state.boxes_HxW).sum() == 2
    assert sokoban.solve(state, max_depth=60) is not None, env.render(state)


def test_solver_is_optimal_and_its_plan_solves_the_jax_env():
  # Box at (2, 2), target at (4, 1), player at (2, 3). Worked by hand: three pushes are needed
  # (one left, two down); pushing left first leaves the player at (2, 2), two moves from
  # (1, 1) where it can push down twice: Left, Up, Left, Down, Down = 5 moves, and no plan
  # of 4 exists (3 pushes + at least 2 moves to get above the box).
  text = "######\n#____#\n#_XP_#\n#____#\n#O___#\n######"
  state = ENV1.from_text(text)
  path = sokoban.solve(state)
  assert path == [LEFT, UP, LEFT, DOWN, DOWN]
  for a in path:
    state, r, d, info = STEP1(jax.random.PRNGKey(0), state, a)
  assert bool(info["success"]) and bool(d)
  assert sokoban.solve(ENV1.from_text("######\n#____#\n#_√P_#\n#____#\n#____#\n######")) == []
  stuck = ENV1.from_text("######\n#X___#\n#__P_#\n#____#\n#__O_#\n######")
  assert sokoban.solve(stuck) is None

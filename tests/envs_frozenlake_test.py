"""FrozenLake rules, maps, slip statistics and text."""

import collections

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax.envs.device import frozenlake

LEFT, DOWN, RIGHT, UP = range(4)
DETERMINISTIC = envs.make("frozenlake", is_slippery=False)
STEP = jax.jit(DETERMINISTIC.step)


def _play(text, actions, env=DETERMINISTIC, step=STEP):
  state = env.from_text(text)
  out = []
  for a in actions:
    state, r, d, info = step(jax.random.PRNGKey(0), state, a)
    out.append(
        (
            env.render(state),
            float(r),
            bool(d),
            bool(info["success"]),
            bool(info["action_is_effective"]),
        )
    )
  return out


def test_moves_border_goal_and_hole():
  text = "P___\n_O__\n____\n___G"
  out = _play(text, [UP, LEFT, RIGHT, DOWN])
  assert out[0] == (text, 0.0, False, False, False)  # Up into the border: stays.
  assert out[1] == (text, 0.0, False, False, False)  # Left into the border: stays.
  assert out[2] == ("_P__\n_O__\n____\n___G", 0.0, False, False, True)
  assert out[3] == ("____\n_X__\n____\n___G", 0.0, True, False, True)  # Fell in a hole.
  out = _play("____\n____\n___P\n___G", [DOWN, DOWN])
  assert out[0] == ("____\n____\n____\n___√", 1.0, True, True, True)
  assert out[1][1:3] == (0.0, True)  # Stepping a finished episode changes nothing.


def test_max_steps_bounds_the_episode():
  env = envs.make("frozenlake", is_slippery=False, max_steps=2)
  out = _play("P___\n____\n____\n___G", [RIGHT, LEFT], env, jax.jit(env.step))
  assert [o[2] for o in out] == [False, True]


def test_render_formats():
  env = DETERMINISTIC
  state = env.from_text("____\n_O_P\n____\nG___")
  state = state.replace(start_rc=jnp.array([2, 1], jnp.int32))
  assert env.render(state) == "____\n_O_P\n____\nG___"
  coord = (
      "Board size: 4 rows x 4 cols (zero-indexed).\nStart: (2, 1)\nGoal: (3, 0)\n"
      "Player: (1, 3)\nHoles: (1, 1)"
  )
  assert env.render(state, "coord") == coord
  assert env.render(
      state, "grid_coord"
  ) == "Coordinates: \n" + coord + "\nGrid Map: \n" + env.render(state)
  with pytest.raises(ValueError, match="one player and one goal"):
    env.from_text("____\n_O__\n____\nG___")


def _path_exists(tiles, start, goal):
  """Independent breadth-first search over non-hole tiles."""
  size = tiles.shape[0]
  seen, frontier = {start}, collections.deque([start])
  while frontier:
    r, c = frontier.popleft()
    if (r, c) == goal:
      return True
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
      n = (r + dr, c + dc)
      if 0 <= n[0] < size and 0 <= n[1] < size and n not in seen and tiles[n] != 1:
        seen.add(n)
        frontier.append(n)
  return False


def test_random_maps_are_valid_and_varied():
  env = envs.make("frozenlake")
  states = jax.device_get(
      jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 500))
  )
  starts, goals, holes = set(), set(), []
  for i in range(500):
    tiles = np.asarray(states.tiles_SxS[i])
    start = tuple(int(x) for x in states.start_rc[i])
    goal = tuple(int(x) for x in np.argwhere(tiles == frozenlake.GOAL)[0])
    assert (tiles == frozenlake.GOAL).sum() == 1 and start != goal
    assert tiles[start] == frozenlake.FROZEN and tuple(states.player_rc[i]) == start
    assert _path_exists(tiles, start, goal)
    starts.add(start)
    goals.add(goal)
    holes.append((tiles == frozenlake.HOLE).sum())
  assert len(starts) == 16 and len(goals) == 16  # Start and goal are random, not corners.
  # 14 free tiles with P(hole) = 0.1, slightly fewer after rejecting blocked maps.
  assert 0.9 <= np.mean(holes) <= 1.5


def test_slip_frequencies():
  env = envs.make("frozenlake", success_rate=0.8)
  state = env.from_text("____\n_P__\n____\n___G")
  n = 20000
  keys = jax.random.split(jax.random.PRNGKey(1), n)
  new, *_ = jax.jit(jax.vmap(env.step, in_axes=(0, None, None)))(keys, state, DOWN)
  moves = collections.Counter(map(tuple, np.asarray(new.player_rc) - np.array([1, 1])))
  # Intended Down with 0.8; the perpendiculars Left and Right with 0.1 each; never Up.
  sigma = lambda p: 4 * np.sqrt(p * (1 - p) / n)
  assert abs(moves[(1, 0)] / n - 0.8) < sigma(0.8)
  assert abs(moves[(0, -1)] / n - 0.1) < sigma(0.1)
  assert abs(moves[(0, 1)] / n - 0.1) < sigma(0.1)
  assert moves[(-1, 0)] == 0


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1), actions=st.lists(st.integers(0, 3), min_size=12, max_size=12)
)
def test_random_play_invariants(seed, actions):
  env = envs.make("frozenlake")
  run = _runner(env)
  tiles, (players, rewards, dones) = jax.device_get(
      run(jax.random.PRNGKey(seed), jnp.asarray(actions))
  )
  assert ((players >= 0) & (players < 4)).all()
  for t in range(len(actions)):
    tile = tiles[tuple(players[t])]
    assert rewards[t] == (1.0 if tile == frozenlake.GOAL and (t == 0 or not dones[t - 1]) else 0.0)
    if tile != frozenlake.FROZEN:
      assert dones[t]
    if t and dones[t - 1]:
      assert dones[t] and (players[t] == players[t - 1]).all()
    if t:  # One move at most, to a neighbour.
      assert np.abs(players[t] - players[t - 1]).sum() <= 1


_RUNNERS = {}


def _runner(env):
  if env not in _RUNNERS:

    def run(key, actions):
      state = env.reset(key)

      def body(s, ka):
        s, r, d, _ = env.step(ka[0], s, ka[1])
        return s, (s.player_rc, r, d)

      keys = jax.random.split(jax.random.fold_in(key, 1), actions.shape[0])
      return state.tiles_SxS, jax.lax.scan(body, state, (keys, actions))[1]

    _RUNNERS[env] = jax.jit(run)
  return _RUNNERS[env]

"""Host rendering of the pure-JAX environments: NumPy only, and batched rows equal to single ones."""

import functools

import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax.envs.device import base
from ragen_jax.envs.device import frozenlake
from ragen_jax.envs.device import sokoban

# Every device environment, the grid worlds also in a larger variant.
CASES = {
    "sokoban": ("sokoban", {}),
    "sokoban_7x8_2_boxes": ("sokoban", {"dim_room": (7, 8), "num_boxes": 2}),
    "frozenlake": ("frozenlake", {}),
    "frozenlake_6x6": ("frozenlake", {"size": 6, "p": 0.7}),
    "bandit": ("bandit", {}),
    "2048": ("2048", {}),
}


@functools.lru_cache(maxsize=None)
def reachable_states(case, batch=64, turns=16, seed=0):
  """The case's environment and host states of seeded random play: the batch after reset and
  after each turn (actions include out-of-range ones, which leave a state unchanged)."""
  name, options = CASES[case]
  env = envs.make(name, **options)
  states = jax.jit(env.reset_batch)(jax.random.split(jax.random.key(seed), batch))
  step = jax.jit(jax.vmap(env.step))
  snapshots = [jax.device_get(states)]
  for turn in range(turns):
    keys = jax.random.split(jax.random.key(seed + 1 + turn), batch)
    actions = jax.random.randint(keys[0], (batch,), -1, env.num_actions + 1)
    states, *_ = step(keys, states, actions)
    snapshots.append(jax.device_get(states))
  return env, snapshots


def _coord_lines(shape, entries):
  h, w = shape
  lines = [f"Board size: {h} rows x {w} cols (zero-indexed)."]
  for label, cells in entries:
    if cells:
      lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in sorted(cells)))
  return "\n".join(lines)


def _text(fmt, grid, coord):
  return {"grid": grid, "coord": coord, "grid_coord": base.grid_coord(coord, grid)}[fmt]


def sokoban_reference(state, fmt):
  """RAGEN's Sokoban text written cell by cell: a second implementation to hold against."""
  fixed = np.asarray(state.fixed_HxW)
  h, w = fixed.shape
  boxes = {divmod(int(c), w) for c in np.asarray(state.boxes_K)}
  player = divmod(int(state.player), w)
  targets = {(r, c) for r in range(h) for c in range(w) if fixed[r, c] == sokoban.TARGET}

  def symbol(cell):
    if cell == player:
      return "S" if cell in targets else "P"
    if cell in boxes:
      return "√" if cell in targets else "X"
    return {sokoban.WALL: "#", sokoban.FLOOR: "_", sokoban.TARGET: "O"}[int(fixed[cell])]

  grid = "\n".join("".join(symbol((r, c)) for c in range(w)) for r in range(h))
  coord = _coord_lines(
      (h, w),
      [
          ("Targets", targets),
          ("Boxes", boxes - targets),
          ("Boxes on target", boxes & targets),
          ("Player", {player} - targets),
          ("Player on target", {player} & targets),
      ],
  )
  return _text(fmt, grid, coord)


def frozenlake_reference(state, fmt):
  """RAGEN's FrozenLake text written cell by cell (the start tile is drawn as frozen)."""
  tiles = np.asarray(state.tiles_SxS)
  s = tiles.shape[0]
  player, start = tuple(int(x) for x in state.player_rc), tuple(int(x) for x in state.start_rc)
  cells = lambda code: {(r, c) for r in range(s) for c in range(s) if tiles[r, c] == code}
  holes, goals = cells(frozenlake.HOLE), cells(frozenlake.GOAL)

  def symbol(cell):
    if cell == player:
      return "X" if cell in holes else "√" if cell in goals else "P"
    return "O" if cell in holes else "G" if cell in goals else "_"

  grid = "\n".join("".join(symbol((r, c)) for c in range(s)) for r in range(s))
  coord = _coord_lines(
      (s, s),
      [
          ("Start", {start}),
          ("Goal", goals),
          ("Player", {player} - holes - goals),
          ("Player on goal", {player} & goals),
          ("Player in hole", {player} & holes),
          ("Holes", holes),
      ],
  )
  return _text(fmt, grid, coord)


REFERENCES = {"sokoban": sokoban_reference, "frozenlake": frozenlake_reference}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendering_a_host_state_moves_nothing_to_a_device(case):
  env, snapshots = reachable_states(case)
  states = snapshots[2]
  with jax.transfer_guard("disallow"):
    for fmt in base.TEXT_FORMATS:
      texts = env.render_batch(states, range(8), fmt)
      assert env.render(jax.tree.map(lambda x: x[3], states), fmt) == texts[3]
    if env.name == "sokoban":
      sokoban.solve(jax.tree.map(lambda x: x[0], states), max_depth=4)
      env.expert(jax.tree.map(lambda x: x[0], states))


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_render_equals_per_row_render_on_reachable_states(case):
  """1,088 reachable states per case (a thousand and more of each grid world) in every format:
  the batched render equals the per-row render, and the cell-by-cell reference where one is
  written; rows come back in the order asked, repeats and a subset included."""
  env, snapshots = reachable_states(case)
  reference = REFERENCES.get(env.name)
  for states in snapshots:
    batch = len(states.done)
    one = [jax.tree.map(lambda x, i=i: x[i], states) for i in range(batch)]
    for fmt in base.TEXT_FORMATS:
      texts = env.render_batch(states, range(batch), fmt)
      assert texts == [env.render(state, fmt) for state in one]
      if reference is not None:
        assert texts == [reference(state, fmt) for state in one]
      rows = [5, 0, 5, batch - 1]
      assert env.render_batch(states, rows, fmt) == [texts[i] for i in rows]
      assert not env.render_batch(states, [], fmt)


@pytest.mark.parametrize("case", ["sokoban", "frozenlake"])
def test_device_states_render_as_their_host_copies(case):
  env, snapshots = reachable_states(case)
  states = jax.device_put(snapshots[1])
  host = env.render_batch(snapshots[1], range(4), "grid_coord")
  assert env.render_batch(states, range(4), "grid_coord") == host
  assert env.render(jax.tree.map(lambda x: x[2], states), "grid_coord") == host[2]

"""Sokoban and FrozenLake seen as images: the text environment's play and text unchanged, and
every frame decodes, cell by cell, back to the text's symbols on thousands of reachable states."""

import dataclasses
import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax import vision
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.envs.device import base
from ragen_jax.envs.device import visual
from ragen_jax.warm_start import demos
import tiny  # pylint: disable=g-bad-import-order

TOK = tokenizers.load("sentencepiece")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_PAD = 2050  # <|image_pad|> in the shipped vocabulary with the vision tokens

# visual environment -> its text environment (and game of sprites)
GAMES = {"visual_sokoban": "sokoban", "visual_frozenlake": "frozenlake"}
BATCH, TURNS = 128, 16


@functools.lru_cache(maxsize=None)
def play(name):
  """Seeded random play of the visual environment (out-of-range actions included), each turn
  also stepped by its text environment from the same states with the same keys and actions:
  per snapshot (after reset and each turn) the host states, both step outputs (none after
  reset) and the batch's frames. One level generation compiled: the visual environment's."""
  seen, text = envs.make(name), envs.make(GAMES[name])
  states = jax.jit(seen.reset_batch)(jax.random.split(jax.random.key(3), BATCH))
  steps = [jax.jit(jax.vmap(env.step)) for env in (seen, text)]
  render = jax.jit(jax.vmap(seen.render_image))
  snapshots = [(jax.device_get(states), None, jax.device_get(render(states)))]
  for turn in range(TURNS):
    keys = jax.random.split(jax.random.key(100 + turn), BATCH)
    actions = jax.random.randint(keys[0], (BATCH,), -1, seen.num_actions + 1)
    outputs = [jax.device_get(step(keys, states, actions)) for step in steps]
    states = jax.device_put(outputs[0][0])
    snapshots.append((outputs[0][0], outputs, jax.device_get(render(states))))
  return seen, text, snapshots


def decode(game, frames_BxHxWx3, cell_px):
  """The symbol each cell's pixels show: the one sprite they equal (exactly one, or it fails)."""
  table_KxD = visual.sprite_table(game, cell_px).reshape(len(visual.symbols(game)), -1)
  b, h, w, _ = frames_BxHxWx3.shape
  cells = frames_BxHxWx3.reshape(b, h // cell_px, cell_px, w // cell_px, cell_px, 3)
  cells_BxRxCxD = cells.transpose(0, 1, 3, 2, 4, 5).reshape(b, h // cell_px, w // cell_px, -1)
  match_BxRxCxK = np.all(cells_BxRxCxD[:, :, :, None, :] == table_KxD[None, None, None], axis=-1)
  assert np.all(match_BxRxCxK.sum(axis=-1) == 1), "a cell matches no sprite, or more than one"
  return np.array(visual.symbols(game), object)[match_BxRxCxK.argmax(axis=-1)]


@pytest.mark.parametrize("name", sorted(GAMES))
def test_play_and_text_are_the_text_environments(name):
  """The same transitions, rewards, flags and text in every format on 2,176 reachable states;
  levels, rules and text are the text environment's own functions, options and defaults."""
  seen, text, snapshots = play(name)
  for method in ("reset", "reset_batch", "step", "from_text", "expert"):
    assert getattr(type(seen), method) is getattr(type(text), method), method
  text_options = {f.name: f.default for f in dataclasses.fields(text)}
  seen_options = {f.name: f.default for f in dataclasses.fields(seen)}
  assert seen_options == {**text_options, "cell_px": 14}
  assert seen.name == name and seen.action_names == text.action_names
  assert seen.instruction("grid_coord") == text.instruction("grid_coord")
  assert seen.grid_vocab == text.grid_vocab
  for states, outputs, _ in snapshots:
    if outputs is not None:
      jax.tree.map(np.testing.assert_array_equal, outputs[0], outputs[1])
    for fmt in base.TEXT_FORMATS:
      rows = range(BATCH)
      assert seen.render_batch(states, rows, fmt) == text.render_batch(states, rows, fmt)
    assert seen.render_batch(states, range(3), base.IMAGE) == [visual.IMAGE_TEXT] * 3


@pytest.mark.parametrize("name", sorted(GAMES))
def test_every_frame_decodes_to_the_text_grid(name):
  """Each cell of each frame is exactly one sprite, and that sprite's symbol is the text's:
  2,176 reachable states a game. FrozenLake's image also marks the start tile when the player
  has left it (its text shows it as ice)."""
  seen, text, snapshots = play(name)
  game = GAMES[name]
  left_start = []
  for states, _, frames in snapshots:
    assert frames.dtype == np.uint8 and frames.shape == (BATCH,) + seen.image_shape
    symbols_BxRxC = decode(game, frames, seen.cell_px)
    if game == "frozenlake":
      start_BxRxC = symbols_BxRxC == visual.START
      away_B = np.any(states.player_rc != states.start_rc, axis=-1)
      expected = np.zeros_like(start_BxRxC)
      expected[np.arange(BATCH), states.start_rc[:, 0], states.start_rc[:, 1]] = away_B
      np.testing.assert_array_equal(start_BxRxC, expected)
      left_start.append(away_B.mean())
      symbols_BxRxC = np.where(start_BxRxC, "_", symbols_BxRxC)
    grids = ["\n".join("".join(row) for row in board) for board in symbols_BxRxC]
    assert grids == text.render_batch(states, range(BATCH), "grid")
  if game == "frozenlake":  # the player on the start tile and away from it, both often
    assert left_start[0] == 0 and 0.2 < np.mean(left_start) < 0.9, left_start


@pytest.mark.parametrize("name", sorted(GAMES))
def test_render_image_jits_per_state_as_in_the_batch(name):
  seen, _, snapshots = play(name)
  states, _, frames = snapshots[5]
  one = jax.jit(seen.render_image)(jax.tree.map(lambda x: x[7], states))
  assert one.dtype == jnp.uint8 and one.shape == seen.image_shape
  np.testing.assert_array_equal(np.asarray(one), frames[7])
  # Eager (no jit) paints the same pixels.
  eager = seen.render_image(jax.tree.map(lambda x: x[3], states))
  np.testing.assert_array_equal(np.asarray(eager), frames[3])


def test_hand_built_boards():
  """Known boards drawn cell by cell: Sokoban's seven symbols and FrozenLake's six plus the
  start tile, each where the text puts it."""
  env = envs.make("visual_sokoban", num_boxes=3)
  for board in [
      "######\n#_O√_#\n#_X__#\n#_P__#\n#O_X_#\n######",
      "######\n#_S√_#\n#_X__#\n#____#\n#O_X_#\n######",
  ]:
    frame = np.asarray(env.render_image(env.from_text(board)))
    assert frame.shape == (84, 84, 3)
    assert "\n".join("".join(r) for r in decode("sokoban", frame[None], 14)[0]) == board

  lake = envs.make("visual_frozenlake", cell_px=28)
  state = lake.from_text("____\n_O_P\n____\nG___").replace(start_rc=jnp.array([2, 1], jnp.int32))
  frame = np.asarray(lake.render_image(state))
  assert frame.shape == lake.image_shape == (112, 112, 3)
  expected = [list("____"), list("_O_P"), ["_", visual.START, "_", "_"], list("G___")]
  np.testing.assert_array_equal(decode("frozenlake", frame[None], 28)[0], np.array(expected))
  for board in ["____\n_X__\n____\n___G", "____\n____\n____\n___√"]:
    frame = np.asarray(lake.render_image(lake.from_text(board)))
    assert "\n".join("".join(r) for r in decode("frozenlake", frame[None], 28)[0]) == board


@pytest.mark.parametrize("game", ["sokoban", "frozenlake"])
@pytest.mark.parametrize("cell_px", [8, 14, 28])
def test_sprites_differ_clearly(game, cell_px):
  """Every two symbols differ by a plain change of colour (60 levels in some channel) on at
  least a tenth of the cell's pixels, at the smallest size allowed and larger."""
  table = visual.sprite_table(game, cell_px).astype(np.int32)
  assert table.shape == (len(visual.symbols(game)), cell_px, cell_px, 3)
  for i in range(len(table)):
    for j in range(i + 1, len(table)):
      changed = np.abs(table[i] - table[j]).max(axis=-1) >= 60
      assert changed.mean() >= 0.1, (visual.symbols(game)[i], visual.symbols(game)[j])


def _frames_to_patches(env, states):
  return vision.preprocess(jax.vmap(env.render_image)(states))


def test_frames_go_to_the_vision_tower_without_resampling():
  """6x6 Sokoban's 84x84 frame is 6x6 patches (9 LLM tokens), 4x4 FrozenLake's 56x56 is 4x4
  (4 tokens): jax.numpy from render to pixel values, one jitted function."""
  for name, tokens in [("visual_sokoban", 9), ("visual_frozenlake", 4)]:
    seen, _, snapshots = play(name)
    states, _, frames = snapshots[1]
    h, w, _ = seen.image_shape
    assert vision.smart_resize(h, w) == (h, w) and vision.num_tokens(h, w) == tokens

    frames_to_patches = jax.jit(functools.partial(_frames_to_patches, seen))
    values, grid = frames_to_patches(jax.tree.map(lambda x: x[:2], states))
    assert values.shape == (2 * tokens * 4, 1176)
    np.testing.assert_array_equal(np.asarray(values), vision.preprocess(frames[:2])[0])
    assert np.asarray(grid).tolist() == [[1, h // 14, w // 14]] * 2


def test_image_interface_and_options():
  assert envs.make("sokoban").image_shape is None
  with pytest.raises(ValueError, match="'frozenlake' has no image observation"):
    envs.make("frozenlake").render_image(None)
  assert envs.make("visual_sokoban", dim_room=(8, 8), num_boxes=2).image_shape == (112, 112, 3)
  with pytest.raises(ValueError, match="visual_sokoban.cell_px must be an integer >= 8"):
    envs.make("visual_sokoban", cell_px=4)
  with pytest.raises(ValueError, match="'cell'.*valid options"):
    envs.make("visual_frozenlake", cell=14)


GRID_LINE = re.compile(r"^[P_OGX√]{4}$", re.MULTILINE)  # a row of a 4x4 FrozenLake board


def scripted(render_format):
  """A noise-free expert's demonstrations of 4 levels of visual FrozenLake in `render_format`."""
  config = tiny.rollout_config(
      env_groups=4, group_size=1, max_actions_per_turn=1, render_format=render_format
  )
  engine = rollout.Rollout(envs.make("visual_frozenlake"), TOK, config)
  policy = demos.expert_policy(engine.env, engine.config, 0.0, seed=0)
  return engine.run_scripted(policy, jax.random.key(0), seed=40)


def test_image_format_shows_the_board_only_in_the_frame():
  """Format "image": every user turn holds the frame and no grid row, the system prompt
  describes the picture instead of the text legend; play and rewards are the grid format's."""
  image, grid = scripted(base.IMAGE), scripted("grid")
  for shown, text in zip(image.episodes, grid.episodes):
    users = [m["content"] for m in shown.messages if m["role"] == "user"]
    assert len(users) == len(shown.turns) >= 1
    assert all(visual.IMAGE_TEXT in u and not GRID_LINE.search(u) for u in users)
    assert all(GRID_LINE.search(m["content"]) for m in text.messages if m["role"] == "user")
    system = shown.messages[0]["content"]
    assert "red coat" in system and "meaning of each symbol" not in system
    assert "meaning of each symbol" in text.messages[0]["content"]
    assert [t.reward for t in shown.turns] == [t.reward for t in text.turns]
  np.testing.assert_array_equal(image.metrics["num_actions"], grid.metrics["num_actions"])
  assert image.summary["success"] == grid.summary["success"] > 0
  # Each turn's prompt still opens with its frame: 4 image tokens a turn in every row.
  tokens, mask = (np.asarray(x) for x in (image.batch.tokens_BxT, image.batch.attention_mask_BxT))
  turns_B = np.array([len(ep.turns) for ep in image.episodes])
  np.testing.assert_array_equal(np.sum((tokens == IMAGE_PAD) & (mask > 0), axis=1), 4 * turns_B)
  np.testing.assert_array_equal(image.frames_KxBxHxWx3, grid.frames_KxBxHxWx3)


def test_image_format_is_refused_for_text_environments():
  config = tiny.rollout_config(render_format=base.IMAGE)
  for name in ("frozenlake", "bandit"):
    with pytest.raises(ValueError, match=f"{name!r} is not drawn as one"):
      rollout.Rollout(envs.make(name), TOK, config)
  with pytest.raises(ValueError, match="needs a visual environment"):
    envs.make("frozenlake").render_batch(scripted_states(), [0], base.IMAGE)
  # The config is refused when it is read, naming the key.
  config = cli.load_config_file(os.path.join(ROOT, "configs", "frozenlake_grpo.py"))
  config.envs.frozenlake.render_format = base.IMAGE
  with pytest.raises(ValueError, match="envs.frozenlake: render_format 'image'"):
    schema.from_config(config)


def scripted_states():
  env = envs.make("frozenlake")
  return jax.device_get(jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 1)))

"""Rollouts and sampling with images (Qwen2.5-VL): the cached paths against one full forward.

A random `tiny-vl` model plays visual Sokoban; every turn's prompt carries that turn's frame
(drawn and preprocessed on the device, the tower run once per frame) and the KV cache is kept
across turns with the positions the images imply (rope delta). The reference is the model's
full forward over the final sequences with all their images, preprocessed on the host by the
NumPy path (transformers' pixel_values and image_grid_thw), padded rows included. The update
on the rollouts' batches (full context and a window's rows, GRPO and GAE with the text-only
critic) is checked against the sampler's log-probs and a NumPy GAE.

With dynamic sampling, a batch assembled from two rounds' groups carries each kept episode's own
frames (as its round showed them) and the update's forward reproduces the sampler's log-probs on
it.

Dimension legend: B episodes, T sequence, K turns, V vocab.
"""

# pylint: disable=redefined-outer-name  # pytest passes fixtures as arguments of their name

import types

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax import vision
from ragen_jax.algos import critic as critic_lib
from ragen_jax.algos import train_step
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import StepSpec
from ragen_jax.models import mrope
from ragen_jax.rollout import episodes as episodes_lib
from ragen_jax.rollout import images
from ragen_jax.train import batching
from ragen_jax.train import dynamic_sampling
from references import ref_gae  # pylint: disable=g-bad-import-order
from references import ref_token_logprobs  # pylint: disable=g-bad-import-order
import tiny  # pylint: disable=g-bad-import-order
from tiny import rollout_config  # pylint: disable=g-bad-import-order

TOK = tokenizers.load("sentencepiece")
TEMPERATURE = 0.8  # tiny.rollout_config's
VISION_TOKENS = (2048, 2049, 2050, 2051)  # the tiny-vl preset's


@pytest.fixture(scope="module")
def model():
  return models.create("tiny-vl", jax.random.key(0))


def vary_frames(monkeypatch, seed=5):
  """Every turn draws new random frames (on the device), so that no two turns show the same
  image: a random model's invalid moves would leave Sokoban's frames unchanged, and a wrong
  turn's features would go unseen."""
  rng = np.random.default_rng(seed)
  monkeypatch.setattr(
      images.ImageTurns,
      "frames",
      lambda self, envs: jax.numpy.asarray(rng.integers(0, 256, (4, 84, 84, 3), np.uint8)),
  )


@pytest.fixture
def varied_frames(monkeypatch):
  vary_frames(monkeypatch)


@pytest.fixture(scope="module")
def window(model):
  """A last_k (k = 1) rollout on varied frames: (config, result, the tower's input shapes)."""
  tower_calls = []
  run_tower = images.frame_features
  with pytest.MonkeyPatch.context() as mp:
    vary_frames(mp)
    mp.setattr(
        images,
        "frame_features",
        lambda g, p, frames: tower_calls.append(frames.shape) or run_tower(g, p, frames),
    )
    config = rollout_config(context_window="last_k", window_turns=1)
    engine = rollout.Rollout(envs.make("visual_sokoban"), TOK, config)
    result = engine.run(rollout.ModelPolicy(model), jax.random.key(2), seed=11)
  return config, result, tower_calls


def largest_change(before, after) -> float:
  """The largest absolute change of any parameter between two trees of one structure."""
  return max(
      float(np.abs(a - np.asarray(b)).max())
      for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
  )


def token_logprobs(logits_BxTxV, tokens_BxT, temperature):
  """float64 [B, T - 1]: log-prob of each next token over the policy's support (the vision
  tokens excluded: `ModelConfig.excluded_token_ids`)."""
  return ref_token_logprobs(logits_BxTxV, tokens_BxT, temperature, VISION_TOKENS)


def test_image_turn_tokens_by_hand():
  shown = images.make(envs.make("visual_sokoban"), TOK)
  start, end, pad = (
      TOK.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
  )
  assert (start, end, pad) == (2048, 2049, 2050)  # the tiny-vl preset's ids
  assert shown.tokens_per_image == 9  # 84 x 84 pixels: 6 x 6 patches, 2 x 2 per token
  ids = shown.encode("a" + shown.mark("b"))
  assert ids == TOK.encode("a") + [start] + [pad] * 9 + [end] + TOK.encode("b")
  assert images.make(envs.make("sokoban"), TOK).encode("a" + images.MARK) == TOK.encode(
      "a" + images.MARK
  )
  # The frames: every row's state drawn on the device, as render_image draws each alone.
  env = envs.make("visual_sokoban")
  states = jax.jit(env.reset_batch)(jax.vmap(jax.random.key)(np.arange(2)))
  frames = np.asarray(shown.frames(types.SimpleNamespace(device_states=states)))
  assert frames.shape == (2, 84, 84, 3) and np.any(frames[0] != frames[1])
  one = jax.tree.map(lambda a: a[1], states)
  np.testing.assert_array_equal(frames[1], np.asarray(jax.jit(env.render_image)(one)))


def test_multi_turn_rollout_with_images_equals_a_full_forward(model, varied_frames, monkeypatch):
  del varied_frames
  outcome = rollout.Rollout._outcome  # pylint: disable=protected-access

  def end_episode_1_after_turn_1(engine, ep, result, turn):
    outcome(engine, ep, result, turn)
    ep.done |= (ep.group_id, ep.index_in_group) == (0, 1)

  # A row that stops playing keeps its place in the fixed batch, with no image in its chunks.
  monkeypatch.setattr(rollout.Rollout, "_outcome", end_episode_1_after_turn_1)
  engine = rollout.Rollout(envs.make("visual_sokoban"), TOK, rollout_config())
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(1), seed=7)
  batch, eps = result.batch, result.episodes
  tokens, mask = np.asarray(batch.tokens_BxT), np.asarray(batch.attention_mask_BxT)
  loss, lp = np.asarray(batch.loss_mask_BxT), np.asarray(batch.logprobs_BxT)
  frames = np.asarray(result.frames_KxBxHxWx3)
  assert frames.shape[1:] == (4, 84, 84, 3) and frames.dtype == np.uint8
  # Each turn's prompt holds one image: 9 image tokens a turn, in every row.
  turns_B = np.array([len(ep.turns) for ep in eps])
  assert turns_B[1] == 1 and turns_B.max() == 3
  assert np.all(np.sum((tokens == 2050) & (mask > 0), axis=1) == 9 * turns_B)
  assert len(set(np.sum(mask, axis=1).tolist())) > 1  # rows of different lengths (padding)
  # The reference: one forward over the final sequences, every image of every row in order.
  shown = [frames[t, i] for i in range(len(eps)) for t in range(turns_B[i])]
  pixel_values, grid_thw = vision.preprocess(shown)  # the host (NumPy) path
  logits = model(tokens, mask, pixel_values=pixel_values, image_grid_thw=grid_thw)
  ref = token_logprobs(logits, tokens, TEMPERATURE)
  trained = loss[:, 1:] > 0
  assert trained.sum() == result.metrics["response_length"].sum() > 0
  assert np.max(np.abs(lp[:, 1:][trained] - ref[trained])) <= 1e-4
  # Without the images (their pad tokens' embeddings), the replies' log-probs differ: the
  # check above sees them.
  blind = token_logprobs(model(tokens, mask), tokens, TEMPERATURE)
  assert np.max(np.abs(lp[:, 1:][trained] - blind[trained])) > 1e-3


def test_a_window_reuses_kept_features_and_equals_a_fresh_forward(model, window):
  """last_k (k = 1): each turn's prompt re-prefills the kept turn with its image; the tower
  runs once per turn on the new frames only, and every row's log-probs equal a fresh forward of
  that row's windowed prompt with its images."""
  config, result, tower_calls = window
  batch, eps, k = result.batch, result.episodes, config.max_turns
  frames = np.asarray(result.frames_KxBxHxWx3)
  assert tower_calls == [(4, 84, 84, 3)] * frames.shape[0]  # once per turn, new frames only
  tokens, mask = np.asarray(batch.tokens_BxT), np.asarray(batch.attention_mask_BxT)
  loss, lp = np.asarray(batch.loss_mask_BxT), np.asarray(batch.logprobs_BxT)
  shown, two_images = [], 0
  for i, ep in enumerate(eps):
    for j, turn in enumerate(ep.turns):
      seen = list(range(turn.shown_from, j + 1))  # the kept turn (if any), then this one
      shown += [frames[t, i] for t in seen]
      two_images += len(seen) == 2
      assert np.sum((tokens[i * k + j] == 2050) & (mask[i * k + j] > 0)) == 9 * len(seen)
  assert two_images > 0  # some prompt re-shows a kept turn's image
  pixel_values, grid_thw = vision.preprocess(shown)
  logits = model(tokens, mask, pixel_values=pixel_values, image_grid_thw=grid_thw)
  ref = token_logprobs(logits, tokens, TEMPERATURE)
  trained = loss[:, 1:] > 0
  assert trained.sum() == result.metrics["response_length"].sum() > 0
  assert np.max(np.abs(lp[:, 1:][trained] - ref[trained])) <= 1e-4


def test_window_rows_train_on_their_own_frames_with_a_text_critic(model, window):
  """GAE with the separate critic on the window's rows (one a turn, each showing its kept and
  current frames): the update's first pass gives every row the rollout's log-probs (its own
  frames spliced: shifted by one row they differ), the critic reads the tokens alone (the critic
  module on the ids, no tower), the advantages are a NumPy GAE along each episode's rows on
  those values and the rollout's rewards, and the train step (with train_vision_tower) trains
  the decoder, the tower and the critic."""
  config, result, _ = window
  k, gamma, lam = config.max_turns, 0.9, 0.8
  batch = batching.join_batches([result.batch], 64, TOK.pad_id)
  batch = batch.replace(scores_B=np.array([1.0, 0.0, 2.0, 0.5], np.float32))  # all groups kept
  rows, width = batch.tokens_BxT.shape
  cfg = algos.PPOConfig(
      adv_estimator="gae",
      gamma=gamma,
      lam=lam,
      num_minibatches=2,
      vocab_chunk=64,
      actor_lr=1e-3,
      critic_lr=1e-3,
      train_vision_tower=True,
  )
  # A random value head (the critic starts at 0 everywhere), in the state and the reference.
  kernel = jax.random.normal(jax.random.key(7), (model.config.hidden_size,), jnp.float32)
  state = algos.init_train_state(model, None, cfg, jax.random.key(1))
  state = state.replace(critic_params={**state.critic_params, "value_kernel": kernel})
  response = algos.response_width(batch.loss_mask_BxT)
  spec = StepSpec(
      cfg=cfg,
      actor=ModelGraph.of(model),
      ref=ModelGraph.of(model),
      critic=critic_lib.make_critic(cfg, model),
      actor_tx=None,  # the stages below take no optimizer step
      critic_tx=None,
      temperature=TEMPERATURE,
      width=response,
  )

  @jax.jit
  def stages(state, batch):
    sel = train_step.order_and_filter(cfg, batch)
    old = train_step.old_pass(spec, state, sel, rows // cfg.num_minibatches)
    return sel.row_order_R, old.logp_BxT, train_step.advantages(cfg, sel, old)

  order, logp, adv = stages(state, jax.tree.map(jnp.asarray, batch))
  canonical = lambda x: np.asarray(x)[np.argsort(np.asarray(order))]  # the rollout's row order
  mask = np.asarray(batch.loss_mask_BxT) > 0
  played = mask.any(axis=1)
  assert played.sum() == sum(len(ep.turns) for ep in result.episodes) > 4
  # Each row's log-probs are the sampler's; with every row's frames those of the row before
  # (another turn's or episode's), every played row's differ.
  diff = np.abs(canonical(logp) - np.asarray(batch.logprobs_BxT)) * mask
  assert diff.max() <= 1e-5
  frames = np.asarray(batch.frames_BxNxHxWx3)
  shifted = batch.replace(frames_BxNxHxWx3=np.roll(frames, 1, axis=0))
  _, wrong, _ = stages(state, jax.tree.map(jnp.asarray, shifted))
  wrong_diff = np.abs(canonical(wrong) - np.asarray(batch.logprobs_BxT)) * mask
  assert wrong_diff.max(axis=1)[played].min() > 1e-3
  # The critic: the module on the ids and mask alone, read one position back (veRL).
  critic = models.critic_from_policy(model)
  critic.value_kernel.set_value(kernel)
  values = np.asarray(
      nnx.jit(lambda c, ids, m: c(ids, m))(critic, batch.tokens_BxT, batch.attention_mask_BxT),
      np.float64,
  )
  values = np.pad(values[:, :-1], ((0, 0), (1, 0))) * mask
  np.testing.assert_allclose(canonical(adv.values_BxT), values, rtol=1e-5, atol=1e-5)
  # GAE along each episode's K rows in turn order: one [B, K * T] sequence an episode.
  rewards = np.asarray(batch.token_rewards_BxT, np.float64)
  assert np.any(rewards[mask] != 0)
  join = lambda x: np.asarray(x).reshape(rows // k, k * width)
  want_adv, want_returns = ref_gae(
      join(rewards), join(values), join(mask).astype(np.int32), gamma, lam
  )
  for got, want in ((adv.adv_BxT, want_adv), (adv.returns_BxT, want_returns)):
    np.testing.assert_allclose(join(canonical(got))[join(mask)], want[join(mask)], atol=1e-4)
  # One train step on the same rows: the sampler's probabilities again, both models move.
  step = algos.make_train_step(model, None, cfg, temperature=TEMPERATURE)
  before = jax.tree.map(np.array, (state.actor_params, state.critic_params))
  state, metrics = step(
      state, jax.tree.map(jnp.asarray, batch), jax.random.key(2), response_width=response
  )
  assert float(metrics["training/rollout_probs_diff_max"]) < 1e-7
  assert float(metrics["critic/values/mean"]) == pytest.approx(values[mask].mean(), abs=1e-5)
  after = (state.actor_params, state.critic_params)
  for part, name in ((0, "decoder"), (0, "visual"), (1, "decoder"), (1, "value_kernel")):
    assert largest_change(before[part][name], after[part][name]) > 0, (part, name)


def test_generate_with_images_equals_a_full_forward(model):
  rng = np.random.default_rng(0)
  frames = rng.integers(0, 256, (3, 56, 84, 3), np.uint8)  # 2 x 3 image tokens each
  pixel_values, grid_thw = vision.preprocess(list(frames))
  block = lambda: [2048] + [2050] * 6 + [2049]
  rows = [
      TOK.encode("look:") + block() + TOK.encode("and") + block() + TOK.encode("move"),
      TOK.encode("a longer prompt, then") + block() + TOK.encode("go"),
  ]
  ids, mask = tiny.left_padded_rows(rows)
  width = ids.shape[1]
  options = sampling.SamplingOptions(max_new_tokens=8, temperature=TEMPERATURE, pad_id=0)
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(3),
      options=options,
      pixel_values=pixel_values,
      image_grid_thw=grid_thw,
  )
  n = np.asarray(out.lengths_B)
  assert np.all(n == 8)  # no stop token: every row samples 8 tokens
  full = np.concatenate([ids, np.asarray(out.tokens_BxN)], axis=1)
  full_mask = np.concatenate([mask, np.ones((2, 8), np.int32)], axis=1)
  logits = model(full, full_mask, pixel_values=pixel_values, image_grid_thw=grid_thw)
  ref = token_logprobs(logits, full, TEMPERATURE)[:, width - 1 :]
  np.testing.assert_allclose(np.asarray(out.logprobs_BxN), ref, atol=1e-4)


def test_the_update_splices_the_rollouts_images(model, varied_frames):
  """A train step's first pass over a batch with images reproduces the sampler's log-probs
  (each row's frames through the tower, spliced, positions from the ids on the device); the
  tower stays frozen by default, weight decay included (it trains with train_vision_tower: the
  window test below)."""
  del varied_frames
  engine = rollout.Rollout(envs.make("visual_sokoban"), TOK, rollout_config())
  result = engine.run(rollout.ModelPolicy(model), jax.random.key(4), seed=3)
  frames = np.asarray(result.batch.frames_BxNxHxWx3)
  everything = np.asarray(result.frames_KxBxHxWx3)
  assert frames.shape == (4, 3, 84, 84, 3)
  for i, ep in enumerate(result.episodes):  # row i shows its turns' frames in order
    np.testing.assert_array_equal(frames[i, : len(ep.turns)], everything[: len(ep.turns), i])
  batch = batching.join_batches([result.batch], 64, TOK.pad_id)
  batch = batch.replace(scores_B=np.array([1.0, 0.0, 2.0, 0.5], np.float32))
  width = algos.response_width(batch.loss_mask_BxT)
  cfg = algos.PPOConfig(
      adv_estimator="grpo", num_minibatches=2, vocab_chunk=64, actor_lr=1e-3, weight_decay=0.1
  )
  state = algos.init_train_state(model, None, cfg, jax.random.key(1))
  before = jax.tree.map(np.array, state.actor_params)
  step = algos.make_train_step(model, None, cfg, temperature=TEMPERATURE)
  state, metrics = step(
      state, jax.tree.map(jnp.asarray, batch), jax.random.key(2), response_width=width
  )
  # Probabilities of a random model over 2052 tokens are small: the update's forward
  # without the images differs by ~4e-5 here, with them by ~5e-10.
  assert float(metrics["training/rollout_probs_diff_max"]) < 1e-7
  assert largest_change(before["decoder"], state.actor_params["decoder"]) > 0
  assert largest_change(before["visual"], state.actor_params["visual"]) == 0


def test_positions_on_the_device_equal_the_hosts():
  """`fixed_grid_positions` (jnp, for the update) against `rope_index` (NumPy): images of 2 x 3
  tokens at the start, middle and end of left-padded rows, one row without any."""
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 50, (4, 40))
  mask = np.ones((4, 40), np.int32)
  mask[0, :7], mask[2, :20] = 0, 0
  starts = {0: [10, 30], 1: [0, 6, 34], 2: [25]}
  for row, at in starts.items():
    for s in at:
      ids[row, s : s + 6] = 99
  grids = np.tile([[1, 4, 6]], (sum(len(a) for a in starts.values()), 1))
  want, _ = mrope.rope_index(ids, mask, grids, image_token_id=99, spatial_merge_size=2)
  got = mrope.fixed_grid_positions(
      jnp.asarray(ids), jnp.asarray(mask), image_token_id=99, rows=2, cols=3
  )
  np.testing.assert_array_equal(np.asarray(got), want)


def test_taken_episodes_carry_their_frames_by_hand():
  """Column j of the frames is picked episode j's; a result that played fewer turns (or none:
  no frames) is blank past its own."""
  rng = np.random.default_rng(1)
  a = rng.integers(1, 256, (2, 3, 4, 4, 3), np.uint8)  # 2 turns, 3 episodes
  b = rng.integers(1, 256, (3, 2, 4, 4, 3), np.uint8)  # 3 turns, 2 episodes

  def result(frames, n, first_seed):
    eps = [rollout.Episode(first_seed + i, [], None, 1, 1) for i in range(n)]
    return rollout.RolloutResult(None, {}, {}, eps, frames)

  results = [result(a, 3, 0), result(None, 2, 10), result(b, 2, 20)]
  picks = [(2, 1), (0, 0), (1, 1), (0, 2)]
  eps, frames = episodes_lib.take_episodes(results, picks)
  assert [ep.seed for ep in eps] == [21, 0, 11, 2]
  want = np.zeros((3, 4, 4, 4, 3), np.uint8)
  want[:, 0] = b[:, 1]
  want[:2, 1] = a[:, 0]
  want[:2, 3] = a[:, 2]
  np.testing.assert_array_equal(np.asarray(frames), want)
  assert episodes_lib.take_episodes([result(None, 2, 0)], [(0, 1)])[1] is None  # text


def test_dynamic_sampling_rows_splice_each_kept_episodes_frames(model, monkeypatch):
  """Round 0's group 1 and round 1's group 0 (level seeds 1 and 100) are the only groups with
  reward spread: the batch is assembled from two rounds. Each row carries the frames its episode
  was shown in its own round, and the update's first forward on the batch reproduces the
  sampler's log-probs; given another row's frames it does not."""
  outcome = rollout.Rollout._outcome  # pylint: disable=protected-access

  def spread_on_levels_1_and_100(engine, ep, result, turn):
    outcome(engine, ep, result, turn)
    spread = turn == 1 and ep.seed in (1, 100) and ep.index_in_group == 1
    ep.turns[-1].env_reward, ep.turns[-1].penalty, ep.turns[-1].shaping = float(spread), 0, 0

  monkeypatch.setattr(rollout.Rollout, "_outcome", spread_on_levels_1_and_100)
  engine = rollout.Rollout(envs.make("visual_sokoban"), TOK, rollout_config())
  rounds, run = [], engine.run
  monkeypatch.setattr(engine, "run", lambda *args: rounds.append(run(*args)) or rounds[-1])
  result = dynamic_sampling.play_groups(
      engine, rollout.ModelPolicy(model), 3, jax.random.key, lambda r: 100 * r
  )
  assert len(rounds) == 2 and [ep.seed for ep in result.episodes] == [1, 1, 100, 100]
  kept = [(0, 2), (0, 3), (1, 0), (1, 1)]  # (round, episode) of each row
  frames = np.asarray(result.batch.frames_BxNxHxWx3)
  everything = np.asarray(result.frames_KxBxHxWx3)
  mask = np.asarray(result.batch.attention_mask_BxT) > 0
  for i, (r, e) in enumerate(kept):
    own, n = rounds[r], len(result.episodes[i].turns)
    assert n == len(own.episodes[e].turns) >= 1
    np.testing.assert_array_equal(frames[i, :n], np.asarray(own.batch.frames_BxNxHxWx3)[e, :n])
    np.testing.assert_array_equal(everything[:n, i], np.asarray(own.frames_KxBxHxWx3)[:n, e])
    own_mask = np.asarray(own.batch.attention_mask_BxT)[e] > 0
    assert (
        np.asarray(result.batch.tokens_BxT)[i][mask[i]].tolist()
        == np.asarray(own.batch.tokens_BxT)[e][own_mask].tolist()
    )
  assert not np.array_equal(frames[0, 0], frames[2, 0])  # the two levels look different
  batch = batching.join_batches([result.batch], 64, TOK.pad_id)
  width = algos.response_width(batch.loss_mask_BxT)
  cfg = algos.PPOConfig(adv_estimator="grpo", num_minibatches=2, vocab_chunk=64)
  step = algos.make_train_step(model, None, cfg, temperature=TEMPERATURE)

  def probs_diff_max(b):
    state = algos.init_train_state(model, None, cfg, jax.random.key(1))
    _, metrics = step(state, jax.tree.map(jnp.asarray, b), jax.random.key(2), response_width=width)
    return float(metrics["training/rollout_probs_diff_max"])

  assert probs_diff_max(batch) < 1e-7
  # The rows of one round given the other round's frames fail the check (~4e-6 here, ~5e-10
  # with their own): the update's forward splices each row's frames.
  swapped = batch.replace(frames_BxNxHxWx3=batch.frames_BxNxHxWx3[[2, 3, 0, 1]])
  assert probs_diff_max(swapped) > 1e-7

"""The collapse diagnostics of a visual environment: each prompt scored with its own frames.

A random `tiny-vl` policy; two episodes of two turns whose user messages read the same but show
different random frames (as a colour bandit's arms do), so only the images tell their prompts
apart. The reference is the model's full forward over each [x_j | z_i] with x_j's images,
preprocessed on the host (transformers' pixel_values and image_grid_thw).

Dimension legend: S reasonings, P prompt columns, T tokens, V vocab.
"""

import types

import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax import vision
from ragen_jax.diagnostics import collapse
from ragen_jax.diagnostics import prompt_images
from ragen_jax.diagnostics import scoring
from ragen_jax.diagnostics import turns as turns_lib
from ragen_jax.rollout import images

TOK = tokenizers.load("sentencepiece")
REPLIES = (
    ("<think>the red one</think><answer>Up</answer>", "<think>up again</think><answer>Up</answer>"),
    (
        "<think>blue, go left</think><answer>Left</answer>",
        "<think>left</think><answer>Left</answer>",
    ),
)


@pytest.fixture(scope="module", name="model")
def model_fixture():
  return models.create("tiny-vl", jax.random.key(0))


@pytest.fixture(scope="module", name="step")
def step_fixture():
  """({tag: result-like}, frames_KxBxHxWx3): two groups of one episode, two turns each."""
  shown = images.make(envs.make("visual_sokoban"), TOK)
  frames = np.random.default_rng(0).integers(0, 256, (2, 2, 84, 84, 3), np.uint8)
  eps = []
  for b, replies in enumerate(REPLIES):
    ep = rollout.Episode(0, [], None, 10, 1, group_id=b)
    for t, reply in enumerate(replies):
      context = shown.encode(shown.mark(f"Turn {t + 1}: which way?\n<think>"))
      ep.turns.append(rollout.Turn(context, TOK.encode(reply), text=reply))
    eps.append(ep)
  result = types.SimpleNamespace(episodes=eps, frames_KxBxHxWx3=frames)
  return {"visual_sokoban": result}, frames


def test_columns_carry_the_frames_their_prompts_show(step):
  results, frames = step
  turns = turns_lib.collect_turns(results, TOK)
  assert [(t.episode, t.turn, t.shown) for t in turns] == [
      (0, 0, (0,)),
      (0, 1, (0, 1)),
      (1, 0, (0,)),
      (1, 1, (0, 1)),
  ]
  first = turns_lib.first_turn_sample(turns, 8, np.random.default_rng(0))
  assert first.column_frames == [(0, (0,)), (1, (0,))]
  # The two first prompts are token-identical; their frames are not: two columns.
  assert np.array_equal(first.prompts[0], first.prompts[1])
  assert first.column_ids.tolist() == [0, 0]
  got = prompt_images.of_results(results).for_columns(first.column_frames)
  np.testing.assert_array_equal(np.asarray(got.frames_PxNxHxWx3)[:, 0], frames[0])
  assert got.column_ids(first.column_ids).tolist() == [0, 1]
  assert prompt_images.TextPrompts().column_ids(first.column_ids).tolist() == [0, 0]
  # A second turn shows both turns' frames; a first turn's repeats its only one.
  got = prompt_images.of_results(results).for_columns([(1, (0, 1)), (0, (0,))])
  np.testing.assert_array_equal(np.asarray(got.frames_PxNxHxWx3), [frames[:, 1], frames[[0, 0], 0]])
  text = {"sokoban": types.SimpleNamespace(episodes=[], frames_KxBxHxWx3=None)}
  assert isinstance(prompt_images.of_results(text), prompt_images.NoFrames)
  with pytest.raises(ValueError, match="mixes"):
    prompt_images.of_results({**results, **text})


def test_compute_scores_each_family_with_its_columns_frames(step, monkeypatch):
  """The trainer's route (`compute(..., frames=step_frames(results))`), the scoring stubbed: each
  family's columns reach it with their own frames, and the frames split token-identical ones."""
  results, frames = step
  seen = []

  def fake_scoring(model, reasonings, prompts, **kwargs):
    del model
    seen.append((len(prompts), kwargs["images"]))
    # Own column highest: with merged identical columns retrieval could not tell them apart.
    logp = np.where(np.eye(len(reasonings), len(prompts)) > 0, -1.0, -50.0)
    return logp, np.ones(len(reasonings), np.int32)

  monkeypatch.setattr(scoring, "cross_logprobs", fake_scoring)
  cfg = collapse.CollapseConfig(num_samples=2, multi_turn_samples=3)
  turns = turns_lib.collect_turns(results, TOK)
  m, _ = collapse.compute(
      None,
      turns,
      cfg,
      np.random.default_rng(0),
      {},
      pad_id=TOK.pad_id,
      frames=prompt_images.of_results(results),
  )
  assert len(seen) == 2  # first turn, multi-turn
  (p_first, first), (p_multi, multi) = seen[0], seen[1]
  assert p_first == 2 and isinstance(first, prompt_images.FramePrompts)
  np.testing.assert_array_equal(np.asarray(first.frames_PxNxHxWx3)[:, 0], frames[0])
  assert p_multi == 3 and np.asarray(multi.frames_PxNxHxWx3).shape[:2] in ((3, 1), (3, 2))
  assert m["collapse/first_turn/retrieval_acc_top1"] == 1.0  # two columns, not one id
  assert m["collapse/first_turn/retrieval_chance_top1"] == 0.5


def _log_softmax(logits):
  """float64 log-probs over the policy's support: the vision tokens (2048-2051) excluded."""
  logits = np.array(logits, np.float64)
  logits[..., 2048:2052] = -np.inf
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def test_cross_scores_equal_a_full_forward_with_each_prompts_images(model, step):
  results, frames = step
  turns = turns_lib.collect_turns(results, TOK)
  sample = turns_lib.Sample(
      [t.reasoning for t in turns],
      [t.context for t in turns],
      np.arange(4, dtype=np.int32),
      np.arange(4, dtype=np.int32),
      [(t.episode, t.shown) for t in turns],
  )
  shown = prompt_images.of_results(results).for_columns(sample.column_frames)
  logp, num = scoring.cross_logprobs(
      model, sample.reasonings, sample.prompts, pad_id=TOK.pad_id, micro_batch=8, images=shown
  )
  assert logp.shape == (4, 4) and num.tolist() == [len(t.reasoning) for t in turns]
  # The reference: every pair [x_j | z_i] as a right-padded row, x_j's frames in order.
  pairs = [(i, j) for i in range(4) for j in range(4)]
  width = max(len(sample.prompts[j]) + len(sample.reasonings[i]) for i, j in pairs)
  ids, mask, pictures = np.zeros((16, width), np.int32), np.zeros((16, width), np.int32), []
  for r, (i, j) in enumerate(pairs):
    row = list(sample.prompts[j]) + list(sample.reasonings[i])
    ids[r, : len(row)], mask[r, : len(row)] = row, 1
    episode, shown_turns = sample.column_frames[j]
    pictures += [frames[t, episode] for t in shown_turns]
  pixel_values, grid_thw = vision.preprocess(pictures)  # the host (NumPy) path
  seeing = _log_softmax(model(ids, mask, pixel_values=pixel_values, image_grid_thw=grid_thw))
  blind = _log_softmax(model(ids, mask))  # the image tokens' own embeddings instead

  def score(logp_BxTxV):
    want = np.zeros((4, 4))
    for r, (i, j) in enumerate(pairs):
      x, z = sample.prompts[j], sample.reasonings[i]
      want[i, j] = sum(logp_BxTxV[r, len(x) - 1 + k, tok] for k, tok in enumerate(z))
    return want

  want = score(seeing)
  np.testing.assert_allclose(logp, want, rtol=1e-5, atol=2e-4)
  # Own prompts (the diagonal) included; without the images every score moves.
  assert np.min(np.abs(logp - score(blind))) > 1e-3
  # Turn 1 of each episode: token-identical prompts told apart only by their frames.
  assert np.array_equal(sample.prompts[0], sample.prompts[2])
  assert np.max(np.abs(logp[:, 0] - logp[:, 2])) > 1e-3

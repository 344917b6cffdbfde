"""The supervised warm start on a visual environment's demonstrations: each row keeps its frames
and the step's loss is the negative log-likelihood of the replies with those frames spliced.

The reference is the model's full forward (`pixel_values` and `image_grid_thw` from the host's
`vision.preprocess`, every row's images in order) and a NumPy log-softmax over the loss mask.

Dimension legend: B rows, T tokens, N frames a row.
"""

# pylint: disable=redefined-outer-name  # pytest passes fixtures as arguments of their name

from flax import nnx
import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax import vision
from ragen_jax.models.build import copy_tree
from ragen_jax.warm_start import sft
from references import ref_token_logprobs  # pylint: disable=g-bad-import-order
import tiny  # pylint: disable=g-bad-import-order

TOK = tokenizers.load("sentencepiece")
IMAGE_PAD, TOKENS_A_FRAME = 2050, 4  # the tiny-vl preset's; a 56x56 FrozenLake frame's tokens
CFG = sft.SFTConfig(
    steps=4, batch_size=4, lr=3e-3, warmup_steps=1, random_prob=0.0, pad_multiple=64
)


@pytest.fixture(scope="module")
def engine():
  config = tiny.rollout_config(
      env_groups=4, group_size=1, max_actions_per_turn=2, max_new_tokens=48, render_format="grid"
  )
  return rollout.Rollout(envs.make("visual_frozenlake", is_slippery=False), TOK, config)


@pytest.fixture(scope="module")
def model():
  return tiny.randomise(models.create("tiny-vl", jax.random.key(0)), 3)


@pytest.fixture(scope="module")
def demo_batch(engine):
  """One DemoStream batch of 4 expert rows: [tokens_BxT, attn_BxT, loss_BxT, frames]."""
  return sft.DemoStream({"visual_frozenlake": engine}, CFG, TOK.pad_id).next()


@pytest.fixture(scope="module")
def sft_step(model):
  return sft.make_sft_step(model, CFG)  # one jitted step: one compile per frames' shape


def first_loss(model, sft_step, batch, frames):
  """The step's loss at the model's weights (value_and_grad's value, before the update)."""
  init, step = sft_step
  params = copy_tree(nnx.to_pure_dict(nnx.state(model, nnx.Param)))  # the step donates them
  _, metrics = step(init(params), *batch[:3], frames)
  return float(metrics["sft/loss"])


def test_rows_keep_their_frames_and_the_loss_splices_them(model, sft_step, demo_batch):
  tokens, attn, loss, frames = demo_batch
  assert frames.shape == (4, 3, 56, 56, 3) and frames.dtype == np.uint8
  images_B = np.sum((tokens == IMAGE_PAD) & (attn > 0), axis=1) // TOKENS_A_FRAME
  assert images_B.min() >= 1 and loss.sum() > 0
  # Independent: transformers' inputs from the host path, every row's own images in order.
  shown = [frames[i, k] for i in range(len(tokens)) for k in range(images_B[i])]
  pixel_values, grid_thw = vision.preprocess(np.stack(shown))
  logits = model(tokens, attn, pixel_values=pixel_values, image_grid_thw=grid_thw)
  logp = ref_token_logprobs(logits, tokens, 1.0, model.config.excluded_token_ids)
  ref = -np.sum(logp * loss[:, 1:]) / loss.sum()
  got = first_loss(model, sft_step, demo_batch, frames)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  # Other rows' frames, or none (the image tokens embedded as text), give another loss.
  for other in (np.roll(frames, 1, axis=0), None):
    assert abs(first_loss(model, sft_step, demo_batch, other) - ref) > 1e-3


def test_a_few_steps_on_visual_demonstrations_lower_the_loss(engine):
  logs = []
  model = models.create("tiny-vl", jax.random.key(1))
  tuned, _ = sft.finetune(
      model, {"visual_frozenlake": engine}, CFG, log=lambda i, m: logs.append(m), log_every=1
  )
  losses = [m["sft/loss"] for m in logs]
  assert len(losses) == 4 and losses[-1] < losses[0] - 0.5
  # The tower stays frozen (the update's default, ppo.train_vision_tower off); the rest moves.
  before = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  after = nnx.to_pure_dict(nnx.state(tuned, nnx.Param))
  jax.tree.map(np.testing.assert_array_equal, before["visual"], after["visual"])
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before["decoder"], after["decoder"])
  assert all(jax.tree.leaves(moved))

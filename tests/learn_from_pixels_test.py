"""Learning from pixels: a tiny Qwen2.5-VL, from scratch, learns by RL a choice whose answer is
only in the image.

A two-armed bandit: the prompt is an image then "Pick an arm." (the same text for every
episode); the image is red or blue (with per-pixel noise); the reply is one token, and the arm
it pulls is that token's parity: even pulls the red arm, odd the blue one. Reward 1 when the arm
matches the colour. A policy that ignores the image is right half the time. The loop is the
project's own parts: `sampling.generate` with the images, a RolloutBatch carrying the frames,
and GRPO's `train_step` splicing them again.

Dimension legend: B episodes, T tokens.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax import vision
from ragen_jax.batch import RolloutBatch

TOK = tokenizers.load("sentencepiece")
GROUPS, GROUP_SIZE = 4, 8  # each group shares one colour
START, END, PAD = (
    TOK.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
)
PROMPT = [START] + [PAD] * 4 + [END] + TOK.encode("Pick an arm.")  # 56 x 56 px: 4 image tokens


def frames(rng, colours_B):
  """uint8 [B, 56, 56, 3]: red (colour 0) or blue (1), each pixel off by up to +-40."""
  base_Bx1x1x3 = np.where(colours_B[:, None, None, None] == 0, [200, 30, 30], [30, 30, 200])
  noise = rng.integers(-40, 41, (len(colours_B), 56, 56, 3))
  return np.clip(base_Bx1x1x3 + noise, 0, 255).astype(np.uint8)


def play(graphdef, params, colours_B, rng, key, options):
  """(ids_BxT, reply token_B, its log-prob_B, reward_B, frames_BxHxWx3) of one pull each."""
  b = len(colours_B)
  frames_B = frames(rng, colours_B)
  pixel_values, grid_thw = vision.preprocess(frames_B)
  ids_BxT = np.tile(np.asarray(PROMPT, np.int32), (b, 1))
  out = sampling.generate(
      nnx.merge(graphdef, params),
      ids_BxT,
      np.ones_like(ids_BxT),
      key=key,
      options=options,
      pixel_values=pixel_values,
      image_grid_thw=grid_thw,
  )
  token_B = np.asarray(out.tokens_BxN)[:, 0]
  reward_B = (token_B % 2 == colours_B).astype(np.float32)
  return ids_BxT, token_B, np.asarray(out.logprobs_BxN)[:, 0], reward_B, frames_B


def test_a_tiny_vl_model_learns_a_colour_bandit_by_rl():
  model = models.create("tiny-vl", jax.random.key(0))
  graphdef, _ = nnx.split(model)
  cfg = algos.PPOConfig(
      adv_estimator="grpo",
      num_minibatches=1,
      vocab_chunk=4096,
      actor_lr=1e-3,
      entropy_coeff=0.0,
      weight_decay=0.0,
  )
  state = algos.init_train_state(model, None, cfg, jax.random.key(1))
  step = algos.make_train_step(model, None, cfg, temperature=1.0)
  sample = sampling.SamplingOptions(max_new_tokens=1, temperature=1.0, pad_id=TOK.pad_id)
  greedy = sampling.SamplingOptions(max_new_tokens=1, temperature=0.0, pad_id=TOK.pad_id)
  train_rng, held_out = np.random.default_rng(0), np.random.default_rng(123)
  key = jax.random.key(5)

  def held_out_success(params):  # fresh images (other noise), greedy replies
    colours = held_out.integers(0, 2, 64)
    return play(graphdef, params, colours, held_out, key, greedy)[3].mean()

  before = held_out_success(state.actor_params)
  b = GROUPS * GROUP_SIZE
  for _ in range(6):
    key, play_key, step_key = jax.random.split(key, 3)
    colours = train_rng.integers(0, 2, GROUPS).repeat(GROUP_SIZE)
    ids, token, logp, reward, frames_B = play(
        graphdef, state.actor_params, colours, train_rng, play_key, sample
    )
    tokens_BxT = np.concatenate([ids, token[:, None]], axis=1)
    on_reply = lambda v: np.pad(np.asarray(v, np.float32)[:, None], ((0, 0), (len(PROMPT), 0)))
    batch = RolloutBatch(
        tokens_BxT=tokens_BxT,
        attention_mask_BxT=np.ones_like(tokens_BxT),
        loss_mask_BxT=on_reply(np.ones(b)).astype(np.int32),
        logprobs_BxT=on_reply(logp),
        token_rewards_BxT=on_reply(reward),
        group_ids_B=np.arange(b, dtype=np.int32) // GROUP_SIZE,
        scores_B=reward,
        frames_BxNxHxWx3=frames_B[:, None],
    )
    state, metrics = step(
        state,
        jax.tree.map(jnp.asarray, batch),
        step_key,
        response_width=tokens_BxT.shape[1],
    )
    assert float(metrics["training/rollout_probs_diff_max"]) < 1e-6
  after = held_out_success(state.actor_params)
  assert before < 0.75  # a random model's greedy reply ignores the colour: about chance
  assert after >= 0.9, (before, after)

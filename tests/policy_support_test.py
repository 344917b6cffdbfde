"""The policy's support: Qwen2.5-VL's vision tokens are never sampled, and every scorer agrees.

An image is located by its tokens' ids (the update's `frames_backbone`, the host's `rope_index`),
so a vision token sampled in a reply would be taken for an image slot. The model config declares
them (`ModelConfig.excluded_token_ids`); the sampler masks their logits and the update's
vocabulary-chunked log-probs give them no mass. The check uses a `tiny-vl` model whose weights put
almost all of a reply token's mass on the image-pad token.

Dimension legend: B rows, T tokens, N new tokens, V vocab, D model dim.
"""

# pylint: disable=redefined-outer-name  # pytest passes fixtures as arguments of their name

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax import vision
from ragen_jax.algos.step_losses import policy_forward
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import param_dict
from references import ref_token_logprobs  # pylint: disable=g-bad-import-order
import tiny  # pylint: disable=g-bad-import-order

TEMPERATURE = 0.8
START, END, PAD = 2048, 2049, 2050  # the tiny-vl preset's vision_start, vision_end, image_pad


@pytest.fixture(scope="module")
def favouring():
  """tiny-vl whose every text position's hidden state points along dimension 0 (a large shared
  embedding component), where the image-pad token's embedding is largest: unmasked, it takes
  nearly all of a reply token's mass."""
  model = models.create("tiny-vl", jax.random.key(0))
  embedding_VxD = np.array(model.decoder.embedding[...])
  embedding_VxD[:, 0] = 10.0
  embedding_VxD[PAD, 0] = 60.0
  embedding_VxD[START, 0] = 50.0
  model.decoder.embedding[...] = jnp.asarray(embedding_VxD)
  # A small final-norm scale keeps the logits near 1, where float32 resolves small probabilities.
  model.decoder.final_norm[...] = jnp.full((64,), 0.05)
  return model


def test_only_vision_models_exclude_tokens():
  assert not models.get_config("tiny").excluded_token_ids
  assert models.get_config("tiny-vl").excluded_token_ids == (START, END, PAD, 2051)


def test_chunked_logprobs_leave_excluded_tokens_out():
  rng = np.random.default_rng(0)
  h_BxTxD = rng.normal(size=(2, 3, 8)).astype(np.float32)
  w_DxV = rng.normal(size=(8, 21)).astype(np.float32)
  targets_BxT = np.array([[1, 4, 20], [7, 0, 4]], np.int32)  # 4 and 20 are excluded
  logp, ent = algos.chunked_logprobs_entropy(
      jnp.asarray(h_BxTxD), jnp.asarray(w_DxV), jnp.asarray(targets_BxT), 8, 1.0, True, (4, 20)
  )
  z = np.einsum("btd,dv->btv", h_BxTxD.astype(np.float64), w_DxV)
  support = np.ones(21, bool)
  support[[4, 20]] = False
  lse = np.log(np.exp(z[..., support]).sum(-1))
  p = np.exp(z[..., support] - lse[..., None])
  want_logp = np.take_along_axis(z, targets_BxT[..., None], -1)[..., 0] - lse
  np.testing.assert_allclose(np.asarray(logp), want_logp, atol=1e-5)  # excluded: finite
  np.testing.assert_allclose(np.asarray(ent), -(p * np.log(p)).sum(-1), atol=1e-5)


def test_a_favoured_vision_token_is_never_sampled_and_the_update_agrees(favouring):
  """Replies sample no vision token though the model favours the image pad; the sampler's
  log-probs equal a float64 reference over the support and the update's forward (each row's
  frame through the tower, positions from the ids on the device) to 1e-7 in probability."""
  rng = np.random.default_rng(0)
  frames_Bx1xHxWx3 = rng.integers(0, 256, (2, 1, 56, 56, 3), np.uint8)  # 2 x 2 image tokens
  pixel_values, grid_thw = vision.preprocess(list(frames_Bx1xHxWx3[:, 0]))
  rows = [[5, 6, START] + [PAD] * 4 + [END, 7], [8, START] + [PAD] * 4 + [END, 9, 10, 11]]
  ids_BxT, mask_BxT = tiny.left_padded_rows(rows)
  width = ids_BxT.shape[1]
  excluded = (START, END, PAD, 2051)  # the vision tokens: image blocks are built of them
  options = sampling.SamplingOptions(max_new_tokens=8, temperature=TEMPERATURE, pad_id=0)
  out = sampling.generate(
      favouring,
      ids_BxT,
      mask_BxT,
      key=jax.random.key(3),
      options=options,
      pixel_values=pixel_values,
      image_grid_thw=grid_thw,
  )
  tokens_BxN = np.asarray(out.tokens_BxN)
  assert not np.isin(tokens_BxN, excluded).any()
  assert np.all(np.asarray(out.lengths_B) == 8)

  full_BxT = np.concatenate([ids_BxT, tokens_BxN], axis=1)
  full_mask_BxT = np.concatenate([mask_BxT, np.ones_like(tokens_BxN)], axis=1)
  images = models.prepare_images(favouring.config, full_BxT, full_mask_BxT, pixel_values, grid_thw)
  logits = jax.jit(lambda m, i, a, images: m(i, a, images=images))(
      favouring, full_BxT, full_mask_BxT, images
  )
  # Unmasked, the first reply token would be the image pad with probability ~1.
  assert np.all(np.asarray(jax.nn.softmax(logits[:, width - 1] / TEMPERATURE))[:, PAD] > 0.99)
  ref_BxN = ref_token_logprobs(logits, full_BxT, TEMPERATURE, excluded)[:, width - 1 :]
  sampled_BxN = np.asarray(out.logprobs_BxN)
  np.testing.assert_allclose(sampled_BxN, ref_BxN, atol=1e-5)

  spec = types.SimpleNamespace(
      cfg=algos.PPOConfig(vocab_chunk=64), temperature=TEMPERATURE
  )  # what policy_forward reads
  graph = ModelGraph.of(favouring)
  forward = jax.jit(lambda p, i, a, f: policy_forward(graph, p, i, a, spec, False, frames=f)[0])
  logp_BxT = forward(param_dict(favouring), full_BxT, full_mask_BxT, frames_Bx1xHxWx3)
  update_BxN = np.asarray(logp_BxT)[:, width:]
  assert np.abs(np.exp(update_BxN) - np.exp(sampled_BxN)).max() < 1e-7

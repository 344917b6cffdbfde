"""Parity of ragen_jax's Qwen2.5-VL with transformers' Qwen2_5_VLForConditionalGeneration.

One tiny random transformers model (every tensor randomised, eager attention, float32) is saved
and loaded by `models.load_hf`. A two-row conversation holds four images of two sizes (84x84 and
56x84, pixel values from transformers' own image processor): each row has an image in turn 1 and
in turn 3, one row is left padded and has padding inside it. The reference logits are
transformers' with `mm_token_type_ids` (without it transformers silently falls back to 1-D
positions); transformers' `generate` is the reference of the sampler's greedy decoding.
Dimension legend: B batch, T tokens, P patches, C values per patch, V vocab.
"""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from ragen_jax import models
from ragen_jax import sampling
from ragen_jax.models import layers
from ragen_jax.models import mrope
from ragen_jax.models import vision
from references import hf_logits  # pylint: disable=g-bad-import-order

VOCAB, IMAGE, VIDEO, START, END = 320, 300, 301, 302, 303
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
)
VISION = dict(
    depth=4,
    hidden_size=32,
    intermediate_size=48,
    num_heads=2,
    out_hidden_size=64,
    window_size=56,
    fullatt_block_indexes=[1, 3],
)
CHUNK, REPLY = 16, 3  # prompt chunk length (turns 1 and 3); tokens decoded after each turn
SIZES = {"a": (84, 84), "b": (56, 84)}  # 9 and 6 image tokens; 3x3 and 2x3 of them
CAPACITY = 48


def hf_config():
  return transformers.Qwen2_5_VLConfig(
      text_config=TEXT,
      vision_config=VISION,
      image_token_id=IMAGE,
      video_token_id=VIDEO,
      vision_start_token_id=START,
      vision_end_token_id=END,
      tie_word_embeddings=False,
      attn_implementation="eager",
  )


@pytest.fixture(scope="module", name="hf")
def hf_fixture():
  model = transformers.Qwen2_5_VLForConditionalGeneration(hf_config()).eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if "norm" in name or "ln_q" in name else 0.2 * noise)
  return model


@pytest.fixture(scope="module", name="checkpoint")
def checkpoint_fixture(hf, tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen2_5_vl")
  hf.save_pretrained(path)
  return path


@pytest.fixture(scope="module", name="model")
def model_fixture(checkpoint):
  return models.load_hf(str(checkpoint))


def _pixels(names, seed):
  """(pixel_values_PxC, image_grid_thw_Nx3) of random images named by SIZES keys."""
  processor = transformers.Qwen2VLImageProcessorPil()
  rng = np.random.default_rng(seed)
  images = [rng.integers(0, 256, SIZES[n] + (3,), dtype=np.uint8) for n in names]
  out = processor(images=images, return_tensors="np")
  return out["pixel_values"], out["image_grid_thw"]


def _image(name):
  tokens = {"a": 9, "b": 6}[name]
  return [START] + [IMAGE] * tokens + [END]


def _chunk(rng, pieces):
  """A CHUNK-token row, left padded: pieces are ints (text tokens) or image names."""
  row = []
  for piece in pieces:
    row += _image(piece) if isinstance(piece, str) else list(rng.integers(0, IMAGE, piece))
  return [0] * (CHUNK - len(row)) + row, [0] * (CHUNK - len(row)) + [1] * len(row)


@pytest.fixture(scope="module", name="conversation")
def conversation_fixture(hf):
  """Turn 1 (a chunk with an image per row), a reply, turn 2 (text), turn 3 (a chunk with an
  image per row; row 1 padded inside the conversation), a reply; and transformers' logits."""
  rng = np.random.default_rng(1)
  turn1 = [_chunk(rng, [3, "a", 2]), _chunk(rng, [1, "b", 3])]  # row 1 left padded
  turn3 = [_chunk(rng, [4, "b", 4]), _chunk(rng, [2, "a", 2])]  # row 1: one padding token
  singles = rng.integers(0, IMAGE, (2, 2 * REPLY + REPLY)).astype(np.int32)  # replies, turn 2
  chunk_ids = lambda turn: np.array([ids for ids, _ in turn], np.int32)
  chunk_mask = lambda turn: np.array([mask for _, mask in turn], np.int32)
  pixels1, grid1 = _pixels("ab", seed=2)
  pixels3, grid3 = _pixels("ba", seed=3)
  middle = singles[:, : 2 * REPLY]
  ids = np.concatenate([chunk_ids(turn1), middle, chunk_ids(turn3), singles[:, 2 * REPLY :]], 1)
  ones = np.ones((2, REPLY), np.int32)
  mask = np.concatenate([chunk_mask(turn1), ones, ones, chunk_mask(turn3), ones], 1)
  # transformers takes the images row after row: row 0's (a, b), then row 1's (b, a).
  order = [(pixels1, grid1, 0), (pixels3, grid3, 0), (pixels1, grid1, 1), (pixels3, grid3, 1)]
  starts = lambda grid: np.concatenate([[0], np.cumsum(np.prod(grid, axis=1))])
  pixel_values = np.concatenate([p[starts(g)[i] : starts(g)[i + 1]] for p, g, i in order])
  grid = np.stack([g[i] for _, g, i in order])
  with torch.no_grad():
    out = hf(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        pixel_values=torch.tensor(pixel_values),
        image_grid_thw=torch.tensor(grid),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int32)),
    )
    hf_positions, hf_deltas = hf.model.get_rope_index(
        torch.tensor(ids, dtype=torch.long),
        torch.tensor((ids == IMAGE).astype(np.int32)),
        image_grid_thw=torch.tensor(grid),
        attention_mask=torch.tensor(mask, dtype=torch.long),
    )
  return dict(
      ids=ids,
      mask=mask,
      pixel_values=pixel_values,
      grid=grid,
      chunks=[(chunk_ids(turn1), chunk_mask(turn1), pixels1, grid1)]
      + [(chunk_ids(turn3), chunk_mask(turn3), pixels3, grid3)],
      singles=singles,
      reference=out.logits.numpy(),
      hf_positions=hf_positions.numpy(),
      hf_deltas=hf_deltas.numpy()[:, 0],
  )


def _forward(model):
  graphdef, state = nnx.split(model)
  return state, jax.jit(lambda s, i, m, images: nnx.merge(graphdef, s)(i, m, images=images))


def test_positions_and_logits_match_transformers(model, conversation):
  c = conversation
  images = models.prepare_images(model.config, c["ids"], c["mask"], c["pixel_values"], c["grid"])
  real = c["mask"].astype(bool)
  np.testing.assert_array_equal(images.positions_3xBxT[:, real], c["hf_positions"][:, real])
  np.testing.assert_array_equal(images.rope_delta_B, c["hf_deltas"])
  # A 3x3 image's 9 tokens advance the position by 3, a 2x3 image's 6 by 3: -6 - 3 per row.
  assert list(c["hf_deltas"]) == [-9, -9]
  state, forward = _forward(model)
  ours = np.asarray(forward(state, c["ids"], c["mask"], images))
  assert ours.dtype == np.float32 and ours.shape == c["reference"].shape
  assert np.max(np.abs(ours[real] - c["reference"][real])) <= 1e-4
  # transformers' arguments, turned into ImageInputs on the host (the ids are known to jit).
  graphdef = nnx.graphdef(model)
  convenience = jax.jit(
      lambda s: nnx.merge(graphdef, s)(
          c["ids"], c["mask"], pixel_values=c["pixel_values"], image_grid_thw=c["grid"]
      )
  )
  np.testing.assert_array_equal(np.asarray(convenience(state)), ours)


def test_cached_decoding_after_images_matches_transformers(model, conversation):
  """Prefill turn 1 (KVCache), decode its reply and turn 2 one token at a time (LayerCache, the
  sampler's path), prefill turn 3 with its images, decode: transformers' full forward."""
  c = conversation
  graphdef, state = nnx.split(model)

  @jax.jit
  def prefill(state, ids_BxT, mask_BxT, images, cache):
    return nnx.merge(graphdef, state)(ids_BxT, mask_BxT, images=images, cache=cache)

  @jax.jit
  def step(state, ids_Bx1, cache, weights):
    return nnx.merge(graphdef, state).decode(
        ids_Bx1, jnp.ones_like(ids_Bx1), cache=cache, weights=weights
    )

  weights = model.decoder.layer_weights()
  cache = models.init_cache(model.config, 2, CAPACITY)
  outs, singles = [], iter(c["singles"].T)
  for turn, (ids, mask, pixels, grid) in enumerate(c["chunks"]):
    images = models.prepare_images(model.config, ids, mask, pixels, grid)
    logits, cache = prefill(state, ids, mask, images, cache)
    outs.append(np.asarray(logits))
    layer_cache = cache.per_layer(CAPACITY)
    for _ in range(2 * REPLY if turn == 0 else REPLY):
      logits, layer_cache = step(state, next(singles)[:, None], layer_cache, weights)
      outs.append(np.asarray(logits))
    cache = layer_cache.into(cache)
  cached = np.concatenate(outs, axis=1)
  real = c["mask"].astype(bool)
  np.testing.assert_array_equal(np.asarray(cache.mask_BxS[:, : real.shape[1]]), real)
  np.testing.assert_array_equal(np.asarray(cache.rope_delta_B), c["hf_deltas"])
  assert np.max(np.abs(cached[real] - c["reference"][real])) <= 1e-4


def test_greedy_generate_with_images_equals_transformers_generate(hf, model, conversation):
  """The sampler's greedy decoding of prompts with an image in turn 1 and in turn 3 (row 1 left
  padded and padded inside) equals transformers' `generate`, token for token; other images
  change the tokens (the images reach the decoded reply, not only the prompt's logits)."""
  c, n = conversation, 8
  prompt = 2 * CHUNK + 2 * REPLY  # turn 1, its reply, turn 2, turn 3
  ids, mask = c["ids"][:, :prompt], c["mask"][:, :prompt]
  with torch.no_grad():
    hf_tokens = hf.generate(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        pixel_values=torch.tensor(c["pixel_values"]),
        image_grid_thw=torch.tensor(c["grid"]),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int32)),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        # Our sampler never samples the vision tokens (ModelConfig.excluded_token_ids): keep
        # them out of transformers' argmax too, so that both choose from the same support.
        suppress_tokens=list(model.config.excluded_token_ids),
        pad_token_id=0,
        eos_token_id=None,
    )[:, prompt:].numpy()
  assert hf_tokens.shape == (2, n)

  def greedy(pixel_values):
    options = sampling.SamplingOptions(max_new_tokens=n, temperature=0.0)
    out = sampling.generate(
        model,
        ids,
        mask,
        key=jax.random.key(0),
        options=options,
        pixel_values=pixel_values,
        image_grid_thw=c["grid"],
    )
    return np.asarray(out.tokens_BxN)

  np.testing.assert_array_equal(greedy(c["pixel_values"]), hf_tokens)
  # The same shapes (no new compile) with each image's patches negated: other tokens.
  assert np.any(greedy(-c["pixel_values"]) != hf_tokens)


def test_same_size_images_attend_per_frame(hf, model):
  """Three 84x84 images in one call take the per-frame path ([N, Hv, p, p] scores, the window
  blocks masked to the frame's 4 windows): their features equal three one-image calls' and the
  masked [P, P] square's (1e-5), and transformers' tower's on the three (1e-4)."""
  pixels_PxC, grid_Nx3 = _pixels("aaa", seed=4)
  layout = vision.patch_layout(grid_Nx3, model.config.vision)
  assert layout.frame_patches == 36 and len(set(layout.window_P.tolist())) == 3 * 4
  together_IxD = np.asarray(model.visual(pixels_PxC, *layout))
  one = lambda i: vision.patch_layout(grid_Nx3[i : i + 1], model.config.vision)
  singles = [model.visual(pixels_PxC[36 * i : 36 * (i + 1)], *one(i)) for i in range(3)]
  np.testing.assert_allclose(together_IxD, np.concatenate(singles), atol=1e-5, rtol=0)
  square_IxD = np.asarray(model.visual(pixels_PxC, *layout._replace(frame_patches=0)))
  np.testing.assert_allclose(together_IxD, square_IxD, atol=1e-5, rtol=0)
  with torch.no_grad():
    hf_IxD = hf.model.visual(torch.tensor(pixels_PxC), grid_thw=torch.tensor(grid_Nx3))
  assert np.max(np.abs(together_IxD - hf_IxD.pooler_output.numpy())) <= 1e-4


def test_text_alone_is_the_qwen2_decoder(hf, model):
  rng = np.random.default_rng(4)
  ids = rng.integers(0, IMAGE, (2, 9)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, :4] = 0
  graphdef, state = nnx.split(model)
  ours = np.asarray(jax.jit(lambda s, i, m: nnx.merge(graphdef, s)(i, m))(state, ids, mask))
  real = mask.astype(bool)
  assert np.max(np.abs(ours[real] - hf_logits(hf, ids, mask)[real])) <= 1e-4
  # The same weights in a plain Qwen2 (1-D RoPE, no tower) give exactly the same logits.
  text = model.config.replace(model_type="qwen2", vision=None)
  plain = nnx.eval_shape(lambda: models.Qwen2(text, rngs=nnx.Rngs(0)))
  nnx.update(plain.decoder, nnx.state(model.decoder))
  plain.lm_head.set_value(model.lm_head[...])
  plain_graphdef, plain_state = nnx.split(plain)
  text_only = jax.jit(lambda s, i, m: nnx.merge(plain_graphdef, s)(i, m))(plain_state, ids, mask)
  np.testing.assert_array_equal(np.asarray(text_only), ours)


def test_rope_of_equal_axes_is_the_1d_rope():
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(2, 7, 3, 16)), jnp.float32)
  positions_BxT = jnp.asarray(rng.integers(0, 50, (2, 7)), jnp.int32)
  one_axis = layers.rope(x, positions_BxT, 1e4)
  three_axes = layers.rope(x, jnp.stack([positions_BxT] * 3), 1e4, sections=(2, 3, 3))
  np.testing.assert_array_equal(np.asarray(three_axes), np.asarray(one_axis))
  # Different axes turn different frequency chunks: the h chunk (frequencies 2-4) alone moves.
  moved = jnp.stack([positions_BxT, positions_BxT + 5, positions_BxT])
  diff = np.abs(np.asarray(layers.rope(x, moved, 1e4, sections=(2, 3, 3)) - one_axis))
  changed_pairs = (diff[..., :8] + diff[..., 8:]).max(axis=(0, 1, 2)) > 0
  np.testing.assert_array_equal(
      changed_pairs, [False, False, True, True, True, False, False, False]
  )


def test_save_hf_round_trip_and_transformers_memory_layout(hf, model, checkpoint, tmp_path):
  ours = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  out = tmp_path / "saved"
  models.save_hf(model, str(out))
  reloaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
      out, attn_implementation="eager"
  )
  expected = hf.state_dict()
  assert set(reloaded.state_dict()) == set(expected)
  for name, value in reloaded.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), expected[name].numpy(), err_msg=name)
  assert reloaded.config.vision_config.fullatt_block_indexes == [1, 3]
  assert reloaded.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
  # transformers 5's in-memory names (model.language_model.*, model.visual.*) load too.
  memory = tmp_path / "memory"
  memory.mkdir()
  (memory / "config.json").write_text((checkpoint / "config.json").read_text())
  tensors = {k: v.numpy() for k, v in expected.items()}
  assert any(k.startswith("model.language_model.") for k in tensors)
  safetensors.numpy.save_file(tensors, str(memory / "model.safetensors"))
  for path in (out, memory):
    loaded = models.load_hf(str(path))
    assert loaded.config == model.config
    for k, v in nnx.to_flat_state(nnx.state(loaded, nnx.Param)):
      np.testing.assert_array_equal(np.asarray(v), ours[k], err_msg=str(k))
  critic = models.load_hf(str(memory), critic=True)  # the language model alone
  np.testing.assert_array_equal(
      np.asarray(critic.decoder.embedding[...]), ours[("decoder", "embedding")]
  )


def test_param_table_counts_the_tower():
  config = models.get_config("tiny-vl")
  assert models.model_class(config) is models.Qwen2_5_VL
  abstract = nnx.eval_shape(lambda: models.Qwen2_5_VL(config, rngs=nnx.Rngs(0)))
  built = {
      path[-1]: (tuple(var.shape), tuple(var.get_metadata()["out_sharding"]))
      for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param))
  }
  assert built == models.param_table(config)
  # transformers builds the preset's config.json with as many parameters (tied head once).
  hf_config_ = transformers.AutoConfig.for_model(**models.hf_config.to_hf_dict(config))
  with torch.device("meta"):
    meta = transformers.Qwen2_5_VLForConditionalGeneration(hf_config_)
  assert sum(p.numel() for p in meta.parameters()) == models.num_params(config)


def test_config_json_layouts():
  nested = json.loads(hf_config().to_json_string())
  config = models.hf_config.from_hf_dict(nested)
  assert config.vision.fullatt_block_indexes == (1, 3) and config.vision.image_token_id == IMAGE
  assert config.vision.mrope_section == (2, 3, 3) and not config.tie_word_embeddings
  assert models.hf_config.from_hf_dict(models.hf_config.to_hf_dict(config)) == config
  # The Hub's flat layout: text fields at the top, the legacy "mrope" rope_scaling.
  flat = {k: v for k, v in nested.items() if k != "text_config"}
  flat.update({k: v for k, v in nested["text_config"].items() if k != "rope_parameters"})
  flat.update(rope_theta=1e4, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
  flat["model_type"] = "qwen2_5_vl"
  assert models.hf_config.from_hf_dict(flat) == config


# A Hub config.json of Qwen2.5-VL-3B's shape: the text fields at the top, "mrope" rope_scaling,
# the early "in_chans" spelling.
HUB_3B = dict(
    architectures=["Qwen2_5_VLForConditionalGeneration"],
    model_type="qwen2_5_vl",
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    max_position_embeddings=128000,
    use_sliding_window=False,
    sliding_window=32768,
    tie_word_embeddings=True,
    vision_config=dict(
        depth=32,
        hidden_act="silu",
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        in_chans=3,
        out_hidden_size=2048,
        patch_size=14,
        spatial_merge_size=2,
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
        temporal_patch_size=2,
    ),
)


def test_hub_config_of_the_3b_shape_counts_as_transformers():
  """The Hub's config.json read, transformers' parameter count, and the qwen2.5-vl-3b preset: the
  same config (the preset is what the :qwen2.5-vl-3b variant builds before a checkpoint)."""
  config = models.hf_config.from_hf_dict(HUB_3B)
  assert config.head_dim == 128 and config.vision.mrope_section == (16, 24, 24)
  assert config.tie_word_embeddings and config.rope_theta == 1e6
  with torch.device("meta"):  # no memory
    meta = transformers.Qwen2_5_VLForConditionalGeneration(
        transformers.AutoConfig.for_model(**HUB_3B)
    )
  assert sum(p.numel() for p in meta.parameters()) == models.num_params(config) == 3_754_622_976
  assert models.get_config("qwen2.5-vl-3b") == config


def test_rope_index_rejects_tokens_that_disagree_with_the_grids():
  ids = np.array([[5, START] + [IMAGE] * 6 + [END, 7]])
  positions, delta = mrope.rope_index(
      ids, None, [[1, 4, 6]], image_token_id=IMAGE, spatial_merge_size=2
  )
  np.testing.assert_array_equal(positions[:, 0, 2:8], [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4] * 2])
  np.testing.assert_array_equal(positions[:, 0, 8:], [[5, 6]] * 3)  # the image advanced by 3
  assert list(delta) == [6 + 1 - 10]
  for grids in ([[1, 6, 6]], [], [[1, 4, 6], [1, 4, 6]]):
    with pytest.raises(ValueError):
      mrope.rope_index(ids, None, grids, image_token_id=IMAGE, spatial_merge_size=2)

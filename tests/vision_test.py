"""Qwen2.5-VL's image preprocessing against transformers' own processor (PIL backend), and the
patch layout and values against numbers worked out by hand."""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_qwen2_vl

from ragen_jax import vision

REFERENCE = hf_qwen2_vl.Qwen2VLImageProcessorPil()


def _reference(images, processor=REFERENCE):
  out = processor(images=list(images), return_tensors="np", input_data_format="channels_last")
  return out["pixel_values"], out["image_grid_thw"]


def _images(seed, n, h, w):
  return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("h, w", [(84, 84), (56, 84), (112, 56), (252, 252)])
def test_sizes_that_need_no_resizing_give_the_reference_exactly(h, w):
  images = _images(h * w, 3, h, w)
  ref_values, ref_grid = _reference(images)
  values, grid = vision.preprocess(images)
  assert values.dtype == np.float32 and grid.dtype == np.int64
  np.testing.assert_array_equal(values, ref_values)  # the same float32 values, to the bit
  np.testing.assert_array_equal(grid, ref_grid)
  assert values.shape == (3 * (h // 14) * (w // 14), 1176)


def test_jax_arrays_take_the_same_path_under_jit():
  """A frame rendered on the device is preprocessed there: one jitted function, the reference's
  values; a size that would need resampling is refused before anything runs."""
  images = _images(1, 2, 56, 84)
  values, grid = jax.jit(vision.preprocess)(jnp.asarray(images))
  ref_values, ref_grid = _reference(images)
  assert values.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(values), ref_values)
  np.testing.assert_array_equal(np.asarray(grid), ref_grid)
  with pytest.raises(ValueError, match="need resizing to"):
    vision.preprocess(jnp.asarray(_images(1, 1, 96, 96)))
  with pytest.raises(ValueError, match=r"need resizing to \(56, 56\)"):
    vision.preprocess(jnp.asarray(_images(1, 1, 28, 28)))  # below min_pixels


def test_patch_rows_by_hand():
  """A 56x56 image is 4x4 patches, merged 2x2: the rows are patches (0,0), (0,1), (1,0), (1,1),
  then (0,2), (0,3), (1,2), (1,3), ...; each row is the patch's R, G, B planes, each twice."""
  rng = np.random.default_rng(5)
  image = rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)
  values, grid = vision.preprocess(image[None])
  assert grid.tolist() == [[1, 4, 4]]
  mean, std = np.array(vision.CLIP_MEAN), np.array(vision.CLIP_STD)
  order = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
  order += [(2, 0), (2, 1), (3, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3)]
  for row, (pr, pc) in enumerate(order):
    patch = image[pr * 14 : (pr + 1) * 14, pc * 14 : (pc + 1) * 14].astype(np.float64)
    expected = []
    for channel in range(3):
      plane = (patch[:, :, channel] / 255 - mean[channel]) / std[channel]
      expected += [plane.ravel(), plane.ravel()]  # the temporal patch: the frame twice
    np.testing.assert_allclose(values[row], np.concatenate(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "h, w, size",
    [
        (96, 96, (84, 84)),  # RAGEN's 16-pixel Sokoban frame: 9 tokens
        (256, 256, (252, 252)),  # RAGEN's FrozenLake frame: 81 tokens
        (28, 28, (56, 56)),  # below min_pixels: scaled up
        (42, 42, (56, 56)),  # 1.5 rounds to 2
        (70, 70, (56, 56)),  # 2.5 rounds to 2, half to even
        (2000, 3000, (812, 1204)),  # above max_pixels: scaled down
    ],
)
def test_smart_resize_by_hand(h, w, size):
  assert vision.smart_resize(h, w) == size


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.integers(1, 4000), st.integers(1, 4000), st.sampled_from([3136, 784, 8000]))
def test_smart_resize_matches_the_reference(h, w, min_pixels):
  config = vision.ImageConfig(min_pixels=min_pixels, max_pixels=max(min_pixels, 28 * 28 * 64))
  kwargs = dict(factor=28, min_pixels=config.min_pixels, max_pixels=config.max_pixels)
  try:
    expected = hf_qwen2_vl.smart_resize(h, w, **kwargs)
  except ValueError:
    with pytest.raises(ValueError, match="exceeds 200x"):
      vision.smart_resize(h, w, config)
    return
  assert vision.smart_resize(h, w, config) == expected
  t, gh, gw = vision.grid_thw(h, w, config)
  assert (t, gh * 14, gw * 14) == (1,) + expected
  assert vision.num_tokens(h, w, config) == gh * gw // 4


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(st.integers(10, 150), st.integers(10, 150), st.integers(1, 3))
def test_any_size_matches_the_reference(h, w, n):
  """Sizes of every kind, most resampled by PIL's bicubic filter: sizes, grids and values."""
  images = _images(h + 1000 * w, n, h, w)
  ref_values, ref_grid = _reference(images)
  values, grid = vision.preprocess(images)
  np.testing.assert_array_equal(grid, ref_grid)
  assert values.shape == ref_values.shape
  np.testing.assert_allclose(values, ref_values, rtol=0, atol=1e-6)


def test_a_list_of_different_sizes_and_other_settings():
  sizes = [(84, 84), (30, 50), (96, 96), (200, 33)]
  images = [_images(i, 1, h, w)[0] for i, (h, w) in enumerate(sizes)]
  ref_values, ref_grid = _reference(images)
  values, grid = vision.preprocess(images)
  np.testing.assert_array_equal(grid, ref_grid)
  np.testing.assert_allclose(values, ref_values, rtol=0, atol=1e-6)
  # A small max_pixels scales a large image down; patch 16 changes the row size.
  config = vision.ImageConfig(patch_size=16, min_pixels=1024, max_pixels=64 * 64 * 4)
  processor = hf_qwen2_vl.Qwen2VLImageProcessorPil(
      patch_size=16, min_pixels=config.min_pixels, max_pixels=config.max_pixels
  )
  image = _images(9, 1, 300, 200)
  ref_values, ref_grid = _reference(image, processor)
  values, grid = vision.preprocess(image, config)
  np.testing.assert_array_equal(grid, ref_grid)
  assert values.shape[1] == config.patch_dim == 3 * 2 * 16 * 16
  np.testing.assert_allclose(values, ref_values, rtol=0, atol=1e-6)


def test_bad_inputs_and_settings_name_the_problem():
  with pytest.raises(ValueError, match="uint8 RGB"):
    vision.preprocess(np.zeros((1, 56, 56, 3), np.float32))
  with pytest.raises(ValueError, match="uint8 RGB"):
    vision.preprocess(np.zeros((1, 56, 56, 4), np.uint8))
  with pytest.raises(ValueError, match=r"\[N, H, W, 3\]"):
    vision.preprocess(jnp.zeros((56, 56, 3), jnp.uint8))
  with pytest.raises(ValueError, match="at least one image"):
    vision.preprocess([])
  with pytest.raises(ValueError, match="exceeds 200x"):
    vision.preprocess(np.zeros((1, 10, 2100, 3), np.uint8))
  with pytest.raises(ValueError, match="vision.max_pixels=100 is below"):
    vision.ImageConfig(max_pixels=100)
  with pytest.raises(ValueError, match="vision.patch_size must be an integer >= 1"):
    vision.ImageConfig(patch_size=0)

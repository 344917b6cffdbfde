"""Qwen2.5-VL's vision side of a ModelConfig (`ModelConfig.vision`): the tower's shapes, the image
token ids and M-RoPE's frequency split, the tower's parameter table, and its config.json part.

Dimension legend: Lv vision blocks, Dv tower width, Hv tower heads, Dhv tower head dim, Fv tower
MLP width, C the values of one patch (in_channels * temporal_patch_size * patch_size**2), M the
patches merged into one image token (spatial_merge_size**2), D the decoder's width.
"""

import dataclasses
import math
from typing import Any

from ragen_jax.config_checks import check_fields
from ragen_jax.config_checks import NonNegativeInt
from ragen_jax.config_checks import PositiveFloat
from ragen_jax.config_checks import PositiveInt


def _ints(value) -> tuple[int, ...]:
  """A JSON list (or tuple) of ints as a tuple: hashable, so the config can be a jit static."""
  if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
    return tuple(value)
  raise ValueError(f"expected a list of integers, got {value!r}")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The vision tower of Qwen2.5-VL and how its features enter the decoder.

  Attributes:
    depth: Lv, vision blocks.
    hidden_size: Dv.
    intermediate_size: Fv, the blocks' SwiGLU width.
    num_heads: Hv (Dhv = Dv / Hv, a multiple of 4: the 2-D rotary splits half of it per axis).
    fullatt_block_indexes: blocks that attend over a whole image; the others attend within
      windows of `window_size` pixels.
    window_size: a window's side in pixels (a multiple of patch_size * spatial_merge_size).
    patch_size: a patch's side in pixels.
    temporal_patch_size: frames per patch (an image is repeated to fill them).
    spatial_merge_size: patches per side of one image token (2: 2x2 patches -> 1 token).
    in_channels: colour channels.
    rope_theta: the tower's rotary base.
    mrope_section: the decoder's Dh/2 rotary frequencies split into consecutive chunks taken
      from the t, h and w positions (sums to head_dim / 2).
    image_token_id: the image-pad token whose embedding an image feature replaces.
    video_token_id, vision_start_token_id, vision_end_token_id: the other vision tokens (videos
      are not supported; the ids are written back to config.json).
  """

  depth: PositiveInt
  hidden_size: PositiveInt
  intermediate_size: PositiveInt
  num_heads: PositiveInt
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  window_size: PositiveInt = 112
  patch_size: PositiveInt = 14
  temporal_patch_size: PositiveInt = 2
  spatial_merge_size: PositiveInt = 2
  in_channels: PositiveInt = 3
  rope_theta: PositiveFloat = 10000.0
  mrope_section: tuple[int, ...] = (16, 24, 24)
  image_token_id: NonNegativeInt = 151655
  video_token_id: NonNegativeInt = 151656
  vision_start_token_id: NonNegativeInt = 151652
  vision_end_token_id: NonNegativeInt = 151653

  def __post_init__(self):
    object.__setattr__(self, "fullatt_block_indexes", _ints(self.fullatt_block_indexes))
    object.__setattr__(self, "mrope_section", _ints(self.mrope_section))
    object.__setattr__(self, "rope_theta", float(self.rope_theta))
    check_fields(self, "vision")
    if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
      raise ValueError(
          f"vision hidden_size {self.hidden_size} / num_heads {self.num_heads} must be a "
          "multiple of 4 (the 2-D rotary splits half of each head per axis)"
      )
    bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
    if bad:
      raise ValueError(f"vision fullatt_block_indexes {bad} are not blocks of depth {self.depth}")
    if self.window_size % self.merged_patch_size:
      raise ValueError(
          f"vision window_size {self.window_size} must be a multiple of patch_size * "
          f"spatial_merge_size = {self.merged_patch_size}"
      )
    if len(self.mrope_section) != 3 or min(self.mrope_section) < 0:
      raise ValueError(f"mrope_section must be 3 sizes (t, h, w), got {self.mrope_section}")

  @property
  def structure_token_ids(self) -> tuple[int, ...]:
    """The vision tokens: an image's (or video's) block is built of them in a prompt, never
    sampled in a reply (`ModelConfig.excluded_token_ids`)."""
    ids = (
        self.vision_start_token_id,
        self.vision_end_token_id,
        self.image_token_id,
        self.video_token_id,
    )
    return tuple(sorted(ids))

  @property
  def head_dim(self) -> int:
    """Dhv."""
    return self.hidden_size // self.num_heads

  @property
  def patch_values(self) -> int:
    """C, the values of one flattened patch (a row of pixel_values)."""
    return self.in_channels * self.temporal_patch_size * self.patch_size**2

  @property
  def merge_unit(self) -> int:
    """M, the patches merged into one image token."""
    return self.spatial_merge_size**2

  @property
  def merged_patch_size(self) -> int:
    """The side in pixels of one image token."""
    return self.patch_size * self.spatial_merge_size

  @property
  def window_tokens(self) -> int:
    """A window's side in image tokens."""
    return self.window_size // self.merged_patch_size

  def replace(self, **changes) -> "VisionConfig":
    return dataclasses.replace(self, **changes)


def tiny_vision(first_token_id: int) -> VisionConfig:
  """The tiny-vl preset's tower: 4 blocks of width 32 (blocks 1 and 3 attend over the whole
  image, the others within windows of 2x2 image tokens) for a decoder with head_dim 16; the four
  vision token ids from `first_token_id` on."""
  return VisionConfig(
      depth=4,
      hidden_size=32,
      intermediate_size=64,
      num_heads=2,
      fullatt_block_indexes=(1, 3),
      window_size=56,
      mrope_section=(2, 3, 3),
      vision_start_token_id=first_token_id,
      vision_end_token_id=first_token_id + 1,
      image_token_id=first_token_id + 2,
      video_token_id=first_token_id + 3,
  )


def qwen25_vl_3b_vision() -> VisionConfig:
  """The tower of Qwen/Qwen2.5-VL-3B-Instruct's config.json: 32 blocks of width 1280 (16 heads,
  SwiGLU 3420); its window, patches, merge, full-attention blocks, M-RoPE split and token ids are
  the fields' defaults."""
  return VisionConfig(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16)


def vision_table(v: VisionConfig, out_size: int) -> dict:
  """The tower's parameters {name: (shape, logical axes)}: the patch embedding, Lv stacked blocks
  (q, k, v in one kernel as in transformers) and the patch merger to the decoder's width D =
  `out_size`. Every name starts with "vision_", apart from the decoder's."""
  l, d, h, dh, f = v.depth, v.hidden_size, v.num_heads, v.head_dim, v.intermediate_size
  c, merged = v.patch_values, v.hidden_size * v.merge_unit
  return {
      "vision_patch_kernel": ((c, d), (None, "embed")),
      "vision_attn_norm": ((l, d), ("layers", "embed")),
      "vision_qkv_kernel": ((l, d, 3, h, dh), ("layers", "embed", None, "heads", "head_dim")),
      "vision_qkv_bias": ((l, 3, h, dh), ("layers", None, "heads", "head_dim")),
      "vision_o_kernel": ((l, h, dh, d), ("layers", "heads", "head_dim", "embed")),
      "vision_o_bias": ((l, d), ("layers", "embed")),
      "vision_mlp_norm": ((l, d), ("layers", "embed")),
      "vision_gate_kernel": ((l, d, f), ("layers", "embed", "mlp")),
      "vision_gate_bias": ((l, f), ("layers", "mlp")),
      "vision_up_kernel": ((l, d, f), ("layers", "embed", "mlp")),
      "vision_up_bias": ((l, f), ("layers", "mlp")),
      "vision_down_kernel": ((l, f, d), ("layers", "mlp", "embed")),
      "vision_down_bias": ((l, d), ("layers", "embed")),
      "vision_merger_norm": ((d,), ("embed",)),
      "vision_merger_hidden_kernel": ((merged, merged), (None, "mlp")),
      "vision_merger_hidden_bias": ((merged,), ("mlp",)),
      "vision_merger_out_kernel": ((merged, out_size), ("mlp", "embed")),
      "vision_merger_out_bias": ((out_size,), ("embed",)),
  }


def vision_params(v: VisionConfig, out_size: int) -> int:
  """The tower's parameter count."""
  return sum(math.prod(shape) for shape, _ in vision_table(v, out_size).values())


def from_hf_dict(d: dict[str, Any], top: dict[str, Any], mrope_section) -> VisionConfig:
  """The VisionConfig of config.json's `vision_config` dict `d`, the token ids at its top level
  `top`, and the text rope's `mrope_section`."""
  if d.get("hidden_act", "silu") != "silu":
    raise ValueError(f"vision hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
  rope = d.get("rope_parameters") or {}
  defaults = {f.name: f.default for f in dataclasses.fields(VisionConfig)}
  fields = {
      name: d.get(name, defaults[name])
      for name in (
          "depth",
          "hidden_size",
          "intermediate_size",
          "num_heads",
          "fullatt_block_indexes",
          "window_size",
          "patch_size",
          "temporal_patch_size",
          "spatial_merge_size",
      )
  }
  # Early checkpoints spell in_channels "in_chans".
  fields["in_channels"] = d.get("in_channels", d.get("in_chans", 3))
  fields["rope_theta"] = rope.get("rope_theta", defaults["rope_theta"])
  fields["mrope_section"] = mrope_section
  for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
    fields[name] = top.get(name, defaults[name])
  return VisionConfig(**fields)


def to_hf_dict(v: VisionConfig, out_size: int) -> dict[str, Any]:
  """config.json's `vision_config` (transformers' Qwen2_5_VLVisionConfig)."""
  return {
      "model_type": "qwen2_5_vl_vision",
      "depth": v.depth,
      "hidden_size": v.hidden_size,
      "intermediate_size": v.intermediate_size,
      "num_heads": v.num_heads,
      "out_hidden_size": out_size,
      "fullatt_block_indexes": list(v.fullatt_block_indexes),
      "window_size": v.window_size,
      "patch_size": v.patch_size,
      "temporal_patch_size": v.temporal_patch_size,
      "spatial_merge_size": v.spatial_merge_size,
      "in_channels": v.in_channels,
      "hidden_act": "silu",
      "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
  }

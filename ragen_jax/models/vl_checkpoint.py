"""Qwen2.5-VL's checkpoint names: the vision tower's tensors and the two layouts of the keys.

On the Hub (and in what transformers 5 saves) the language model is `model.*`, the tower
`visual.*` and the head `lm_head`, as a Qwen2 checkpoint plus the tower. transformers 5 holds them
in memory as `model.language_model.*` and `model.visual.*`; a checkpoint written from that
state_dict has those names. `hub_names` reads either as the Hub's.

Dimension legend: Lv blocks, Dv tower width, Hv heads, Dhv head dim, Fv MLP width, C values per
patch, M patches per image token, D decoder width. Hugging Face Linear weights are [out, in].
"""

from typing import Callable, Iterator

import numpy as np

from ragen_jax.models.vision_config import vision_table
from ragen_jax.models.vision_config import VisionConfig

# transformers 5's in-memory prefixes -> the Hub's.
_IN_MEMORY = (("model.language_model.", "model."), ("model.visual.", "visual."))


class _HubNames:
  """A tensor reader (`checkpoint._TensorReader`) whose keys are in transformers 5's in-memory
  layout, read by the Hub's names."""

  def __init__(self, reader):
    self._reader = reader
    self.unused = reader.unused

  @staticmethod
  def _stored(name: str) -> str:
    for stored, hub in _IN_MEMORY:
      if name.startswith(hub):
        return stored + name[len(hub) :]
    return name

  def __contains__(self, name: str) -> bool:
    return self._stored(name) in self._reader

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    return self._reader.get(self._stored(name), shape)


def hub_names(reader):
  """`reader` as the Hub's names: itself, or a renaming view when its keys are in transformers
  5's in-memory layout."""
  return _HubNames(reader) if "model.language_model.embed_tokens.weight" in reader else reader


def _specs(v: VisionConfig):
  """(our name, HF name, to-ours, to-HF) per tower tensor; "{i}" in a name is the block."""
  d, h, dh, c = v.hidden_size, v.num_heads, v.head_dim, v.patch_values
  ident = (lambda w: w), (lambda w: w)
  transpose = (lambda w: w.T), (lambda w: w.T)
  patch_shape = (d, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
  block = "visual.blocks.{i}."
  return [
      # The Conv3d [Dv, C] with stride = kernel is a linear map of the flattened patch.
      (
          "vision_patch_kernel",
          "visual.patch_embed.proj.weight",
          lambda w: w.reshape(d, c).T,
          lambda w: w.T.reshape(patch_shape),
      ),
      ("vision_attn_norm", block + "norm1.weight", *ident),
      (  # rows of qkv are (q, k, v) x heads x Dhv
          "vision_qkv_kernel",
          block + "attn.qkv.weight",
          lambda w: w.T.reshape(d, 3, h, dh),
          lambda w: w.reshape(d, 3 * d).T,
      ),
      (
          "vision_qkv_bias",
          block + "attn.qkv.bias",
          lambda b: b.reshape(3, h, dh),
          lambda b: b.reshape(3 * d),
      ),
      (
          "vision_o_kernel",
          block + "attn.proj.weight",
          lambda w: w.T.reshape(h, dh, d),
          lambda w: w.reshape(d, d).T,
      ),
      ("vision_o_bias", block + "attn.proj.bias", *ident),
      ("vision_mlp_norm", block + "norm2.weight", *ident),
      ("vision_gate_kernel", block + "mlp.gate_proj.weight", *transpose),
      ("vision_gate_bias", block + "mlp.gate_proj.bias", *ident),
      ("vision_up_kernel", block + "mlp.up_proj.weight", *transpose),
      ("vision_up_bias", block + "mlp.up_proj.bias", *ident),
      ("vision_down_kernel", block + "mlp.down_proj.weight", *transpose),
      ("vision_down_bias", block + "mlp.down_proj.bias", *ident),
      ("vision_merger_norm", "visual.merger.ln_q.weight", *ident),
      ("vision_merger_hidden_kernel", "visual.merger.mlp.0.weight", *transpose),
      ("vision_merger_hidden_bias", "visual.merger.mlp.0.bias", *ident),
      ("vision_merger_out_kernel", "visual.merger.mlp.2.weight", *transpose),
      ("vision_merger_out_bias", "visual.merger.mlp.2.bias", *ident),
  ]


def _hf_shape(to_hf, shape) -> tuple[int, ...]:
  return tuple(to_hf(np.empty(shape, np.float32)).shape)


def fill_tower(tower, reader, fill: Callable) -> None:
  """Fills the VisionTower `tower` from `reader` (Hub names), one parameter at a time through
  `fill(variable, build)` (`checkpoint._fill`)."""
  table = vision_table(tower.config.vision, tower.config.hidden_size)
  for ours, hf, to_ours, to_hf in _specs(tower.config.vision):
    shape, axes = table[ours]

    def build(buf, hf=hf, to_ours=to_ours, to_hf=to_hf, shape=shape, stacked=axes[0] == "layers"):
      if not stacked:
        buf[...] = to_ours(reader.get(hf, _hf_shape(to_hf, shape)))
        return
      for i in range(shape[0]):
        buf[i] = to_ours(reader.get(hf.format(i=i), _hf_shape(to_hf, shape[1:])))

    fill(getattr(tower, ours), build)


def tower_tensors(tower) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (Hub name, array) for every tensor of the VisionTower `tower`."""
  table = vision_table(tower.config.vision, tower.config.hidden_size)
  for ours, hf, _, to_hf in _specs(tower.config.vision):
    value = np.asarray(getattr(tower, ours)[...])
    if table[ours][1][0] != "layers":
      yield hf, np.ascontiguousarray(to_hf(value))
      continue
    for i in range(value.shape[0]):
      yield hf.format(i=i), np.ascontiguousarray(to_hf(value[i]))

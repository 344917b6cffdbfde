"""Decoder configuration (Qwen2, Qwen3, Llama 3.x, Qwen2.5-VL), presets and the parameter shapes
it implies (`param_table`); the Hugging Face config.json is models/hf_config.py's.

The families share one decoder (pre-norm, grouped-query attention, RoPE, SwiGLU); they differ in
q/k/v biases (Qwen2), per-head RMSNorm of q and k (Qwen3), RoPE frequency scaling (Llama 3.1+)
and a vision tower with 3-axis rotary positions (Qwen2.5-VL, `vision`). ModelConfig names each
difference (`attention_bias`, `qk_norm`, `rope_scaling`, `vision`), so the model code reads
features, never family names.

Dimension legend used across `ragen_jax.models`:
  B batch, T new tokens, S keys (cache capacity, or T without a cache),
  L layers, D model dim, H query heads, K kv heads, G = H // K query heads per
  kv head, Dh head dim, V vocab, F mlp dim.
"""

import dataclasses
import math
from typing import Annotated, Any

import jax.numpy as jnp

from ragen_jax.config_checks import check_fields
from ragen_jax.config_checks import check_value
from ragen_jax.config_checks import OneOf
from ragen_jax.config_checks import PositiveFloat
from ragen_jax.config_checks import PositiveInt
from ragen_jax.models.attention import IMPLEMENTATIONS
from ragen_jax.models.attention import QUERY_BLOCK
from ragen_jax.models.vision_config import qwen25_vl_3b_vision
from ragen_jax.models.vision_config import tiny_vision
from ragen_jax.models.vision_config import vision_table
from ragen_jax.models.vision_config import VisionConfig

# Vocabulary of the SentencePiece model shipped in ragen_jax/assets (the tiny
# presets use it so that CPU training does not pay for a 151936-row softmax).
SENTENCEPIECE_VOCAB_SIZE = 2048


@dataclasses.dataclass(frozen=True)
class _Family:
  """What a Hugging Face model_type fixes, and its config class's defaults for absent keys."""

  architecture: str
  attention_bias: bool  # q/k/v projections carry biases (o_proj never does)
  qk_norm: bool  # RMSNorm over each head's Dh on q and k, before RoPE
  head_dim: int | None  # None: hidden_size // num_attention_heads
  max_position_embeddings: int


FAMILIES = {
    "qwen2": _Family("Qwen2ForCausalLM", True, False, None, 32768),
    "qwen3": _Family("Qwen3ForCausalLM", False, True, 128, 32768),
    "llama": _Family("LlamaForCausalLM", False, False, None, 2048),
    # Qwen2.5-VL: the Qwen2 decoder (head_dim = D / H) behind a vision tower (`vision`).
    "qwen2_5_vl": _Family("Qwen2_5_VLForConditionalGeneration", True, False, None, 32768),
}
VISION_FAMILY = "qwen2_5_vl"  # the model_type that has (and needs) `vision`
ROPE_TYPES = ("default", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1's RoPE frequency remapping (Hugging Face rope_type "llama3").

  Frequencies whose wavelength is shorter than original / high_freq_factor are kept,
  those longer than original / low_freq_factor are divided by `factor`, and the ones in
  between are interpolated (`layers.rope_inv_freq`). Frozen and flat, so it can sit in a
  hashable ModelConfig.

  Attributes:
    factor: divisor of the low frequencies.
    low_freq_factor: wavelengths above original / low_freq_factor are divided by `factor`.
    high_freq_factor: wavelengths below original / high_freq_factor are kept as they are.
    original_max_position_embeddings: the context length of pre-training.
    rope_type: "llama3", the only remapping implemented.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int
  rope_type: str = "llama3"

  def __post_init__(self):
    if self.rope_type != "llama3":
      raise ValueError(
          f"rope_type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
      )
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"rope scaling {name} must be a positive number, got {value!r}")
      object.__setattr__(self, name, float(value))
    original = self.original_max_position_embeddings
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
      raise ValueError(
          f"rope scaling original_max_position_embeddings must be a positive int, got {original!r}"
      )
    if self.low_freq_factor >= self.high_freq_factor:
      raise ValueError(
          f"rope scaling low_freq_factor {self.low_freq_factor} must be below "
          f"high_freq_factor {self.high_freq_factor}"
      )

  def to_hf_dict(self) -> dict[str, Any]:
    """The rope_scaling / rope_parameters entries (without rope_theta)."""
    return {
        "rope_type": self.rope_type,
        "factor": self.factor,
        "low_freq_factor": self.low_freq_factor,
        "high_freq_factor": self.high_freq_factor,
        "original_max_position_embeddings": self.original_max_position_embeddings,
    }


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on the decoder's linear layers (`ragen_jax.models.lora`).

  Each target kernel W gains W + (alpha / rank) * A @ B, A random and B zero at the start.

  Attributes:
    rank: r, the adapters' inner width (positive).
    alpha: the scale's numerator; the adapter's output is multiplied by alpha / rank.
    targets: which of `LORA_TARGETS` (the q, k, v, o projections and gate, up, down of the MLP)
      carry adapters.
    dropout: must be 0 (adapter dropout is not implemented).
  """

  rank: PositiveInt
  alpha: PositiveFloat = 64.0
  targets: tuple[str, ...] = LORA_TARGETS
  dropout: float = 0.0

  def __post_init__(self):
    check_fields(self, "lora")
    object.__setattr__(self, "alpha", float(self.alpha))
    targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if not targets or unknown or len(set(targets)) != len(targets):
      raise ValueError(
          f"lora targets must be distinct names among {LORA_TARGETS}, got {self.targets!r}"
      )
    # Canonical order: equal configs hash equal (ModelConfig is a jit static argument).
    object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in targets))
    if self.dropout != 0:
      raise ValueError(f"lora dropout is not implemented; it must be 0, got {self.dropout!r}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of a Qwen2, Qwen3 or Llama 3.x decoder.

  Attributes:
    vocab_size: V, rows of the embedding (may exceed the tokenizer's size).
    hidden_size: D.
    intermediate_size: F, SwiGLU width.
    num_layers: L.
    num_heads: H, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention); divides H.
    head_dim: Dh; Qwen2 and Llama use D // H, Qwen3 sets it independently (128).
    rope_theta: rotary base frequency.
    rms_norm_eps: epsilon inside every RMSNorm.
    tie_word_embeddings: the LM head is the transposed embedding.
    max_position_embeddings: informational (written to config.json).
    dtype: activation / compute dtype.
    param_dtype: dtype the parameters are stored in.
    remat: rematerialise each layer in the backward pass (saves memory).
    attention: the self-attention kernel, one of `attention.IMPLEMENTATIONS` (auto picks by
      device and dtype; see ragen_jax/models/attention.py).
    attention_block: queries per block of the XLA kernel (its trade-off: config.schema).
    model_type: the Hugging Face family, one of `FAMILIES` ("qwen2", "qwen3", "llama",
      "qwen2_5_vl"): the class config.json names, and with it `attention_bias` and `qk_norm`.
    rope_scaling: RoPE frequency remapping (Llama 3.1+), a RopeScaling or its dict; None for
      plain RoPE.
    lora: low-rank adapters on the layers' kernels, a LoraConfig or its dict; None for none.
      Not part of the Hugging Face config (export merges them, `lora.merge`).
    vision: Qwen2.5-VL's vision tower and image tokens, a VisionConfig or its dict (model_type
      "qwen2_5_vl" has one, the others none); its parameters are part of `param_table`.
  """

  vocab_size: PositiveInt
  hidden_size: PositiveInt
  intermediate_size: PositiveInt
  num_layers: PositiveInt
  num_heads: PositiveInt
  num_kv_heads: PositiveInt
  head_dim: PositiveInt | None = None  # checked once derived
  rope_theta: PositiveFloat = 1e6
  rms_norm_eps: PositiveFloat = 1e-6
  tie_word_embeddings: bool = True
  max_position_embeddings: PositiveInt = 32768
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: bool = False
  attention: Annotated[str, OneOf(IMPLEMENTATIONS)] = "auto"
  attention_block: PositiveInt = QUERY_BLOCK
  model_type: str = "qwen2"
  rope_scaling: RopeScaling | None = None
  lora: LoraConfig | None = None
  vision: VisionConfig | None = None

  def __post_init__(self):
    # Frozen dataclass: normalise through object.__setattr__.
    if self.model_type not in FAMILIES:
      raise ValueError(
          f"model_type {self.model_type!r} is not supported (supported: {', '.join(FAMILIES)})"
      )
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise ValueError(
          f"rope_scaling must be a RopeScaling, its dict or None, got {self.rope_scaling!r}"
      )
    if isinstance(self.lora, dict):
      object.__setattr__(self, "lora", LoraConfig(**self.lora))
    if self.lora is not None and not isinstance(self.lora, LoraConfig):
      raise ValueError(f"lora must be a LoraConfig, its dict or None, got {self.lora!r}")
    if isinstance(self.vision, dict):
      object.__setattr__(self, "vision", VisionConfig(**self.vision))
    if self.vision is not None and not isinstance(self.vision, VisionConfig):
      raise ValueError(f"vision must be a VisionConfig, its dict or None, got {self.vision!r}")
    if (self.vision is not None) != (self.model_type == VISION_FAMILY):
      raise ValueError(f"a vision config goes with model_type {VISION_FAMILY!r} and only with it")
    check_fields(self, "")
    if self.head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(
            f"hidden_size {self.hidden_size} is not divisible by num_heads "
            f"{self.num_heads}; pass head_dim explicitly"
        )
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    check_value("head_dim", self.head_dim, PositiveInt)
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads {self.num_heads} is not divisible by num_kv_heads " f"{self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
    for name in ("dtype", "param_dtype"):
      if not jnp.issubdtype(getattr(self, name), jnp.floating):
        raise ValueError(f"{name} must be a floating dtype, got {getattr(self, name)}")
    if self.vision is not None:
      self._check_vision()

  def _check_vision(self):
    # transformers' Qwen2.5-VL text attention derives Dh = D / H, without scaling.
    if self.head_dim * self.num_heads != self.hidden_size or self.rope_scaling is not None:
      raise ValueError("Qwen2.5-VL needs head_dim = hidden_size / num_heads and no rope_scaling")
    if sum(self.vision.mrope_section) != self.head_dim // 2:
      raise ValueError(
          f"mrope_section {self.vision.mrope_section} must sum to head_dim / 2 = "
          f"{self.head_dim // 2}"
      )

  # Derived, not fields: transformers fixes both per class (an attention_bias in Llama's or
  # Qwen3's config.json also adds an o_proj bias, which this decoder lacks), so no other
  # combination could be exported, and `replace(model_type=...)` stays consistent.
  @property
  def attention_bias(self) -> bool:
    """The q/k/v projections carry biases (Qwen2)."""
    return FAMILIES[self.model_type].attention_bias

  @property
  def qk_norm(self) -> bool:
    """q and k pass through an RMSNorm over Dh before RoPE, one [Dh] scale per layer shared by
    the heads (Qwen3)."""
    return FAMILIES[self.model_type].qk_norm

  @property
  def num_groups(self) -> int:
    """G, query heads sharing one kv head."""
    return self.num_heads // self.num_kv_heads

  @property
  def excluded_token_ids(self) -> tuple[int, ...]:
    """Ids outside the policy's support (never sampled, no mass in any scorer of policy tokens):
    Qwen2.5-VL's vision tokens, as images are located by id; none for text models."""
    return () if self.vision is None else self.vision.structure_token_ids

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def _qwen25(hidden, inter, layers, heads, kv_heads, tied, vocab=151936):
  return ModelConfig(
      vocab_size=vocab,
      hidden_size=hidden,
      intermediate_size=inter,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=kv_heads,
      rope_theta=1e6,
      rms_norm_eps=1e-6,
      tie_word_embeddings=tied,
      max_position_embeddings=32768,
  )


def _qwen3(hidden, inter, layers, heads, tied):
  return ModelConfig(
      vocab_size=151936,
      hidden_size=hidden,
      intermediate_size=inter,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=8,
      head_dim=128,
      rope_theta=1e6,
      rms_norm_eps=1e-6,
      tie_word_embeddings=tied,
      max_position_embeddings=40960,
      model_type="qwen3",
  )


def _llama32(hidden, layers, heads, head_dim):
  return ModelConfig(
      vocab_size=128256,
      hidden_size=hidden,
      intermediate_size=8192,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=8,
      head_dim=head_dim,
      rope_theta=500000.0,
      rms_norm_eps=1e-5,
      tie_word_embeddings=True,
      max_position_embeddings=131072,
      model_type="llama",
      rope_scaling=RopeScaling(
          factor=32.0,
          low_freq_factor=1.0,
          high_freq_factor=4.0,
          original_max_position_embeddings=8192,
      ),
  )


# Shapes and tie flags of the published Qwen2.5 checkpoints (config.json of the
# base and Instruct models agree). 0.5B/1.5B/3B tie the LM head to the
# embedding; 7B does not and pads its vocabulary to 152064 rows.
PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-3b": _qwen25(2048, 11008, 36, 16, 2, tied=True),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, tied=False, vocab=152064),
    # Qwen2.5-VL-3B-Instruct (config.json): the 3B decoder, 128,000 positions, the vision tower.
    "qwen2.5-vl-3b": _qwen25(2048, 11008, 36, 16, 2, tied=True).replace(
        max_position_embeddings=128000, model_type=VISION_FAMILY, vision=qwen25_vl_3b_vision()
    ),
    # Qwen3 (config.json of Qwen/Qwen3-*): head_dim 128 whatever the width; 8B unties the head.
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tied=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, tied=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tied=False),
    # Llama 3.2 (config.json of meta-llama/Llama-3.2-*): both tie the head, llama3 RoPE scaling
    # of 8192 pre-training positions to 131072.
    "llama-3.2-1b": _llama32(2048, 16, 32, head_dim=64),
    "llama-3.2-3b": _llama32(3072, 28, 24, head_dim=128),
    # SmolLM2-135M (HuggingFaceTB; its weights: `python -m ragen_jax.models.fetch
    # smollm2-135m-instruct`): Llama architecture, GQA 9:3, tied head, 49,152-token vocabulary.
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        model_type="llama",
    ),
    # ~1.1M parameters: trains in seconds per step on a 2-core CPU.
    "tiny": ModelConfig(
        vocab_size=SENTENCEPIECE_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=1e4,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    # Qwen2.5-VL for CPU tests and runs (`vision_config.tiny_vision`'s tower); the vision token ids
    # sit just past the SentencePiece vocabulary, so they never collide with its pieces.
    "tiny-vl": ModelConfig(
        vocab_size=SENTENCEPIECE_VOCAB_SIZE + 4,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=1e4,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        model_type=VISION_FAMILY,
        vision=tiny_vision(first_token_id=SENTENCEPIECE_VOCAB_SIZE),
    ),
    # ~7M parameters: still CPU-friendly, deep enough to learn the env tasks.
    "small": ModelConfig(
        vocab_size=SENTENCEPIECE_VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        rope_theta=1e4,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
}


def get_config(name: str, **overrides) -> ModelConfig:
  """Returns the preset `name` with `overrides` applied.

  Args:
    name: one of `PRESETS` (case-insensitive).
    **overrides: ModelConfig fields to replace (e.g. dtype=jnp.bfloat16).

  Returns:
    The ModelConfig.

  Raises:
    ValueError: unknown name; the message lists the valid ones.
  """
  key = name.lower()
  if key not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; valid presets: {sorted(PRESETS)}")
  return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]


# {name: (shape, logical axes)} of parameters; per-layer ones carry a leading L ("layers") axis.
ParamTable = dict[str, tuple[tuple[int, ...], tuple[str, ...]]]


def kernel_table(c: ModelConfig) -> ParamTable:
  """The stacked linear kernels, the part of `layer_table` that LoRA adapters can target."""
  l, d, h, k = c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads
  dh, f = c.head_dim, c.intermediate_size
  return {
      "q_kernel": ((l, d, h, dh), ("layers", "embed", "heads", "head_dim")),
      "k_kernel": ((l, d, k, dh), ("layers", "embed", "kv_heads", "head_dim")),
      "v_kernel": ((l, d, k, dh), ("layers", "embed", "kv_heads", "head_dim")),
      "o_kernel": ((l, h, dh, d), ("layers", "heads", "head_dim", "embed")),
      "gate_kernel": ((l, d, f), ("layers", "embed", "mlp")),
      "up_kernel": ((l, d, f), ("layers", "embed", "mlp")),
      "down_kernel": ((l, f, d), ("layers", "mlp", "embed")),
  }


def layer_table(c: ModelConfig) -> ParamTable:
  """Every stacked decoder-layer parameter the config has: the kernels, Qwen2's q/k/v biases,
  Qwen3's q/k norm scales (one [Dh] per layer, shared by the heads) and the two norm scales."""
  l, d, h, k, dh = c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
  table = kernel_table(c)
  if c.attention_bias:
    table["q_bias"] = ((l, h, dh), ("layers", "heads", "head_dim"))
    table["k_bias"] = ((l, k, dh), ("layers", "kv_heads", "head_dim"))
    table["v_bias"] = ((l, k, dh), ("layers", "kv_heads", "head_dim"))
  if c.qk_norm:
    table["q_norm"] = ((l, dh), ("layers", "head_dim"))
    table["k_norm"] = ((l, dh), ("layers", "head_dim"))
  table["attn_norm"] = ((l, d), ("layers", "embed"))
  table["mlp_norm"] = ((l, d), ("layers", "embed"))
  return table


def param_table(c: ModelConfig) -> ParamTable:
  """Every parameter of the causal LM, the one table that the model's modules, the checkpoint
  I/O, `num_params` and the memory estimate read: the embedding, `layer_table`, the final norm,
  the LM head when not tied to the embedding, and Qwen2.5-VL's vision tower
  (`vision_config.vision_table`)."""
  d, v = c.hidden_size, c.vocab_size
  table = {"embedding": ((v, d), ("vocab", "embed")), **layer_table(c)}
  table["final_norm"] = ((d,), ("embed",))
  if not c.tie_word_embeddings:
    table["lm_head"] = ((d, v), ("embed", "vocab"))
  if c.vision is not None:
    table.update(vision_table(c.vision, d))
  return table


def num_params(config: ModelConfig) -> int:
  """Parameter count of the causal LM (embedding counted once when tied)."""
  return sum(math.prod(shape) for shape, _ in param_table(config).values())

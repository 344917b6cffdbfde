"""Qwen2 model configuration, presets and the mapping to Hugging Face config.json.

Dimension legend used across `ragen_jax.models`:
  B batch, T new tokens, S keys (cache capacity, or T without a cache),
  L layers, D model dim, H query heads, K kv heads, G = H // K query heads per
  kv head, Dh head dim, V vocab, F mlp dim.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from ragen_jax.models.attention import IMPLEMENTATIONS

# Vocabulary of the SentencePiece model shipped in ragen_jax/assets (the tiny
# presets use it so that CPU training does not pay for a 151936-row softmax).
SENTENCEPIECE_VOCAB_SIZE = 2048


# config.json keys without which a Qwen2 decoder has no shape (the others have defaults).
_HF_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of a Qwen2-architecture decoder.

  Attributes:
    vocab_size: V, rows of the embedding (may exceed the tokenizer's size).
    hidden_size: D.
    intermediate_size: F, SwiGLU width.
    num_layers: L.
    num_heads: H, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention); divides H.
    head_dim: Dh; Qwen2 uses D // H, other values are valid too.
    rope_theta: rotary base frequency.
    rms_norm_eps: epsilon inside every RMSNorm.
    tie_word_embeddings: the LM head is the transposed embedding.
    max_position_embeddings: informational (written to config.json).
    dtype: activation / compute dtype.
    param_dtype: dtype the parameters are stored in.
    remat: rematerialise each layer in the backward pass (saves memory).
    attention: the self-attention kernel, one of `attention.IMPLEMENTATIONS` (auto picks by
      device and dtype; see ragen_jax/models/attention.py).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int | None = None
  rope_theta: float = 1e6
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  max_position_embeddings: int = 32768
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: bool = False
  attention: str = "auto"

  def __post_init__(self):
    # Frozen dataclass: normalise through object.__setattr__.
    if self.head_dim is None:
      if self.num_heads <= 0 or self.hidden_size % self.num_heads:
        raise ValueError(
            f"hidden_size {self.hidden_size} is not divisible by num_heads "
            f"{self.num_heads}; pass head_dim explicitly"
        )
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "max_position_embeddings",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads {self.num_heads} is not divisible by num_kv_heads " f"{self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
    if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
      raise ValueError("rope_theta and rms_norm_eps must be positive")
    if self.attention not in IMPLEMENTATIONS:
      raise ValueError(f"attention must be one of {IMPLEMENTATIONS}, got {self.attention!r}")
    for name in ("dtype", "param_dtype"):
      if not jnp.issubdtype(getattr(self, name), jnp.floating):
        raise ValueError(f"{name} must be a floating dtype, got {getattr(self, name)}")

  @property
  def num_groups(self) -> int:
    """G, query heads sharing one kv head."""
    return self.num_heads // self.num_kv_heads

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from a Hugging Face Qwen2 `config.json` dict.

    Accepts both the transformers v4 layout (`rope_theta` at the top level) and
    the v5 layout (`rope_parameters`).

    Args:
      d: the parsed config.json.
      **overrides: fields to set on top (e.g. dtype, param_dtype).

    Returns:
      The ModelConfig.

    Raises:
      ValueError: a required key is missing, or a model type or feature this implementation
        lacks.
    """
    missing = [k for k in _HF_REQUIRED_KEYS if k not in d]
    if missing:
      raise ValueError(f"missing required key(s) {', '.join(map(repr, missing))}")
    model_type = d.get("model_type", "qwen2")
    if model_type != "qwen2":
      raise ValueError(f"model_type {model_type!r} is not supported (only 'qwen2')")
    if d.get("use_sliding_window", False):
      raise ValueError("use_sliding_window=true is not supported")
    if d.get("hidden_act", "silu") != "silu":
      raise ValueError(f"hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
    rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    fields = dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim"),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        # Qwen2Config's own default when the key is missing.
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=d.get("max_position_embeddings", 32768),
    )
    fields.update(overrides)
    return cls(**fields)

  def to_hf_dict(self) -> dict[str, Any]:
    """Returns a config.json dict that transformers (v4 and v5) loads as Qwen2."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        # Both spellings: v4 reads rope_theta, v5 reads rope_parameters.
        "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "torch_dtype": self.param_dtype.name,
        "dtype": self.param_dtype.name,
    }


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


# Shapes and tie flags of the published Qwen2.5 checkpoints (config.json of the
# base and Instruct models agree). 0.5B/1.5B/3B tie the LM head to the
# embedding; 7B does not and pads its vocabulary to 152064 rows.
PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-3b": _qwen25(2048, 11008, 36, 16, 2, tied=True),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, tied=False, vocab=152064),
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


def num_params(config: ModelConfig) -> int:
  """Parameter count of the causal LM (embedding counted once when tied)."""
  d, f, h, k, dh = (
      config.hidden_size,
      config.intermediate_size,
      config.num_heads,
      config.num_kv_heads,
      config.head_dim,
  )
  attn = d * h * dh + h * dh + 2 * (d * k * dh + k * dh) + h * dh * d
  layer = attn + 3 * d * f + 2 * d
  embed = config.vocab_size * d * (1 if config.tie_word_embeddings else 2)
  return config.num_layers * layer + embed + d

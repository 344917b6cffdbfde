"""The Hugging Face config.json of a decoder: `from_hf_dict` and `to_hf_dict`.

    config = hf_config.from_hf_dict(json.load(fp), dtype=jnp.bfloat16)
    json.dump(hf_config.to_hf_dict(config), fp)

The JSON is that of transformers' Qwen2, Qwen3 and Llama config classes (v4 and v5 layouts);
what this decoder lacks (sliding windows, other activations or RoPE types, o_proj or MLP biases)
is an error naming it. `ModelConfig.from_hf_dict` / `.to_hf_dict` call these.
"""

from typing import Any

from ragen_jax.models.config import FAMILIES
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.config import ROPE_TYPES
from ragen_jax.models.config import RopeScaling

# config.json keys without which a decoder has no shape (the others have defaults).
REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def from_hf_dict(d: dict[str, Any], **overrides) -> ModelConfig:
  """Builds a config from a Hugging Face Qwen2, Qwen3 or Llama `config.json` dict.

  Accepts both the transformers v4 layout (`rope_theta` and `rope_scaling` at the top
  level) and the v5 layout (`rope_parameters`). Absent keys take the defaults of the
  model_type's transformers config class.

  Args:
    d: the parsed config.json.
    **overrides: fields to set on top (e.g. dtype, param_dtype).

  Returns:
    The ModelConfig.

  Raises:
    ValueError: a required key is missing, or a model type or feature this implementation
      lacks (the message names it and what is supported).
  """
  missing = [k for k in REQUIRED_KEYS if k not in d]
  if missing:
    raise ValueError(f"missing required key(s) {', '.join(map(repr, missing))}")
  model_type = d.get("model_type", "qwen2")
  if model_type not in FAMILIES:
    raise ValueError(
        f"model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})"
    )
  family = FAMILIES[model_type]
  if d.get("use_sliding_window", False):
    raise ValueError("use_sliding_window=true is not supported")
  if d.get("hidden_act", "silu") != "silu":
    raise ValueError(f"hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
  # Qwen2's config has no such keys (its q/k/v biases are fixed); Llama's and Qwen3's
  # attention_bias also puts a bias on o_proj, and mlp_bias on the MLP: neither exists here.
  for key in ("attention_bias", "mlp_bias"):
    if model_type != "qwen2" and d.get(key, False):
      raise ValueError(f"{key}=true is not supported for model_type {model_type!r}")
  if d.get("pretraining_tp", 1) not in (1, None):
    raise ValueError(f"pretraining_tp {d['pretraining_tp']!r} is not supported (only 1)")
  # transformers v5 lets a legacy rope_scaling win over rope_parameters; v4 knows only it.
  rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ROPE_TYPES:
    raise ValueError(
        f"rope_type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
    )
  if rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
    raise ValueError("partial_rotary_factor other than 1 is not supported")
  rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
  max_positions = d.get("max_position_embeddings", family.max_position_embeddings)
  rope_scaling = None
  if rope_type == "llama3":
    absent = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
    if absent:
      raise ValueError(f"rope_type 'llama3' lacks {', '.join(map(repr, absent))}")
    rope_scaling = RopeScaling(
        factor=rope["factor"],
        low_freq_factor=rope["low_freq_factor"],
        high_freq_factor=rope["high_freq_factor"],
        # transformers falls back to max_position_embeddings.
        original_max_position_embeddings=rope.get(
            "original_max_position_embeddings", max_positions
        ),
    )
  fields = dict(
      vocab_size=d["vocab_size"],
      hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"],
      num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"],
      num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
      head_dim=d.get("head_dim") or family.head_dim,
      rope_theta=float(rope_theta),
      rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      # The transformers classes' own default when the key is missing.
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      max_position_embeddings=max_positions,
      model_type=model_type,
      rope_scaling=rope_scaling,
  )
  fields.update(overrides)
  return ModelConfig(**fields)


def to_hf_dict(config: ModelConfig) -> dict[str, Any]:
  """Returns a config.json dict that transformers (v4 and v5) loads as `config`'s model_type's
  causal LM class (Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM)."""
  scaling = None if config.rope_scaling is None else config.rope_scaling.to_hf_dict()
  d = {
      "architectures": [FAMILIES[config.model_type].architecture],
      "model_type": config.model_type,
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": config.rms_norm_eps,
      # Both spellings: v4 reads rope_theta and rope_scaling, v5 reads rope_parameters.
      "rope_theta": config.rope_theta,
      "rope_scaling": scaling,
      "rope_parameters": {
          **(scaling or {"rope_type": "default"}),
          "rope_theta": config.rope_theta,
      },
      "tie_word_embeddings": config.tie_word_embeddings,
      "max_position_embeddings": config.max_position_embeddings,
      "attention_dropout": 0.0,
      "torch_dtype": config.param_dtype.name,
      "dtype": config.param_dtype.name,
  }
  if config.model_type in ("qwen2", "qwen3"):
    d["use_sliding_window"] = False
  if config.model_type in ("qwen3", "llama"):
    d["attention_bias"] = False
  if config.model_type == "llama":
    d["mlp_bias"] = False
  return d

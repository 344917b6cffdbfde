"""The Hugging Face config.json of a decoder: `from_hf_dict` and `to_hf_dict`.

    config = hf_config.from_hf_dict(json.load(fp), dtype=jnp.bfloat16)
    json.dump(hf_config.to_hf_dict(config), fp)

The JSON is that of transformers' Qwen2, Qwen3 and Llama config classes (v4 and v5 layouts) and
of Qwen2.5-VL (the text fields in `text_config` as transformers 5 writes them, or at the top
level as the Hub's checkpoints have them; `vision_config`; "mrope" rope parameters);
what this decoder lacks (sliding windows, other activations or RoPE types, o_proj or MLP biases)
is an error naming it. `ModelConfig.from_hf_dict` / `.to_hf_dict` call these.
"""

from typing import Any

from ragen_jax.models import vision_config
from ragen_jax.models.config import FAMILIES
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.config import ROPE_TYPES
from ragen_jax.models.config import RopeScaling
from ragen_jax.models.config import VISION_FAMILY

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
  if d.get("model_type") == VISION_FAMILY:
    d, vision = _split_vision(d)
    overrides = {"vision": vision, **overrides}
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


def _split_vision(d: dict[str, Any]) -> tuple[dict[str, Any], vision_config.VisionConfig]:
  """A Qwen2.5-VL config.json as (the text model's dict in the decoder's layout, the tower's
  VisionConfig)."""
  text = {k: v for k, v in d.items() if k not in ("text_config", "vision_config")}
  text.update(d.get("text_config") or {})
  text["model_type"] = VISION_FAMILY
  # Before transformers 5 the flag could sit in text_config; either place ties.
  tied = d.get("tie_word_embeddings") or text.get("tie_word_embeddings")
  text["tie_word_embeddings"] = bool(tied)
  rope = dict(text.pop("rope_scaling", None) or text.get("rope_parameters") or {})
  if rope.get("rope_type", rope.get("type", "mrope")) not in ("mrope", "default"):
    raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported for Qwen2.5-VL")
  mrope_section = rope.get("mrope_section", [16, 24, 24])  # transformers' default
  theta = rope.get("rope_theta", text.get("rope_theta", 1e6))
  text["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
  vision_dict = d.get("vision_config") or {}
  out = vision_dict.get("out_hidden_size", text.get("hidden_size"))
  if out != text.get("hidden_size"):
    raise ValueError(
        f"vision out_hidden_size {out} differs from hidden_size {text.get('hidden_size')}"
    )
  return text, vision_config.from_hf_dict(vision_dict, d, mrope_section)


def to_hf_dict(config: ModelConfig) -> dict[str, Any]:
  """Returns a config.json dict that transformers (v4 and v5) loads as `config`'s model_type's
  causal LM class (Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM; transformers 5's
  Qwen2_5_VLForConditionalGeneration for Qwen2.5-VL)."""
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
  if config.vision is not None:
    return _vision_hf_dict(config, d)
  return d


def _vision_hf_dict(config: ModelConfig, text: dict[str, Any]) -> dict[str, Any]:
  """Qwen2.5-VL's config.json: `text` (the decoder's dict) as text_config, the tower's
  vision_config and the token ids at the top."""
  v = config.vision
  for key in ("architectures", "rope_scaling", "rope_theta", "head_dim", "torch_dtype"):
    text.pop(key)
  text["model_type"] = "qwen2_5_vl_text"
  text["rope_parameters"]["mrope_section"] = list(v.mrope_section)
  return {
      "architectures": [FAMILIES[VISION_FAMILY].architecture],
      "model_type": VISION_FAMILY,
      "text_config": text,
      "vision_config": vision_config.to_hf_dict(v, config.hidden_size),
      "image_token_id": v.image_token_id,
      "video_token_id": v.video_token_id,
      "vision_start_token_id": v.vision_start_token_id,
      "vision_end_token_id": v.vision_end_token_id,
      "tie_word_embeddings": config.tie_word_embeddings,
      "dtype": config.param_dtype.name,
  }

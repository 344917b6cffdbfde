"""Qwen3 and Llama 3.x through ragen_jax.models, held to Hugging Face transformers (PyTorch CPU).

Random tiny Qwen3ForCausalLM and LlamaForCausalLM models have every tensor randomised (q/k
norm scales included), so a mis-mapped or ignored weight shows in the logits; both
implementations then run left-padded batches in float32. Llama 3.1's RoPE remapping is tested
with a small original_max_position_embeddings, so that the sequences run past it and all three
frequency bands (kept, blended, slowed) occur. Dimension legend: B batch, T length, V vocab.
"""

import json
import math
import os

from flax import nnx
import jax
import numpy as np
import pytest
import safetensors
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ragen_jax import models
from ragen_jax import sampling
from ragen_jax.models import layers as ops
from references import hf_logits  # pylint: disable=g-bad-import-order
from tiny import left_padded_batch
from tiny import randomise

VOCAB = 97
# Head size 16 at theta 1e4 has wavelengths 6.3, 19.9, 62.8, ... positions: with 32 original
# positions and factors 1 / 4, the first frequency is kept, the second blended, the rest slowed.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

# (name, (transformers config class, kwargs)): GQA, MQA and MHA; Qwen3 head sizes unrelated to
# hidden // heads; tied and untied heads; Llama with and without llama3 RoPE scaling.
HF_CONFIGS = {
    "qwen3_tied_gqa2_headdim24": (
        "qwen3",
        dict(
            hidden_size=40,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            intermediate_size=72,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        ),
    ),
    "qwen3_untied_mqa_headdim16": (
        "qwen3",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=48,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        ),
    ),
    "llama_tied_gqa2_llama3": (
        "llama",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            tie_word_embeddings=True,
            rope_parameters={**LLAMA3_ROPE, "rope_theta": 1e4},
        ),
    ),
    "llama_untied_mha_default": (
        "llama",
        dict(
            hidden_size=48,
            num_attention_heads=3,
            num_key_value_heads=3,
            intermediate_size=64,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        ),
    ),
}
HF_CLASSES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
}


def make_hf_model(seed, family, **kwargs):
  """A float32 Qwen3ForCausalLM / LlamaForCausalLM with every parameter randomised."""
  config_cls, model_cls = HF_CLASSES[family]
  config = config_cls(
      vocab_size=VOCAB,
      num_hidden_layers=2,
      rms_norm_eps=1e-5,
      attn_implementation="eager",
      **kwargs,
  )
  model = model_cls(config).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.2 * noise)
  return model


def max_error(ours_BxTxV, ref_BxTxV, mask_BxT):
  real = np.asarray(mask_BxT).astype(bool)
  return float(np.max(np.abs(np.asarray(ours_BxTxV)[real] - ref_BxTxV[real])))


def edit_config(path, **changes):
  with open(os.path.join(path, "config.json"), encoding="utf-8") as fp:
    d = json.load(fp)
  d.update(changes)
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fp:
    json.dump(d, fp)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_load_hf_logits_match_transformers(tmp_path, name):
  family, kwargs = HF_CONFIGS[name]
  hf = make_hf_model(1, family, **kwargs)
  hf.save_pretrained(tmp_path)
  model = models.load_hf(str(tmp_path))
  c = model.config
  assert (c.model_type, c.tie_word_embeddings) == (family, kwargs["tie_word_embeddings"])
  assert c.head_dim == kwargs.get(
      "head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"]
  )
  layer_params = set(model.decoder.layers.stacked())
  assert ("q_norm" in layer_params) == (family == "qwen3")
  assert "q_bias" not in layer_params
  assert (c.rope_scaling is not None) == (kwargs["rope_parameters"]["rope_type"] == "llama3")

  # 40 positions: past the 32 original ones of the llama3 configs.
  lengths, total = [40, 23, 1], 40
  ids, mask = left_padded_batch(np.random.default_rng(0), lengths, total)
  ours = np.asarray(jax.jit(lambda i, m: model(i, attention_mask=m))(ids, mask))
  assert ours.dtype == np.float32 and ours.shape == (3, total, VOCAB)
  assert max_error(ours, hf_logits(hf, ids, mask), mask) <= 1e-4
  # Independent of any padding convention: each row alone, unpadded.
  for row, n in enumerate(lengths):
    alone = hf_logits(hf, ids[row : row + 1, total - n :])[0]
    np.testing.assert_allclose(ours[row, total - n :], alone, atol=1e-4, rtol=0)


def test_llama3_rope_scaling_is_needed_to_match(tmp_path):
  """Without the remapping the same weights give other logits (the parity above is not vacuous);
  position 0, which no frequency rotates, agrees either way."""
  family, kwargs = HF_CONFIGS["llama_tied_gqa2_llama3"]
  hf = make_hf_model(2, family, **kwargs)
  hf.save_pretrained(tmp_path)
  edit_config(
      tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, rope_scaling=None
  )
  unscaled = models.load_hf(str(tmp_path))
  assert unscaled.config.rope_scaling is None
  ids, mask = left_padded_batch(np.random.default_rng(1), [40], 40)
  diff = np.abs(np.asarray(unscaled(ids, mask))[0] - hf_logits(hf, ids, mask)[0]).max(axis=-1)
  assert diff[0] <= 1e-4  # position 0: no rotation at all
  assert diff[1:].max() > 1e-2


@pytest.mark.parametrize(
    "rope",
    [
        {**LLAMA3_ROPE, "rope_theta": 1e4},
        # Llama 3.2's own values, head size 64.
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 5e5,
        },
    ],
)
def test_rope_inv_freq_matches_transformers(rope):
  head_dim = 16 if rope["factor"] == 8.0 else 64
  hf_config = transformers.LlamaConfig(
      hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_parameters=rope
  )
  ref, attention_scale = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
  assert attention_scale == 1.0  # llama3 leaves cos / sin unscaled, as ours does
  scaling = models.hf_config.from_hf_dict(hf_config.to_dict()).rope_scaling
  ours = np.asarray(ops.rope_inv_freq(head_dim, rope["rope_theta"], scaling))
  np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6, atol=0)
  plain = np.asarray(ops.rope_inv_freq(head_dim, rope["rope_theta"]))
  kept = np.isclose(ours, plain, rtol=1e-6)
  slowed = np.isclose(ours, plain / rope["factor"], rtol=1e-6)
  assert kept.any() and slowed.any() and (~kept & ~slowed).any()  # all three bands


@pytest.mark.parametrize("name", ["qwen3_untied_mqa_headdim16", "llama_tied_gqa2_llama3"])
def test_cached_decoding_matches_transformers(tmp_path, name):
  """The KV-cache forward (prompt, then chunks) computes q and k as the full pass does."""
  family, kwargs = HF_CONFIGS[name]
  hf = make_hf_model(3, family, **kwargs)
  hf.save_pretrained(tmp_path)
  model = models.load_hf(str(tmp_path))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(2)
  ids, mask = left_padded_batch(rng, [20, 9], 20)
  cont = rng.integers(0, VOCAB, size=(2, 18)).astype(np.int32)
  full_ids = np.concatenate([ids, cont], axis=1)
  full_mask = np.concatenate([mask, np.ones_like(cont)], axis=1)

  @jax.jit
  def step(state, ids_BxT, mask_BxT, cache):
    return nnx.merge(graphdef, state)(ids_BxT, mask_BxT, cache=cache)

  cache = models.init_cache(model.config, batch=2, capacity=40)
  logits, cache = step(state, ids, mask, cache)
  outs = [np.asarray(logits)]
  for start in range(0, cont.shape[1], 6):
    piece = cont[:, start : start + 6]
    logits, cache = step(state, piece, np.ones_like(piece), cache)
    outs.append(np.asarray(logits))
  cached = np.concatenate(outs, axis=1)
  assert max_error(cached, hf_logits(hf, full_ids, full_mask), full_mask) <= 1e-4


@pytest.mark.parametrize("name", ["qwen3_untied_mqa_headdim16", "llama_tied_gqa2_llama3"])
def test_greedy_sampling_matches_transformers_generate(tmp_path, name):
  """The sampler's decode loop runs the same layer (q/k norm, no bias, scaled RoPE)."""
  family, kwargs = HF_CONFIGS[name]
  hf = make_hf_model(4, family, **kwargs)
  hf.save_pretrained(tmp_path)
  model = models.load_hf(str(tmp_path))
  ids, mask = left_padded_batch(np.random.default_rng(5), [14, 6, 1], 14)
  n = 30  # past the llama config's 32 original positions, where the scaling matters
  with torch.no_grad():
    ref = hf.generate(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
        top_k=None,
        top_p=None,
        temperature=None,
    )[:, ids.shape[1] :].numpy()
  out = sampling.generate(
      model,
      ids,
      mask,
      key=jax.random.key(0),
      options=sampling.SamplingOptions(max_new_tokens=n, temperature=0),
  )
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), ref)


@pytest.mark.parametrize(
    "family, tied, rope_scaling",
    [
        ("qwen3", True, None),
        ("qwen3", False, None),
        ("llama", True, {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"}),
        ("llama", False, None),
    ],
)
def test_save_hf_loads_in_transformers_with_same_logits(tmp_path, family, tied, rope_scaling):
  config = models.ModelConfig(
      vocab_size=VOCAB,
      hidden_size=32,
      intermediate_size=48,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      # Qwen3's head size is its own; Llama's is hidden // heads in transformers.
      head_dim=12 if family == "qwen3" else None,
      rope_theta=1e4,
      rms_norm_eps=1e-5,
      tie_word_embeddings=tied,
      model_type=family,
      rope_scaling=rope_scaling,
  )
  model = randomise(models.create(config, jax.random.key(0)), seed=1)
  models.save_hf(model, str(tmp_path))
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), attn_implementation="eager"
  ).eval()
  assert type(hf) is HF_CLASSES[family][1]
  assert hf.config.tie_word_embeddings == tied
  assert hf.config.rope_parameters["rope_type"] == ("default" if rope_scaling is None else "llama3")
  # Exactly the tensors transformers' class has: none missing (it would initialise them at
  # random) and none extra (it would drop them).
  with safetensors.safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    saved = set(f.keys())
  expected = set(hf.state_dict()) - ({"lm_head.weight"} if tied else set())
  assert saved == expected

  ids, mask = left_padded_batch(np.random.default_rng(2), [40, 11], 40)
  ours = np.asarray(model(ids, mask))
  assert max_error(ours, hf_logits(hf, ids, mask), mask) <= 1e-4
  again = models.load_hf(str(tmp_path))
  assert again.config == config
  np.testing.assert_array_equal(np.asarray(again(ids, mask)), ours)


# Published Hugging Face config.json files (transformers v4 layout), the keys that matter.
LLAMA_32_1B_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
QWEN3_06B_JSON = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_config_round_trip_in_both_layouts():
  assert models.hf_config.from_hf_dict(LLAMA_32_1B_JSON) == models.get_config("llama-3.2-1b")
  assert models.hf_config.from_hf_dict(QWEN3_06B_JSON) == models.get_config("qwen3-0.6b")
  for name in ("qwen3-0.6b", "qwen3-8b", "llama-3.2-1b", "llama-3.2-3b"):
    config = models.get_config(name)
    hash(config)  # a jit static argument and lru_cache key
    assert models.hf_config.from_hf_dict(models.hf_config.to_hf_dict(config)) == config
    # transformers v5's own layout (rope_parameters only) of the same config.
    hf_config = transformers.AutoConfig.for_model(**models.hf_config.to_hf_dict(config))
    assert (
        type(hf_config).__name__
        == {"qwen3": "Qwen3Config", "llama": "LlamaConfig"}[config.model_type]
    )
    assert models.hf_config.from_hf_dict(hf_config.to_dict()) == config
  # A dict for rope_scaling is normalised, so equal configs hash equal.
  as_dict = models.get_config("llama-3.2-1b").replace(
      rope_scaling=models.get_config("llama-3.2-1b").rope_scaling.to_hf_dict()
  )
  assert as_dict == models.get_config("llama-3.2-1b")
  assert hash(as_dict) == hash(models.get_config("llama-3.2-1b"))
  # Qwen3's class default head size applies when config.json has none.
  no_head_dim = {k: v for k, v in QWEN3_06B_JSON.items() if k != "head_dim"}
  assert models.hf_config.from_hf_dict({**no_head_dim, "hidden_size": 512}).head_dim == 128


def test_unsupported_types_and_features_are_named(tmp_path):
  base = models.hf_config.to_hf_dict(models.get_config("llama-3.2-1b"))
  cases = [
      (
          {"model_type": "mistral"},
          r"model_type 'mistral' is not supported \(supported: qwen2, qwen3, llama, qwen2_5_vl\)",
      ),
      (
          {"rope_scaling": None, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
          r"rope_type 'yarn' is not supported \(supported: default, llama3\)",
      ),
      ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_type 'linear'"),
      ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"llama3.*'low_freq_factor'"),
      ({"attention_bias": True}, r"attention_bias=true is not supported for model_type 'llama'"),
      ({"mlp_bias": True}, r"mlp_bias=true is not supported"),
      ({"pretraining_tp": 2}, r"pretraining_tp"),
  ]
  for changes, message in cases:
    with pytest.raises(ValueError, match=message):
      models.hf_config.from_hf_dict({**base, **changes})
  qwen3 = {**QWEN3_06B_JSON, "attention_bias": True}
  with pytest.raises(
      ValueError, match="attention_bias=true is not supported for model_type 'qwen3'"
  ):
    models.hf_config.from_hf_dict(qwen3)
  # Through load_hf: the error names the file before anything is read.
  with open(tmp_path / "config.json", "w", encoding="utf-8") as fp:
    json.dump({**base, "model_type": "gemma2"}, fp)
  with pytest.raises(ValueError, match=r"config\.json: model_type 'gemma2' is not supported"):
    models.load_hf(str(tmp_path))
  # The dataclasses themselves.
  tiny = models.get_config("tiny")
  with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported \(supported: qwen2"):
    tiny.replace(model_type="gpt2")
  with pytest.raises(ValueError, match="low_freq_factor 4.0 must be below high_freq_factor 1.0"):
    models.RopeScaling(8.0, 4.0, 1.0, 8192)
  with pytest.raises(ValueError, match=r"rope_type 'yarn' is not supported"):
    models.RopeScaling(8.0, 1.0, 4.0, 8192, rope_type="yarn")
  with pytest.raises(ValueError, match="original_max_position_embeddings must be a positive int"):
    tiny.replace(rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 0})


def test_family_parameters_and_flags():
  tiny = models.get_config("tiny")
  expected = {
      "qwen2": ({"q_bias", "k_bias", "v_bias"}, set()),
      "qwen3": (set(), {"q_norm", "k_norm"}),
      "llama": (set(), set()),
  }
  for family, (biases, norms) in expected.items():
    config = tiny.replace(model_type=family)
    assert (config.attention_bias, config.qk_norm) == (bool(biases), bool(norms))
    abstract = nnx.eval_shape(lambda config=config: models.Qwen2(config, rngs=nnx.Rngs(0)))
    layers = abstract.decoder.layers
    names = {name for name, var in vars(layers).items() if isinstance(var, nnx.Param)}
    assert names & {"q_bias", "k_bias", "v_bias"} == biases
    assert names & {"q_norm", "k_norm"} == norms
    for name in norms:
      var = getattr(layers, name)
      assert var.shape == (config.num_layers, config.head_dim)
      assert var.get_metadata()["out_sharding"] == ("layers", "head_dim")
    count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert count == models.num_params(config)
  # Initialised to the identity norm, as transformers does.
  model = models.create(tiny.replace(model_type="qwen3"), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(model.decoder.layers.q_norm[...]), 1.0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("tied", [True, False])
def test_param_table_is_the_models_parameters(family, tied):
  # Every parameter the model builds, with its shape and logical axes, and nothing else, is an
  # entry of models.param_table, which num_params, the checkpoint I/O and the memory estimate read.
  config = models.get_config("tiny", model_type=family, tie_word_embeddings=tied)
  abstract = nnx.eval_shape(lambda: models.Qwen2(config, rngs=nnx.Rngs(0)))
  built = {
      path[-1]: (tuple(var.shape), tuple(var.get_metadata()["out_sharding"]))
      for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param))
  }
  assert built == models.param_table(config)
  assert models.num_params(config) == sum(math.prod(shape) for shape, _ in built.values())


# Parameter counts of the published checkpoints (tied heads counted once): the Qwen3 numbers
# are those keras-hub lists for its converted presets, the Llama 3.2 ones the safetensors
# totals Hugging Face shows for meta-llama/Llama-3.2-{1B,3B}.
PUBLISHED_SIZES = {
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZES))
def test_presets_have_the_published_parameter_count(name):
  config = models.get_config(name)
  assert models.num_params(config) == PUBLISHED_SIZES[name]
  # transformers builds the same count on the meta device (no memory), and so do we abstractly.
  hf_config = transformers.AutoConfig.for_model(**models.hf_config.to_hf_dict(config))
  with torch.device("meta"):
    hf = transformers.AutoModelForCausalLM.from_config(hf_config)
  assert sum(p.numel() for p in hf.parameters()) == PUBLISHED_SIZES[name]
  abstract = nnx.eval_shape(lambda: models.Qwen2(config, rngs=nnx.Rngs(0)))
  ours = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert ours == PUBLISHED_SIZES[name]

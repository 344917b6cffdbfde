"""Parity of ragen_jax.models.Qwen2 with Hugging Face transformers (PyTorch CPU).

Random Qwen2ForCausalLM models are built with transformers, every tensor
(biases and norm scales included) is randomised so that a mis-mapped weight
shows up, then the logits of both implementations are compared on batches
with left padding. Dimension legend: B batch, T length, V vocab.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
import transformers

from flax import nnx
from ragen_jax import models
from ragen_jax.models import build
from references import hf_logits  # pylint: disable=g-bad-import-order
from tiny import left_padded_batch
from tiny import PARITY_VOCAB
from tiny import randomise

torch.manual_seed(0)

VOCAB = PARITY_VOCAB

# (name, Qwen2Config kwargs): tied/untied, GQA ratios 1/2/4/MHA, head sizes
# 8/16/24 (one not equal to hidden // heads), rope theta 1e4 and 1e6.
HF_CONFIGS = {
    "tied_gqa2_dh16_theta1e4": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        tie_word_embeddings=True,
        rope_theta=1e4,
    ),
    "untied_mqa_dh8_theta1e6": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=80,
        tie_word_embeddings=False,
        rope_theta=1e6,
    ),
    "untied_mha_dh16_theta1e6": dict(
        hidden_size=48,
        num_attention_heads=3,
        num_key_value_heads=3,
        intermediate_size=64,
        tie_word_embeddings=False,
        rope_theta=1e6,
    ),
    "tied_gqa4_headdim24_theta1e6": dict(
        hidden_size=40,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=24,
        intermediate_size=72,
        tie_word_embeddings=True,
        rope_theta=1e6,
    ),
}


def make_hf_model(seed, *, rope_theta, **kwargs):
  """A float32 Qwen2ForCausalLM with every parameter randomised."""
  config = transformers.Qwen2Config(
      vocab_size=VOCAB,
      num_hidden_layers=2,
      rms_norm_eps=1e-6,
      rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
      attn_implementation="eager",
      **kwargs,
  )
  model = transformers.Qwen2ForCausalLM(config).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * noise)
      else:
        p.copy_(0.2 * noise)
  return model


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_load_hf_logits_match_transformers(tmp_path, name):
  hf = make_hf_model(1, **HF_CONFIGS[name])
  hf.save_pretrained(tmp_path)
  model = models.load_hf(str(tmp_path))
  assert model.config.tie_word_embeddings == HF_CONFIGS[name]["tie_word_embeddings"]

  rng = np.random.default_rng(0)
  lengths, total = [9, 5, 1], 9
  ids, mask = left_padded_batch(rng, lengths, total)
  ours = np.asarray(jax.jit(lambda i, m: model(i, m))(ids, mask))
  assert ours.dtype == np.float32 and ours.shape == (3, total, VOCAB)
  ref = hf_logits(hf, ids, mask)
  real = mask.astype(bool)
  assert np.max(np.abs(ours[real] - ref[real])) <= 1e-4
  # Independent of any padding convention: each row alone, unpadded.
  for row, n in enumerate(lengths):
    alone = hf_logits(hf, ids[row : row + 1, total - n :])[0]
    np.testing.assert_allclose(ours[row, total - n :], alone, atol=1e-4, rtol=0)


def test_long_sequences_cross_attention_blocks_like_transformers(tmp_path):
  """Past 128 tokens the training pass attends in query blocks (layers.attend_causal):
  three blocks, the last one partial, and left padding that spans a whole block."""
  hf = make_hf_model(2, **HF_CONFIGS["tied_gqa2_dh16_theta1e4"])
  hf.save_pretrained(tmp_path)
  model = models.load_hf(str(tmp_path))
  rng = np.random.default_rng(1)
  lengths, total = [300, 150, 20], 300
  ids, mask = left_padded_batch(rng, lengths, total)
  ours = np.asarray(jax.jit(lambda i, m: model(i, m))(ids, mask))
  real = mask.astype(bool)
  assert np.max(np.abs(ours[real] - hf_logits(hf, ids, mask)[real])) <= 1e-4


@pytest.mark.parametrize("tied", [True, False])
def test_save_hf_loads_in_transformers_with_same_logits(tmp_path, tied):
  config = models.ModelConfig(
      vocab_size=VOCAB,
      hidden_size=32,
      intermediate_size=48,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      rope_theta=1e4,
      tie_word_embeddings=tied,
  )
  model = randomise(models.create(config, jax.random.key(0)), seed=1)
  # A small shard limit forces the sharded layout (index json) on the way.
  models.save_hf(model, str(tmp_path), max_shard_bytes=20_000)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  hf = transformers.Qwen2ForCausalLM.from_pretrained(
      str(tmp_path), attn_implementation="eager"
  ).eval()
  assert hf.config.tie_word_embeddings == tied

  ids, mask = left_padded_batch(np.random.default_rng(2), [7, 3], 7)
  ours = np.asarray(model(ids, attention_mask=mask))  # The keyword form.
  ref = hf_logits(hf, ids, mask)
  real = mask.astype(bool)
  assert np.max(np.abs(ours[real] - ref[real])) <= 1e-4
  # And back: the sharded export loads with load_hf to the same weights.
  again = models.load_hf(str(tmp_path))
  np.testing.assert_array_equal(np.asarray(again(ids, mask)), ours)


def test_bfloat16_load_is_close_to_float32(tmp_path):
  hf = make_hf_model(3, **HF_CONFIGS["tied_gqa2_dh16_theta1e4"])
  hf.save_pretrained(tmp_path)
  f32 = models.load_hf(str(tmp_path))
  bf16 = models.load_hf(str(tmp_path), dtype=jnp.bfloat16)
  assert bf16.decoder.layers.q_kernel[...].dtype == jnp.bfloat16
  ids, mask = left_padded_batch(np.random.default_rng(0), [8, 4], 8)
  a, b = np.asarray(f32(ids, mask)), np.asarray(bf16(ids, mask))
  assert b.dtype == np.float32
  real = mask.astype(bool)
  scale = np.abs(a[real]).max()
  assert np.abs(a[real] - b[real]).max() < 0.05 * scale
  # bf16 rounding must actually happen (the test would be vacuous otherwise).
  assert np.abs(a[real] - b[real]).max() > 1e-6


def test_bfloat16_checkpoint_file_loads_exactly(tmp_path):
  # Published Qwen2.5 checkpoints store bfloat16 tensors.
  hf = make_hf_model(4, **HF_CONFIGS["untied_mqa_dh8_theta1e6"])
  hf.to(torch.bfloat16).save_pretrained(tmp_path)
  with safetensors.safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
  # Reference: transformers reads the same file into float32 (a fresh model,
  # so its RoPE frequencies are not the bf16-cast buffer of `hf`).
  hf = transformers.Qwen2ForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32, attn_implementation="eager"
  ).eval()
  model = models.load_hf(str(tmp_path), dtype=jnp.float32)
  assert model.decoder.layers.q_kernel[...].dtype == jnp.float32
  ids, mask = left_padded_batch(np.random.default_rng(5), [6, 2], 6)
  real = mask.astype(bool)
  diff = np.asarray(model(ids, mask))[real] - hf_logits(hf, ids, mask)[real]
  assert np.max(np.abs(diff)) <= 1e-4


def _edit_config(path, **changes):
  with open(path / "config.json") as fp:
    d = json.load(fp)
  d.update(changes)
  with open(path / "config.json", "w") as fp:
    json.dump(d, fp)


def test_shape_mismatch_names_the_tensor(tmp_path):
  make_hf_model(0, **HF_CONFIGS["untied_mqa_dh8_theta1e6"]).save_pretrained(tmp_path)
  _edit_config(tmp_path, intermediate_size=81)
  with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight"):
    models.load_hf(str(tmp_path))


def test_missing_and_unexpected_tensors_are_errors(tmp_path):
  make_hf_model(0, **HF_CONFIGS["untied_mqa_dh8_theta1e6"]).save_pretrained(tmp_path)
  _edit_config(tmp_path, num_hidden_layers=3)
  with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.2\."):
    models.load_hf(str(tmp_path))
  _edit_config(tmp_path, num_hidden_layers=1)
  with pytest.raises(ValueError, match=r"model\.layers\.1\."):
    models.load_hf(str(tmp_path))


@pytest.mark.parametrize(
    "name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "tiny", "small"]
)
def test_presets_have_the_parameter_count_transformers_builds(name):
  config = models.get_config(name)
  hf_config = transformers.Qwen2Config(**models.hf_config.to_hf_dict(config))
  with torch.device("meta"):
    hf = transformers.Qwen2ForCausalLM(hf_config)
  hf_count = sum(p.numel() for p in hf.parameters())  # tied weights once
  assert models.num_params(config) == hf_count
  abstract = nnx.eval_shape(lambda: models.Qwen2(config, rngs=nnx.Rngs(0)))
  ours = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert ours == hf_count


def test_published_qwen25_sizes():
  # (total, non-embedding) in billions, from the Qwen2.5 model cards.
  expected = {
      "qwen2.5-0.5b": (0.49, 0.36),
      "qwen2.5-1.5b": (1.54, 1.31),
      "qwen2.5-3b": (3.09, 2.77),
      "qwen2.5-7b": (7.61, 6.53),
  }
  for name, (total, non_embedding) in expected.items():
    config = models.get_config(name)
    n = models.num_params(config)
    embed = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    assert abs(n / 1e9 - total) < 0.006, name
    assert abs((n - embed) / 1e9 - non_embedding) < 0.006, name


def test_config_round_trip_and_validation():
  config = models.get_config("qwen2.5-7b")
  assert models.hf_config.from_hf_dict(models.hf_config.to_hf_dict(config)) == config
  # transformers v4 layout: rope_theta at the top level, no head_dim.
  v4 = {
      k: v
      for k, v in models.hf_config.to_hf_dict(config).items()
      if k not in ("rope_parameters", "head_dim")
  }
  assert models.hf_config.from_hf_dict(v4) == config
  with pytest.raises(ValueError, match="not divisible by num_kv_heads"):
    config.replace(num_kv_heads=5)
  with pytest.raises(ValueError, match="qwen2.5-0.5b"):
    models.get_config("qwen-0.5b")
  with pytest.raises(ValueError, match="rope_type"):
    models.hf_config.from_hf_dict(
        {**models.hf_config.to_hf_dict(config), "rope_parameters": {"rope_type": "yarn"}}
    )


def test_copy_tree_gives_every_array_a_buffer_of_its_own():
  """The critic's and the train state's weights are copies (models.build.copy_tree): a step that
  donates the arrays they came from must not reach them. Equal values, no buffer shared."""
  tree = {"w": jnp.arange(6.0).reshape(2, 3), "b": {"c": jnp.ones((4,), jnp.bfloat16)}}
  copy = build.copy_tree(tree)
  jax.tree.map(np.testing.assert_array_equal, copy, tree)
  assert copy["b"]["c"].dtype == jnp.bfloat16
  pointers = lambda t: {a.unsafe_buffer_pointer() for a in jax.tree.leaves(t)}
  assert len(pointers(copy)) == 2 and not pointers(copy) & pointers(tree)

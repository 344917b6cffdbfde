"""LoRA adapters: zero adapters leave the model's function bitwise unchanged, non-zero ones
equal the merged weights W + scale * A @ B in every pass, and an export is the merged model.

Dimension legend: B batch, T length, V vocab.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from ragen_jax import models
from ragen_jax.models import lora
from references import hf_logits  # pylint: disable=g-bad-import-order
from tiny import left_padded_batch
from tiny import PARITY
from tiny import randomise

CONFIG = PARITY
LORA = models.LoraConfig(rank=4, alpha=8.0)
IDS_BxT, MASK_BxT = left_padded_batch(np.random.default_rng(0), [6, 3], 6)


def base_model():
  return randomise(models.create(CONFIG, jax.random.key(0)), seed=1)


def with_adapters(model, nonzero_b: bool):
  """A copy of `model` with adapters (B random when `nonzero_b`)."""
  adapted = lora.add(nnx.clone(model), LORA, jax.random.key(2))
  if nonzero_b:
    layers = adapted.decoder.layers
    for i, target in enumerate(LORA.targets):
      b = getattr(layers, lora.adapter_names(target)[1])
      b.set_value(0.1 * jax.random.normal(jax.random.key(10 + i), b.shape, b.dtype))
  return adapted


def numpy_merged(model):
  """The plain model with W + scale * A @ B, merged here in NumPy (independent of lora.merge)."""
  plain = nnx.clone(models.create(CONFIG, jax.random.key(0)))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  layers = params["decoder"]["layers"]
  for target in LORA.targets:
    a_name, b_name = lora.adapter_names(target)
    w = np.asarray(layers[f"{target}_kernel"], np.float64)
    a, b = np.asarray(layers.pop(a_name), np.float64), np.asarray(layers.pop(b_name), np.float64)
    n_layers, rank = a.shape[0], a.shape[-1]
    delta = np.einsum("lir,lro->lio", a.reshape(n_layers, -1, rank), b.reshape(n_layers, rank, -1))
    layers[f"{target}_kernel"] = jnp.asarray(w + LORA.scale * delta.reshape(w.shape), jnp.float32)
  state = nnx.state(plain, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(plain, state)
  return plain


def assert_logits_close(actual, expected):
  """The same float32 sums rounded in another order (W + scale * A @ B merged in float64 or once
  in float32, against the adapters applied beside W): equal to a few ulps of the logits' scale
  (about 5 here), so the bound is relative to it, not a fixed 1e-5."""
  np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_zero_adapters_give_the_base_logits_bitwise():
  base = base_model()
  adapted = with_adapters(base, nonzero_b=False)
  assert adapted.config.lora == LORA and base.config.lora is None
  assert len(jax.tree.leaves(nnx.state(adapted, lora.LoraParam))) == 2 * len(LORA.targets)
  np.testing.assert_array_equal(
      np.asarray(adapted(IDS_BxT, MASK_BxT)), np.asarray(base(IDS_BxT, MASK_BxT))
  )


def test_adapters_equal_merged_weights_in_forward_prefill_and_decode():
  adapted = with_adapters(base_model(), nonzero_b=True)
  reference = numpy_merged(adapted)
  expected_BxTxV = np.asarray(reference(IDS_BxT, MASK_BxT))
  assert_logits_close(np.asarray(adapted(IDS_BxT, MASK_BxT)), expected_BxTxV)
  assert_logits_close(np.asarray(lora.merge(adapted)(IDS_BxT, MASK_BxT)), expected_BxTxV)
  # Prefill through the layer scan (KVCache), then one decode step through the unrolled layers
  # (`decode` over a LayerCache and the layers' weights): the sampler's two passes.
  cache = models.init_cache(adapted.config, 2, 8)
  prefill_BxTxV, cache = adapted(IDS_BxT[:, :-1], MASK_BxT[:, :-1], cache=cache)
  step_Bx1xV, _ = adapted.decode(
      IDS_BxT[:, -1:],
      MASK_BxT[:, -1:],
      cache=cache.per_layer(8),
      weights=adapted.decoder.layer_weights(),
  )
  real = MASK_BxT.astype(bool)
  assert_logits_close(np.asarray(prefill_BxTxV)[real[:, :-1]], expected_BxTxV[:, :-1][real[:, :-1]])
  assert_logits_close(np.asarray(step_Bx1xV)[:, 0], expected_BxTxV[:, -1])


def test_merge_leaves_a_plain_model_and_the_adapted_one_intact():
  adapted = with_adapters(base_model(), nonzero_b=True)
  plain = lora.merge(adapted)
  assert plain.config.lora is None and not jax.tree.leaves(nnx.state(plain, lora.LoraParam))
  assert len(jax.tree.leaves(nnx.state(adapted, lora.LoraParam))) == 2 * len(LORA.targets)


def test_export_of_an_adapted_model_is_the_merged_checkpoint(tmp_path):
  adapted = with_adapters(base_model(), nonzero_b=True)
  models.save_hf(adapted, str(tmp_path))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager")
  assert type(hf).__name__ == "Qwen2ForCausalLM"
  real = MASK_BxT.astype(bool)
  np.testing.assert_allclose(
      hf_logits(hf.eval(), IDS_BxT, MASK_BxT)[real],
      np.asarray(adapted(IDS_BxT, MASK_BxT))[real],
      rtol=1e-5,  # torch against JAX: another order of the same float32 sums
      atol=1e-4,
  )
  # And it loads back as a plain model of ours.
  assert models.load_hf(str(tmp_path)).config.lora is None


def test_lora_config_is_checked():
  assert models.LoraConfig(rank=2, targets=("up", "q")).targets == ("q", "up")
  for bad in (dict(rank=0), dict(rank=2, targets=("x",)), dict(rank=2, dropout=0.1)):
    with pytest.raises(ValueError):
      models.LoraConfig(**bad)
  assert models.ModelConfig(**{**CONFIG.__dict__, "lora": {"rank": 2}}).lora.rank == 2

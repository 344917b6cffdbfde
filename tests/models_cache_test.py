"""KV cache decoding, critic and functional use of ragen_jax.models.Qwen2.

The reference for cached decoding is the same model's full forward pass, whose
own parity with transformers is tested in models_qwen2_test.py. Dimension
legend: B batch, T length, S cache capacity, D model dim, V vocab.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import models
import tiny  # pylint: disable=g-bad-import-order

CONFIG = tiny.model_config(vocab_size=61, num_heads=4, num_kv_heads=2, tie_word_embeddings=False)


def random_model(config=CONFIG, seed=0):
  """A model whose biases and norms are random too (not 0 / 1)."""
  model = models.create(config, jax.random.key(seed))
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  leaves = [x + 0.2 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


def prompts(rng, lengths, total, vocab):
  ids = rng.integers(0, vocab, size=(len(lengths), total)).astype(np.int32)
  mask = np.zeros_like(ids)
  for row, n in enumerate(lengths):
    mask[row, total - n :] = 1
  return ids, mask


@pytest.mark.parametrize("chunk", [1, 3])
def test_cached_decoding_matches_full_forward(chunk):
  model = random_model()
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  prompt_len, new_tokens = 6, 6
  ids, mask = prompts(rng, [6, 2, 4], prompt_len, CONFIG.vocab_size)
  cont = rng.integers(0, CONFIG.vocab_size, size=(3, new_tokens)).astype(np.int32)
  full_ids = np.concatenate([ids, cont], axis=1)
  full_mask = np.concatenate([mask, np.ones_like(cont)], axis=1)
  reference = np.asarray(model(full_ids, full_mask))

  @jax.jit
  def step(state, ids_BxT, mask_BxT, cache):
    return nnx.merge(graphdef, state)(ids_BxT, mask_BxT, cache=cache)

  cache = models.init_cache(CONFIG, batch=3, capacity=16)
  logits, cache = step(state, ids, mask, cache)
  outs = [np.asarray(logits)]
  for start in range(0, new_tokens, chunk):
    piece = cont[:, start : start + chunk]
    logits, cache = step(state, piece, np.ones_like(piece), cache)
    outs.append(np.asarray(logits))
  cached = np.concatenate(outs, axis=1)
  assert int(cache.end_index) == prompt_len + new_tokens
  np.testing.assert_array_equal(np.asarray(cache.mask_BxS[:, :12]), full_mask)
  real = full_mask.astype(bool)
  assert np.max(np.abs(cached[real] - reference[real])) <= 1e-4


def test_padding_step_inside_the_cache_is_skipped():
  # A sequence that emits a padding step (mask 0) mid-decode must give the
  # same logits afterwards as if the step never happened.
  model = random_model()
  cache = models.init_cache(CONFIG, batch=1, capacity=8)
  a = np.array([[5, 7, 9]], np.int32)
  _, cache = model(a, cache=cache)
  _, cache = model(np.array([[3]], np.int32), np.array([[0]]), cache=cache)
  logits, _ = model(np.array([[11]], np.int32), cache=cache)
  reference = model(np.array([[5, 7, 9, 11]], np.int32))
  np.testing.assert_allclose(
      np.asarray(logits[0, -1]), np.asarray(reference[0, -1]), atol=1e-5, rtol=0
  )


def test_cache_rejects_more_tokens_than_capacity():
  model = random_model()
  cache = models.init_cache(CONFIG, batch=1, capacity=2)
  with pytest.raises(ValueError, match="capacity"):
    model(np.zeros((1, 3), np.int32), cache=cache)


def test_backbone_and_unembed_give_the_logits():
  model = random_model()
  ids = np.array([[1, 2, 3, 4]], np.int32)
  hidden, cache = model.backbone(ids)
  assert cache is None and hidden.shape == (1, 4, CONFIG.hidden_size)
  np.testing.assert_allclose(
      np.asarray(hidden @ model.unembed_kernel()), np.asarray(model(ids)), atol=1e-5, rtol=0
  )
  tied = models.create(CONFIG.replace(tie_word_embeddings=True), jax.random.key(0))
  np.testing.assert_array_equal(
      np.asarray(tied.unembed_kernel()), np.asarray(tied.decoder.embedding[...]).T
  )


def test_critic_from_policy_copies_the_backbone():
  policy = random_model()
  critic = models.critic_from_policy(policy, jax.random.key(1))
  ids, mask = prompts(np.random.default_rng(1), [5, 3], 5, CONFIG.vocab_size)
  values = critic(ids, mask)
  assert values.shape == (2, 5) and values.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(values), 0.0)  # zero value head
  # Set a head and check values = hidden . w + b with the policy's hidden.
  w = jax.random.normal(jax.random.key(2), (CONFIG.hidden_size,))
  critic.value_kernel.set_value(w)
  critic.value_bias.set_value(jnp.asarray(0.5))
  hidden, _ = policy.backbone(ids, mask)
  np.testing.assert_allclose(
      np.asarray(critic(ids, mask)), np.asarray(hidden @ w + 0.5), atol=1e-5, rtol=0
  )
  # Real copies: the policy's buffers can be donated without hurting the critic.
  assert (
      critic.decoder.embedding[...].unsafe_buffer_pointer()
      != policy.decoder.embedding[...].unsafe_buffer_pointer()
  )


def _primitives(jaxpr) -> set:
  """Names of every primitive in `jaxpr` and in the jaxprs nested in it (scan bodies, ...)."""
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      names |= _primitives(sub)
  return names


# jax.checkpoint's primitive: "remat2" in JAX 0.10 ("checkpoint" too, should it be renamed).
_REMAT = {"remat2", "checkpoint"}


@pytest.mark.parametrize("critic", [True, False], ids=["critic", "policy"])
def test_functional_train_step_and_remat_give_the_same_gradients(critic):
  # split -> jax.jit(value_and_grad) -> merge, as the trainer uses the models; the remat model
  # is the same parameters merged into the graph built with remat=True (the config, remat
  # included, lives in the graphdef, so merging into the plain graph would never remat).
  plain = models.create(CONFIG, jax.random.key(0), critic=critic)
  graphdef, params = nnx.split(plain, nnx.Param)
  remat_graphdef = nnx.graphdef(
      models.create(CONFIG.replace(remat=True), jax.random.key(0), critic=critic)
  )
  if critic:  # a non-zero head: with the zero one no gradient reaches the decoder
    params["value_kernel"].set_value(jax.random.normal(jax.random.key(3), (CONFIG.hidden_size,)))
  ids, mask = prompts(np.random.default_rng(2), [4, 3], 4, CONFIG.vocab_size)
  targets = jnp.ones(ids.shape)

  def value_and_grad(graphdef):
    def loss(params):
      out = nnx.merge(graphdef, params)(ids, mask)
      return jnp.mean((out - targets) ** 2) if critic else jnp.mean(jax.nn.log_softmax(out)[..., 0])

    fn = jax.value_and_grad(loss)
    return _primitives(jax.make_jaxpr(fn)(params).jaxpr), jax.jit(fn)(params)

  plain_prims, (value, grads) = value_and_grad(graphdef)
  remat_prims, (value_r, grads_r) = value_and_grad(remat_graphdef)
  assert not plain_prims & _REMAT and remat_prims & _REMAT  # jax.checkpoint runs in one only
  np.testing.assert_allclose(float(value_r), float(value), rtol=1e-6)
  flat, flat_r = nnx.to_flat_state(grads), nnx.to_flat_state(grads_r)
  assert [path for path, _ in flat] == [path for path, _ in flat_r]
  for (path, g), (_, g_r) in zip(flat, flat_r):
    g, g_r = np.asarray(g[...]), np.asarray(g_r[...])
    scale = float(np.max(np.abs(g)))
    assert scale > 0, path  # every parameter gets a gradient
    # The recomputed forward pass may fuse differently: float32 rounding of the leaf's scale.
    np.testing.assert_allclose(g_r, g, rtol=1e-5, atol=1e-6 * scale, err_msg=str(path))


def test_load_hf_critic_matches_critic_from_policy(tmp_path):
  policy = random_model()
  models.save_hf(policy, str(tmp_path))
  critic = models.load_hf(str(tmp_path), critic=True)
  assert isinstance(critic, models.Qwen2Critic)
  ids = np.array([[3, 1, 4, 1, 5]], np.int32)
  h1, _ = critic.decoder(ids)
  h2, _ = policy.backbone(ids)
  np.testing.assert_allclose(np.asarray(h1), np.asarray(h2), atol=1e-6, rtol=0)


def test_create_from_preset_name_and_errors():
  model = models.create("tiny", jax.random.key(0))
  assert model.config == models.get_config("tiny")
  with pytest.raises(ValueError, match="valid presets"):
    models.create("huge", jax.random.key(0))

"""The tiny models and batches the unit tests share (imported by test files;
no test file imports another).

Dimensions: B episodes, T tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax import models
from ragen_jax import rollout
from ragen_jax.batch import RolloutBatch


def model_config(**changes) -> models.ModelConfig:
  """A 2-layer Qwen2 with grouped-query attention (2 heads over 1 key-value head)."""
  base = dict(
      vocab_size=64,
      hidden_size=32,
      intermediate_size=64,
      num_layers=2,
      num_heads=2,
      num_kv_heads=1,
      rope_theta=1e4,
  )
  return models.ModelConfig(**{**base, **changes})


MODEL = model_config()
# The parity tests' models: 4 heads over 2 key-value heads, untied embeddings, a vocabulary
# that is no power of two (transformers' and our padding of it must agree).
PARITY_VOCAB = 97
PARITY = model_config(
    vocab_size=PARITY_VOCAB,
    intermediate_size=48,
    num_heads=4,
    num_kv_heads=2,
    tie_word_embeddings=False,
)
B, T = 8, 12


def make_batch(seed=0, scores=(1.0, 0.0, 1.0, 0.0, 2.0, 0.5, 3.0, 2.0)) -> RolloutBatch:
  """Two groups of 4; left padding; two assistant turns with observation tokens between."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(1, MODEL.vocab_size, (B, T)).astype(np.int32)
  attn = np.ones((B, T), np.int32)
  attn[::2, :2] = 0  # left padding on every other row
  tokens[attn == 0] = 0
  loss = np.zeros((B, T), np.int32)
  loss[:, 4:7] = 1  # assistant turn 1
  loss[:, 9:12] = 1  # assistant turn 2 (positions 7-8 are observations)
  loss[3, 9:12] = 0  # one episode ended after its first turn
  scores = np.asarray(scores, np.float32)
  rewards = np.zeros((B, T), np.float32)
  last = T - 1 - np.argmax(loss[:, ::-1], axis=1)
  rewards[np.arange(B), last] = scores
  return RolloutBatch(
      tokens_BxT=jnp.asarray(tokens),
      attention_mask_BxT=jnp.asarray(attn),
      loss_mask_BxT=jnp.asarray(loss),
      logprobs_BxT=jnp.zeros((B, T)),
      token_rewards_BxT=jnp.asarray(rewards),
      group_ids_B=jnp.asarray(np.repeat([3, 8], 4).astype(np.int32)),
      scores_B=jnp.asarray(scores),
  )


def randomise(model, seed):
  """Random values for every parameter (ours start with zero biases)."""
  graphdef, state = nnx.split(model)
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  keys = jax.random.split(jax.random.key(seed), len(paths_leaves))
  leaves = []
  for k, (path, x) in zip(keys, paths_leaves):
    noise = 0.2 * jax.random.normal(k, x.shape, x.dtype)
    leaves.append(1.0 + noise if "norm" in jax.tree_util.keystr(path) else noise)
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


def left_padded_batch(rng, lengths, total, vocab=PARITY_VOCAB):
  """Token ids [len(lengths), total] and their mask, each row's tokens at the right end."""
  ids = rng.integers(0, vocab, size=(len(lengths), total)).astype(np.int32)
  mask = np.zeros_like(ids)
  for row, n in enumerate(lengths):
    mask[row, total - n :] = 1
  return ids, mask


def left_padded_rows(rows):
  """Token ids [len(rows), longest] of the given rows, each at the right end, and their mask."""
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
  return ids, mask


def rollout_config(**changes) -> rollout.RolloutConfig:
  """2 groups of 2 Sokoban episodes of up to 3 turns. One temperature and cache capacity (1536
  slots) everywhere: the rollout tests share compiled code."""
  base = dict(
      env_groups=2,
      group_size=2,
      max_turns=3,
      max_new_tokens=16,
      max_context=1024,
      max_turn_tokens=400,
      render_format="grid",
      temperature=0.8,
  )
  return rollout.RolloutConfig(**{**base, **changes})

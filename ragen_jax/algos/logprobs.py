"""Token log-probs and entropies from hidden states, chunked over the vocabulary.

Full float32 logits [B, T, V] for a 150k vocabulary are the largest tensor of an LLM update
(4 GB for 16 x 4k tokens). Here the unembedding is applied one vocabulary chunk at a time with
an online logsumexp, so only [B, T, C] logits exist at once; the chunk body is rematerialised
(`jax.checkpoint`) so the backward pass does not keep every chunk's logits either.

Dimensions:
  B: sequences.  T: token positions.  D: hidden size.  V: vocabulary.  C: vocabulary chunk.
  K: number of chunks (V padded up to K·C).  N = B·T flattened positions.
"""

import jax
from jax import lax
import jax.numpy as jnp

NEG_BIG = -1e30


def chunked_logprobs_entropy(
    hidden_BxTxD, unembed_DxV, targets_BxT, chunk=8192, temperature=1.0, with_entropy=True
):
  """log p(target) and entropy of softmax(h·W / τ), without materialising [B, T, V].

  With z = h·W/τ, scanning chunks and carrying per-token running max m, s = Σ e^(z−m),
  a = Σ e^(z−m)·z and the target logit:
    lse = m + log s,  logp = z_target − lse,  H = lse − a/s   (= lse − Σ softmax(z)·z)
  Each chunk rescales the carries by e^(m_old − m_new). Differentiable in h and W.

  Returns:
    (logp_BxT float32, entropy_BxT float32, zeros when with_entropy is False).
  """
  vocab = unembed_DxV.shape[1]
  chunk = min(chunk, vocab)
  n_chunks = -(-vocab // chunk)
  pad = n_chunks * chunk - vocab
  w_DxV = jnp.pad(unembed_DxV, ((0, 0), (0, pad))) if pad else unembed_DxV
  w_KxDxC = w_DxV.reshape(w_DxV.shape[0], n_chunks, chunk).transpose(1, 0, 2)
  inv_temp = 1.0 / temperature
  shape_BxT = targets_BxT.shape
  # A 2-D [B*T, D] matmul: XLA:CPU's backward of the batched einsum form is slower
  # (BENCHMARKS.md).
  hidden_NxD = hidden_BxTxD.reshape(-1, hidden_BxTxD.shape[-1])

  @jax.checkpoint
  def body(carry, xs):
    m, s, a, tgt = carry
    w_DxC, start = xs
    z_BxTxC = (
        jnp.matmul(hidden_NxD, w_DxC, preferred_element_type=jnp.float32).reshape(*shape_BxT, chunk)
        * inv_temp
    )
    col_1x1xC = (start + jnp.arange(chunk))[None, None, :]
    # Padded columns carry no mass. A finite floor (not -inf) keeps 0·z and its gradient finite.
    z_BxTxC = jnp.where(col_1x1xC < vocab, z_BxTxC, NEG_BIG)
    m_new = jnp.maximum(m, jnp.max(z_BxTxC, axis=-1))
    scale = jnp.exp(m - m_new)
    p_BxTxC = jnp.exp(z_BxTxC - m_new[..., None])
    s = s * scale + jnp.sum(p_BxTxC, axis=-1)
    if with_entropy:
      a = a * scale + jnp.sum(p_BxTxC * z_BxTxC, axis=-1)
    hit_BxTxC = col_1x1xC == targets_BxT[..., None]
    tgt = tgt + jnp.sum(jnp.where(hit_BxTxC, z_BxTxC, 0.0), axis=-1)
    return (m_new, s, a, tgt), None

  init = (
      jnp.full(shape_BxT, NEG_BIG, jnp.float32),
      jnp.zeros(shape_BxT, jnp.float32),
      jnp.zeros(shape_BxT, jnp.float32),
      jnp.zeros(shape_BxT, jnp.float32),
  )
  starts_K = jnp.arange(n_chunks) * chunk
  (m, s, a, tgt), _ = lax.scan(body, init, (w_KxDxC, starts_K))
  lse = m + jnp.log(s)
  logp = tgt - lse
  entropy = lse - a / s if with_entropy else jnp.zeros_like(logp)
  return logp, entropy


def sequence_logprobs(
    hidden_BxTxD, unembed_DxV, tokens_BxT, chunk=8192, temperature=1.0, with_entropy=True
):
  """Log-probs in the rollout-batch convention: position t scores tokens[t] from hidden[t − 1].

  Position 0 has no prediction and gets logp = entropy = 0 (it is never a trained token).

  Returns:
    (logp_BxT, entropy_BxT) float32.
  """
  logp, ent = chunked_logprobs_entropy(
      hidden_BxTxD[:, :-1], unembed_DxV, tokens_BxT[:, 1:], chunk, temperature, with_entropy
  )
  pad = ((0, 0), (1, 0))
  return jnp.pad(logp, pad), jnp.pad(ent, pad)

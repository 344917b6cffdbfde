"""Token log-probs and entropies from hidden states, chunked over the vocabulary.

Full float32 logits [B, T, V] for a 150k vocabulary are the largest tensor of an LLM update
(4 GB for 16 x 4k tokens). Here the unembedding is applied one vocabulary chunk at a time with
an online logsumexp, so only [B, T, C] logits exist at once; the chunk body is rematerialised
(`jax.checkpoint`) so the backward pass does not keep every chunk's logits either.

Dimensions:
  B: sequences.  T: token positions.  D: hidden size.  V: vocabulary.  C: vocabulary chunk.
  K: number of chunks (V padded up to K·C).  N = B·T flattened positions.
  R: positions scored (`response_positions`).
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

NEG_BIG = -1e30


def chunked_logprobs_entropy(
    hidden_BxTxD,
    unembed_DxV,
    targets_BxT,
    chunk=8192,
    temperature=1.0,
    with_entropy=True,
    excluded_ids=(),
):
  """log p(target) and entropy of softmax(h·W / τ), without materialising [B, T, V].

  With z = h·W/τ, scanning chunks and carrying per-token running max m, s = Σ e^(z−m),
  a = Σ e^(z−m)·z and the target logit:
    lse = m + log s,  logp = z_target − lse,  H = lse − a/s   (= lse − Σ softmax(z)·z)
  Each chunk rescales the carries by e^(m_old − m_new). Differentiable in h and W.

  `excluded_ids` (static; `ModelConfig.excluded_token_ids`) lie outside the distribution, as
  the sampler masks them: no mass in lse or H. An excluded target (only ever a prompt's vision
  token, never a trained one) keeps its logit: a finite log-prob, not −∞.

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
    target_z_BxTxC = z_BxTxC
    if excluded_ids:  # no mask at all without them: text programs are unchanged
      excluded_1x1xC = jnp.isin(col_1x1xC, jnp.asarray(excluded_ids, jnp.int32))
      z_BxTxC = jnp.where(excluded_1x1xC, NEG_BIG, z_BxTxC)
    m_new = jnp.maximum(m, jnp.max(z_BxTxC, axis=-1))
    scale = jnp.exp(m - m_new)
    p_BxTxC = jnp.exp(z_BxTxC - m_new[..., None])
    s = s * scale + jnp.sum(p_BxTxC, axis=-1)
    if with_entropy:
      a = a * scale + jnp.sum(p_BxTxC * z_BxTxC, axis=-1)
    hit_BxTxC = col_1x1xC == targets_BxT[..., None]
    tgt = tgt + jnp.sum(jnp.where(hit_BxTxC, target_z_BxTxC, 0.0), axis=-1)
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
    hidden_BxTxD,
    unembed_DxV,
    tokens_BxT,
    chunk=8192,
    temperature=1.0,
    with_entropy=True,
    positions_BxR=None,
    excluded_ids=(),
):
  """Log-probs in the rollout-batch convention: position t scores tokens[t] from hidden[t − 1].

  Position 0 has no prediction and gets logp = entropy = 0 (it is never a trained token).

  With `positions_BxR` (`response_positions`) the unembedding and softmax run at those R
  positions alone and every other position gets 0: an update trains only the assistant's
  tokens, a small share of a multi-turn conversation, and at a small vocabulary the [B, T, V]
  logits and their softmax are a large part of a training pass. `excluded_ids`: as for
  `chunked_logprobs_entropy`.

  Returns:
    (logp_BxT, entropy_BxT) float32.
  """
  if positions_BxR is None:
    logp, ent = chunked_logprobs_entropy(
        hidden_BxTxD[:, :-1],
        unembed_DxV,
        tokens_BxT[:, 1:],
        chunk,
        temperature,
        with_entropy,
        excluded_ids,
    )
    pad = ((0, 0), (1, 0))
    return jnp.pad(logp, pad), jnp.pad(ent, pad)
  pos_BxR, valid_BxR = positions_BxR
  take = lambda x, idx: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), 1)
  hidden_BxRxD = take(hidden_BxTxD, jnp.maximum(pos_BxR - 1, 0))
  logp_BxR, ent_BxR = chunked_logprobs_entropy(
      hidden_BxRxD,
      unembed_DxV,
      take(tokens_BxT, pos_BxR),
      chunk,
      temperature,
      with_entropy,
      excluded_ids,
  )
  rows_Bx1 = jnp.arange(tokens_BxT.shape[0])[:, None]
  # Distinct positions per row (a permutation's prefix): every set lands once; unmasked ones get 0.
  scatter = lambda v_BxR: (
      jnp.zeros(tokens_BxT.shape, jnp.float32)
      .at[rows_Bx1, pos_BxR]
      .set(jnp.where(valid_BxR, v_BxR, 0.0), unique_indices=True)
  )
  return scatter(logp_BxR), scatter(ent_BxR)


def response_positions(mask_BxT, r: int):
  """(positions_BxR, valid_BxR): each row's masked positions in order, then unmasked ones.

  `r` (static) must be at least the largest row count of the mask; the trainer sizes it from
  the host batch (`response_width`). Position 0 never holds a trained token.
  """
  mask_BxT = mask_BxT > 0
  pos_BxR = jnp.argsort(~mask_BxT, axis=1, stable=True)[:, :r].astype(jnp.int32)
  return pos_BxR, jnp.take_along_axis(mask_BxT, pos_BxR, axis=1)


def response_width(loss_mask_BxT, least: int = 64) -> int:
  """R for a host batch: its largest count of trained tokens in a row, rounded up to a power of
  two (at least `least`, at most T) so that few values, and so few compilations, occur."""
  t = loss_mask_BxT.shape[1]
  most = int(np.max(np.sum(np.asarray(loss_mask_BxT) > 0, axis=1), initial=0))
  return min(t, max(least, 1 << max(most - 1, 0).bit_length()))

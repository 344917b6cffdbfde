"""Independent references the tests share: NumPy loops for the advantage estimators
(`rl_math.md`), transformers' logits, and the comparison of two runs' logged scalars."""

import numpy as np

# Timings differ between any two runs; every other scalar of a resumed run equals the original's.
_TIMING = ("timing_s/", "perf/")


def ref_masked_whiten(x, m):
  x = np.asarray(x, np.float64)
  m = np.asarray(m, np.float64)
  n = m.sum()
  mu = (x * m).sum() / (n + 1e-8)
  var = (((x - mu) ** 2) * m).sum() / (n + 1e-8)
  var = var * n / (n - 1)
  return (x - mu) / np.sqrt(var + 1e-8)


def ref_gae(r, v, m, gamma, lam):
  b, t_len = r.shape
  adv = np.zeros((b, t_len))
  for i in range(b):
    nv, g = 0.0, 0.0
    for t in reversed(range(t_len)):
      delta = r[i, t] + gamma * nv - v[i, t]
      cand = delta + gamma * lam * g
      if m[i, t] == 1:
        nv, g = v[i, t], cand
      adv[i, t] = g
  return ref_masked_whiten(adv, m), adv + v


def hf_logits(model, ids_BxT, mask_BxT=None):
  """transformers logits; positions from the mask as in left-padded decoding."""
  import torch  # pylint: disable=import-outside-toplevel

  ids = torch.tensor(np.asarray(ids_BxT), dtype=torch.long)
  kwargs = {}
  if mask_BxT is not None:
    mask = torch.tensor(np.asarray(mask_BxT), dtype=torch.long)
    kwargs = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
  with torch.no_grad():
    return model(input_ids=ids, **kwargs).logits.numpy()


def comparable(scalars, steps):
  """{(tag, step): value} of a run's scalars at `steps`, timings left out."""
  return {
      (tag, step): value
      for tag, series in scalars.items()
      if not tag.startswith(_TIMING)
      for step, value in series
      if step in steps
  }

"""AdamW whose two moments are stored in a chosen dtype, for float32 or bfloat16 parameters.

    tx = optim.adamw(1e-6, weight_decay=0.01, moment_dtype="bfloat16")
    opt = tx.init(params_bf16)               # mu and nu: bfloat16 leaves
    updates, opt = tx.update(grads, opt, params_bf16)   # float32 updates
    params_bf16 = optax.apply_updates(params_bf16, updates)   # one rounding per weight

`optax.adamw` takes `mu_dtype` for the first moment only, and its second moment follows the
parameters' dtype (bfloat16 parameters give bfloat16 moments whether wanted or not).
`moments_stored_in` wraps any optax transformation: its floating state leaves are kept in
`moment_dtype` between steps and widened to float32 for the update, which it computes, and
returns, in float32. For float32 moments and parameters every cast is the identity, so `adamw`
gives optax.adamw's numbers bit for bit and the same optimizer-state tree (checkpoints of either
restore into the other).

Precision lost in bfloat16 (8 significant bits, a relative spacing of 2^-8 to 2^-7):
  parameters: `optax.apply_updates` adds the float32 update to the weight in float32 and rounds
    once, so an update smaller than half a bfloat16 ulp of its weight (|u| below |w| / 512 to
    |w| / 256) vanishes. Adam's step is about the learning rate per weight, so at lr 1e-6 a
    weight larger than ~5e-4 in magnitude does not move at all (nor does weight decay,
    lr * wd * |w|).
  moments: mu (b1 = 0.9 moves it by 10% per step) keeps its 2-3 significant digits. nu's step
    (1 - b2 = 0.1% of its value) is below half an ulp (0.2-0.4%): nu never decreases, and it
    rises only on a squared gradient several times above it. Under a steady gradient it falls
    behind float32's nu (g = 1 +- 0.1 for 3000 steps: 0.48 against 0.97), so Adam's steps come
    out larger (1.4x there); use float32 moments unless their memory is what does not fit.
"""

import jax
import jax.numpy as jnp
import optax

MOMENT_DTYPES = ("float32", "bfloat16")


def _cast_floating(tree, dtype):
  """`tree` with its floating leaves in `dtype` (counters and other integers unchanged)."""
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
  )


def moments_stored_in(
    inner: optax.GradientTransformation, moment_dtype
) -> optax.GradientTransformation:
  """`inner` with its floating state stored in `moment_dtype`, its update run in float32.

  The gradients and the state are widened to float32 before `inner.update` and its new state is
  rounded to `moment_dtype` after it (the rounding described in the module doc); the updates
  stay float32, so the parameters are rounded only where they are applied.
  """
  moment_dtype = jnp.dtype(moment_dtype)

  def init(params):
    return _cast_floating(inner.init(params), moment_dtype)

  def update(updates, state, params=None):
    updates, state = inner.update(
        _cast_floating(updates, jnp.float32), _cast_floating(state, jnp.float32), params
    )
    return updates, _cast_floating(state, moment_dtype)

  return optax.GradientTransformation(init, update)


def adamw(
    learning_rate,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    moment_dtype="float32",
) -> optax.GradientTransformation:
  """optax.adamw (same arguments and state tree) with both moments in `moment_dtype`.

  Weight decay adds `weight_decay * w` to the float32 update (for bfloat16 parameters the
  product is formed in bfloat16: a 2^-9 relative error on a term of size lr * wd * |w|).
  """
  return optax.chain(
      moments_stored_in(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), moment_dtype),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(learning_rate),
  )

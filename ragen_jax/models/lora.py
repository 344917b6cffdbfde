"""Low-rank adapters (LoRA) on the decoder's linear layers.

    model = lora.add(model, LoraConfig(rank=64, alpha=64), key)   # adapters on all seven kernels
    plain = lora.merge(model)                                      # W + scale * A @ B folded in

A target kernel W of shape [L, *in, *out] (q, k, v: [L, D, n, Dh]; o: [L, H, Dh, D]; gate, up:
[L, D, F]; down: [L, F, D]) gains two stacked adapters, A [L, *in, r] drawn from
N(0, 1 / prod(in)) and B [L, r, *out] at zero, so a fresh adapter leaves the model unchanged.
Adapters are float32 whatever the base weights' dtype: they are what trains, and an update below
half a bfloat16 ulp of a weight would vanish (ragen_jax/algos/optim.py); they are small.
The layer function (`qwen2._decoder_layer`) adds scale * (x @ A) @ B, scale = alpha / r, to
every projection whose adapters exist: training, prefill and sampling share that one path.

Adapters are `LoraParam`s (an `nnx.Param` subclass, so they are trained and checkpointed
with the other parameters, and `nnx.state(model, LoraParam)` picks them out); in the pure
parameter dicts of the train step they are the leaves named `<target>_lora_a` / `_lora_b`
(`partition`, `combine`, `without_adapters`).

A small adapter of our own rather than a library (qwix): the decoder keeps its kernels stacked
over layers and runs them under one `lax.scan` with 2-D matmuls, which a module-interception
library would have to unstack or wrap, and the project does not depend on one.
"""

import math
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from ragen_jax.models.config import LoraConfig
from ragen_jax.models.config import LORA_TARGETS

# Kernel dimensions that a projection contracts over, after the layer axis (o: heads, head_dim).
_IN_DIMS = {"o": 2}


class LoraParam(nnx.Param):  # pylint: disable=abstract-method
  """A LoRA adapter factor (A or B): trainable, distinct from the base weights."""


def kernel_name(target: str) -> str:
  return f"{target}_kernel"


def adapter_names(target: str) -> tuple[str, str]:
  """(A's, B's) attribute and parameter-dict key for `target`."""
  return f"{target}_lora_a", f"{target}_lora_b"


def is_adapter_key(key: Any) -> bool:
  return isinstance(key, str) and (key.endswith("_lora_a") or key.endswith("_lora_b"))


def adapter_shapes(target: str, kernel_shape, kernel_axes, rank: int):
  """((A shape, A axes), (B shape, B axes)) of a kernel [L, *in, *out] with these axes."""
  n_in = _IN_DIMS.get(target, 1)
  in_shape, out_shape = kernel_shape[1 : 1 + n_in], kernel_shape[1 + n_in :]
  axes = tuple(kernel_axes) if kernel_axes else (None,) * len(kernel_shape)
  in_axes, out_axes = axes[1 : 1 + n_in], axes[1 + n_in :]
  a = ((kernel_shape[0], *in_shape, rank), (axes[0], *in_axes, None))
  b = ((kernel_shape[0], rank, *out_shape), (axes[0], None, *out_axes))
  return a, b


def init_adapters(
    kernels: dict[str, nnx.Variable], cfg: LoraConfig, key: jax.Array, sharding=None
) -> dict[str, LoraParam]:
  """The adapters of `cfg.targets`, keyed by attribute name.

  Args:
    kernels: the layers' kernel Variables by attribute name (`q_kernel`, ...), for their
      shapes and logical axes (abstract ones from `nnx.eval_shape` do).
    cfg: the LoRA settings.
    key: PRNG key for the A factors.
    sharding: optional `logical axes -> jax Sharding`, where to put each adapter.
  """
  out = {}
  keys = jax.random.split(key, len(cfg.targets))
  for target, k in zip(cfg.targets, keys):
    kernel = kernels[kernel_name(target)]
    axes = kernel.get_metadata().get("out_sharding")
    (a_shape, a_axes), (b_shape, b_axes) = adapter_shapes(target, kernel.shape, axes, cfg.rank)
    fan_in = math.prod(a_shape[1:-1])
    a = jax.random.normal(k, a_shape, jnp.float32) / math.sqrt(fan_in)
    b = jnp.zeros(b_shape, jnp.float32)
    for name, value, value_axes in zip(adapter_names(target), (a, b), (a_axes, b_axes)):
      if sharding is not None:
        value = jax.device_put(value, sharding(value_axes))
      out[name] = LoraParam(value, out_sharding=value_axes, eager_sharding=False)
  return out


def _set_config(model, config) -> None:
  """Every module of `model` that holds the ModelConfig gets `config`."""
  for _, module in nnx.iter_graph(model):
    if isinstance(module, nnx.Module) and hasattr(module, "config"):
      module.config = config


def add(model, cfg: LoraConfig, key: jax.Array, sharding=None):
  """`model` (a Qwen2 or Qwen2Critic without adapters) with fresh adapters, in place.

  The base weights are kept as they are (shared, not copied); the model's config gets `lora`.
  """
  config = model.config
  if config.lora is not None:
    raise ValueError("the model already has LoRA adapters")
  layers = model.decoder.layers
  kernels = {kernel_name(t): getattr(layers, kernel_name(t)) for t in LORA_TARGETS}
  for name, param in init_adapters(kernels, cfg, key, sharding).items():
    setattr(layers, name, param)
  _set_config(model, config.replace(lora=cfg))
  return model


def merged_kernel(kernel, a, b, scale: float) -> jax.Array:
  """W + scale * A @ B for one stacked kernel [L, *in, *out] (computed in float32)."""
  n_layers, rank = a.shape[0], a.shape[-1]
  a_LxIxR = jnp.asarray(a, jnp.float32).reshape(n_layers, -1, rank)
  b_LxRxO = jnp.asarray(b, jnp.float32).reshape(n_layers, rank, -1)
  delta = jnp.einsum("lir,lro->lio", a_LxIxR, b_LxRxO).reshape(kernel.shape)
  return (jnp.asarray(kernel, jnp.float32) + scale * delta).astype(kernel.dtype)


def merge(model):
  """A new plain model (no adapters, config.lora None) whose kernels are W + scale * A @ B.

  The model passed in is left as it is; its non-kernel parameters are shared, not copied.
  """
  config = model.config
  if config.lora is None:
    return model
  plain = nnx.eval_shape(lambda: type(model)(config.replace(lora=None), rngs=nnx.Rngs(0)))
  state = nnx.state(model, nnx.Param)
  plain_state = nnx.state(plain, nnx.Param)
  merged = nnx.to_pure_dict(state)  # new dicts: popping from them leaves `model` whole
  merged_layers = merged["decoder"]["layers"]
  for target in config.lora.targets:
    a_name, b_name = adapter_names(target)
    merged_layers[kernel_name(target)] = merged_kernel(
        merged_layers[kernel_name(target)],
        merged_layers.pop(a_name),
        merged_layers.pop(b_name),
        config.lora.scale,
    )
  nnx.replace_by_pure_dict(plain_state, merged)
  nnx.update(plain, plain_state)
  return plain


def partition(params: dict) -> tuple[dict, dict]:
  """(trainable, frozen) parts of a pure parameter dict: with adapters, the adapters and the
  rest; without, everything and {}. `combine` puts them back together."""

  def split(tree):
    trainable, frozen = {}, {}
    for key, value in tree.items():
      if isinstance(value, dict):
        t, f = split(value)
        if t:
          trainable[key] = t
        if f:
          frozen[key] = f
      elif is_adapter_key(key):
        trainable[key] = value
      else:
        frozen[key] = value
    return trainable, frozen

  if not has_adapters(params):
    return params, {}
  return split(params)


def combine(trainable: dict, frozen: dict) -> dict:
  """The full pure parameter dict from `partition`'s two parts."""
  out = dict(frozen)
  for key, value in trainable.items():
    out[key] = combine(value, out.get(key, {})) if isinstance(value, dict) else value
  return out


def has_adapters(params) -> bool:
  """Whether a pure parameter dict holds LoRA adapters."""
  if not isinstance(params, dict):
    return False
  return any(is_adapter_key(k) or has_adapters(v) for k, v in params.items())


def without_adapters(params: dict) -> dict:
  """The parameters with every B at zero: the base model's function, for the KL reference,
  without a second copy of the base weights (the zeros are adapter-sized)."""

  def zero(tree):
    return {
        k: zero(v) if isinstance(v, dict) else (jnp.zeros_like(v) if k.endswith("_lora_b") else v)
        for k, v in tree.items()
    }

  return zero(params)

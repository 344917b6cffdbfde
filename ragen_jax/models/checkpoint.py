"""Reads and writes Hugging Face Qwen2 checkpoints (config.json + safetensors).

Loading streams: the model is first built abstractly (`nnx.eval_shape`, no
memory), then each stacked parameter is filled one Hugging Face tensor at a
time from the memory-mapped safetensors files and moved to the device before
the next one is read. Host memory peaks at one stacked parameter (e.g. all
layers' gate kernels), never a second copy of the model.

Dimension legend: L layers, D model dim, H query heads, K kv heads,
Dh head dim, V vocab, F mlp dim. Hugging Face Linear weights are [out, in];
ours are [in, ...out] with heads split out.
"""

import contextlib
import glob
import json
import os
from typing import Callable, Iterator

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
import safetensors.numpy

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.qwen2 import Qwen2
from ragen_jax.models.qwen2 import Qwen2Critic

# Tensors that may be in a checkpoint and carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _layer_specs(c: ModelConfig):
  """(our name, HF name suffix, HF shape, to-ours, to-HF) per layer tensor."""
  d, h, k, dh, f = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size)

  def proj_in(n):  # HF [n*Dh, D] -> ours [D, n, Dh]
    return (lambda w: w.T.reshape(d, n, dh)), (lambda w: w.reshape(d, n * dh).T)

  def bias(n):  # [n*Dh] <-> [n, Dh]
    return (lambda b: b.reshape(n, dh)), (lambda b: b.reshape(n * dh))

  ident = (lambda w: w), (lambda w: w)
  transpose = (lambda w: w.T), (lambda w: w.T)
  return [
      ("attn_norm", "input_layernorm.weight", (d,), *ident),
      ("q_kernel", "self_attn.q_proj.weight", (h * dh, d), *proj_in(h)),
      ("q_bias", "self_attn.q_proj.bias", (h * dh,), *bias(h)),
      ("k_kernel", "self_attn.k_proj.weight", (k * dh, d), *proj_in(k)),
      ("k_bias", "self_attn.k_proj.bias", (k * dh,), *bias(k)),
      ("v_kernel", "self_attn.v_proj.weight", (k * dh, d), *proj_in(k)),
      ("v_bias", "self_attn.v_proj.bias", (k * dh,), *bias(k)),
      # HF [D, H*Dh] -> ours [H, Dh, D]
      (
          "o_kernel",
          "self_attn.o_proj.weight",
          (d, h * dh),
          lambda w: w.T.reshape(h, dh, d),
          lambda w: w.reshape(h * dh, d).T,
      ),
      ("mlp_norm", "post_attention_layernorm.weight", (d,), *ident),
      ("gate_kernel", "mlp.gate_proj.weight", (f, d), *transpose),
      ("up_kernel", "mlp.up_proj.weight", (f, d), *transpose),
      ("down_kernel", "mlp.down_proj.weight", (d, f), *transpose),
  ]


class _TensorReader:
  """Name -> tensor over all safetensors files of a checkpoint directory."""

  def __init__(self, path: str, stack: contextlib.ExitStack):
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
      with open(index_path, encoding="utf-8") as fp:
        weight_map = json.load(fp)["weight_map"]
      files = sorted(set(weight_map.values()))
    else:
      files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
      raise FileNotFoundError(f"no *.safetensors files in {path}")
    self._handles = {}
    for name in files:
      handle = stack.enter_context(safe_open(os.path.join(path, name), framework="np"))
      for key in handle.keys():
        self._handles[key] = handle
    self.unused = set(self._handles)

  def __contains__(self, name: str) -> bool:
    return name in self._handles

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Reads tensor `name`, checking its shape against the config's."""
    if name not in self._handles:
      raise ValueError(f"checkpoint is missing tensor {name!r}")
    handle = self._handles[name]
    actual = tuple(handle.get_slice(name).get_shape())
    if actual != tuple(shape):
      raise ValueError(
          f"tensor {name!r} has shape {actual} but config.json " f"implies {tuple(shape)}"
      )
    self.unused.discard(name)
    return handle.get_tensor(name)


def _fill(var: nnx.Variable, build: Callable[[np.ndarray], None], dtype, sharding=None) -> None:
  """Builds one parameter in a host buffer and moves it to the device(s).

  With `sharding` (logical axes -> jax Sharding) each device receives only its
  slice (`make_array_from_callback`), so no device ever holds the whole tensor.
  """
  buf = np.empty(var.shape, dtype=dtype)
  build(buf)
  if sharding is None:
    var.set_value(jnp.asarray(buf))
  else:
    target = sharding(tuple(var.get_metadata().get("out_sharding") or ()))
    var.set_value(jax.make_array_from_callback(buf.shape, target, lambda index: buf[index]))
  del buf


def load_hf(
    path: str,
    dtype=jnp.float32,
    param_dtype=None,
    *,
    critic: bool = False,
    sharding=None,
    remat: bool = False,
) -> Qwen2 | Qwen2Critic:
  """Loads a local Hugging Face Qwen2 / Qwen2.5 checkpoint directory.

  Args:
    path: directory with config.json and model.safetensors, or sharded
      model-*.safetensors with model.safetensors.index.json. Local only.
    dtype: activation dtype.
    param_dtype: parameter dtype; defaults to `dtype`.
    critic: return a Qwen2Critic (decoder from the checkpoint, zero value head).
    sharding: optional `logical axes -> jax Sharding` (sharding.Sharder.named):
      every tensor is placed straight into its sharding.
    remat: rematerialise each layer in the backward pass.

  Returns:
    The Qwen2 (or Qwen2Critic) module with the checkpoint's weights.

  Raises:
    ValueError: a tensor is missing, unexpected, or has the wrong shape.
  """
  with open(os.path.join(path, "config.json"), encoding="utf-8") as fp:
    hf_config = json.load(fp)
  param_dtype = dtype if param_dtype is None else param_dtype
  config = ModelConfig.from_hf_dict(hf_config, dtype=dtype, remat=remat, param_dtype=param_dtype)
  cls = Qwen2Critic if critic else Qwen2
  model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  np_dtype = np.dtype(config.param_dtype)
  c = config

  with contextlib.ExitStack() as stack:
    reader = _TensorReader(path, stack)
    dec = model.decoder
    v, d = c.vocab_size, c.hidden_size
    fill = lambda var, build, dt=np_dtype: _fill(var, build, dt, sharding)
    fill(
        dec.embedding, lambda b: b.__setitem__(..., reader.get("model.embed_tokens.weight", (v, d)))
    )
    fill(dec.final_norm, lambda b: b.__setitem__(..., reader.get("model.norm.weight", (d,))))
    for ours, suffix, shape, to_ours, _ in _layer_specs(c):

      def build(buf, suffix=suffix, shape=shape, to_ours=to_ours):
        for i in range(c.num_layers):
          buf[i] = to_ours(reader.get(f"model.layers.{i}.{suffix}", shape))

      fill(getattr(dec.layers, ours), build)
    if critic:
      fill(model.value_kernel, lambda b: b.fill(0), np.float32)
      fill(model.value_bias, lambda b: b.fill(0), np.float32)
      reader.unused.discard("lm_head.weight")
    elif not c.tie_word_embeddings:
      fill(model.lm_head, lambda b: b.__setitem__(..., reader.get("lm_head.weight", (v, d)).T))
    else:
      # Some tied checkpoints also store the (identical) head; it is unused.
      reader.unused.discard("lm_head.weight")
    unexpected = sorted(n for n in reader.unused if not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
      raise ValueError(
          f"checkpoint has tensors that config.json does not account for: "
          f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
      )
  return model


def _hf_tensors(model: Qwen2) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (HF name, array) one tensor at a time, in HF's naming."""
  c, dec = model.config, model.decoder
  yield "model.embed_tokens.weight", np.asarray(dec.embedding[...])
  for ours, suffix, _, _, to_hf in _layer_specs(c):
    stacked = np.asarray(getattr(dec.layers, ours)[...])
    for i in range(c.num_layers):
      yield f"model.layers.{i}.{suffix}", np.ascontiguousarray(to_hf(stacked[i]))
    del stacked
  yield "model.norm.weight", np.asarray(dec.final_norm[...])
  if not c.tie_word_embeddings:
    yield "lm_head.weight", np.ascontiguousarray(np.asarray(model.lm_head[...]).T)


def save_hf(model: Qwen2, out_dir: str, *, max_shard_bytes: int = 4 * 2**30) -> None:
  """Writes config.json and safetensors that `transformers` loads as Qwen2.

  Tensors keep the model's param_dtype. Checkpoints larger than
  `max_shard_bytes` are split into model-0000i-of-0000n.safetensors plus
  model.safetensors.index.json, as transformers does.

  Args:
    model: a Qwen2 causal LM.
    out_dir: output directory (created if needed).
    max_shard_bytes: largest shard size.
  """
  if not isinstance(model, Qwen2):
    raise TypeError(f"save_hf expects a Qwen2 causal LM, got {type(model).__name__}")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as fp:
    json.dump(model.config.to_hf_dict(), fp, indent=2)

  shards, current, size = [], {}, 0
  tmp_names = []

  def flush():
    name = f"shard-{len(tmp_names):05d}.tmp"
    safetensors.numpy.save_file(current, os.path.join(out_dir, name), metadata={"format": "pt"})
    tmp_names.append(name)
    shards.append(list(current))

  for name, array in _hf_tensors(model):
    if current and size + array.nbytes > max_shard_bytes:
      flush()
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  flush()
  del current

  n = len(tmp_names)
  if n == 1:
    os.replace(os.path.join(out_dir, tmp_names[0]), os.path.join(out_dir, "model.safetensors"))
    return
  weight_map, total = {}, 0
  for i, (tmp, names) in enumerate(zip(tmp_names, shards)):
    final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    os.replace(os.path.join(out_dir, tmp), os.path.join(out_dir, final))
    total += os.path.getsize(os.path.join(out_dir, final))
    weight_map.update({name: final for name in names})
  with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as fp:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fp, indent=2)

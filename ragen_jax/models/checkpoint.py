"""Reads and writes Hugging Face Qwen2, Qwen3, Llama and Qwen2.5-VL checkpoints (config.json +
safetensors), and reads GGUF files (`load_gguf`; models/gguf_checkpoint.py parses them).
Qwen2.5-VL's tower and its two key layouts are models/vl_checkpoint.py's.

Loading streams: the model is first built abstractly (`nnx.eval_shape`, no
memory), then each stacked parameter is filled one Hugging Face tensor at a
time from the memory-mapped safetensors files and moved to the device before
the next one is read. Host memory peaks at one stacked parameter (e.g. all
layers' gate kernels), never a second copy of the model.

A directory's weights are the files transformers reads there (`weight_files`: model.safetensors
before model.safetensors.index.json); an export over an earlier one leaves only its own set of
weight files (`save_hf`). A damaged or incomplete file raises an error that names it.

Dimension legend: L layers, D model dim, H query heads, K kv heads,
Dh head dim, V vocab, F mlp dim. Hugging Face Linear weights are [out, in];
ours are [in, ...out] with heads split out.
"""

import contextlib
import json
import os
import re
from typing import Callable, Iterator

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
import safetensors.numpy

from ragen_jax import atomic_write
from ragen_jax.models import gguf_checkpoint
from ragen_jax.models import hf_config
from ragen_jax.models import lora
from ragen_jax.models import vl_checkpoint
from ragen_jax.models.build import model_class
from ragen_jax.models.config import layer_table
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.qwen2 import Qwen2
from ragen_jax.models.qwen2 import Qwen2Critic

# Tensors that may be in a checkpoint and carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# transformers' names for the weights of a local checkpoint directory.
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def _layer_specs(c: ModelConfig):
  """(our name, HF name suffix, HF shape, to-ours, to-HF) per layer tensor of `layer_table`, in
  HF's order; the HF shape is that of to-HF of one layer's slice."""
  d, h, k, dh = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim

  def proj_in(n):  # HF [n*Dh, D] -> ours [D, n, Dh]
    return (lambda w: w.T.reshape(d, n, dh)), (lambda w: w.reshape(d, n * dh).T)

  def bias(n):  # [n*Dh] <-> [n, Dh]
    return (lambda b: b.reshape(n, dh)), (lambda b: b.reshape(n * dh))

  ident = (lambda w: w), (lambda w: w)
  transpose = (lambda w: w.T), (lambda w: w.T)
  # HF [D, H*Dh] -> ours [H, Dh, D]
  proj_out = (lambda w: w.T.reshape(h, dh, d)), (lambda w: w.reshape(h * dh, d).T)
  hf = {
      "attn_norm": ("input_layernorm.weight", *ident),
      "q_kernel": ("self_attn.q_proj.weight", *proj_in(h)),
      "k_kernel": ("self_attn.k_proj.weight", *proj_in(k)),
      "v_kernel": ("self_attn.v_proj.weight", *proj_in(k)),
      "q_bias": ("self_attn.q_proj.bias", *bias(h)),  # Qwen2
      "k_bias": ("self_attn.k_proj.bias", *bias(k)),
      "v_bias": ("self_attn.v_proj.bias", *bias(k)),
      "q_norm": ("self_attn.q_norm.weight", *ident),  # Qwen3
      "k_norm": ("self_attn.k_norm.weight", *ident),
      "o_kernel": ("self_attn.o_proj.weight", *proj_out),
      "mlp_norm": ("post_attention_layernorm.weight", *ident),
      "gate_kernel": ("mlp.gate_proj.weight", *transpose),
      "up_kernel": ("mlp.up_proj.weight", *transpose),
      "down_kernel": ("mlp.down_proj.weight", *transpose),
  }
  table = layer_table(c)
  unmapped = sorted(set(table) - set(hf))
  if unmapped:
    raise NotImplementedError(f"no Hugging Face name for the layer parameters {unmapped}")
  specs = []
  for ours, (suffix, to_ours, to_hf) in hf.items():
    if ours in table:
      layer_shape = jax.ShapeDtypeStruct(table[ours][0][1:], jnp.float32)
      specs.append((ours, suffix, jax.eval_shape(to_hf, layer_shape).shape, to_ours, to_hf))
  return specs


def weight_files(path: str) -> list[str]:
  """The safetensors files of a checkpoint directory, chosen as transformers chooses them.

  model.safetensors wins over model.safetensors.index.json when both are present (transformers'
  `from_pretrained` checks it first); an index names its shards in its weight_map. Empty when
  the directory has neither.

  Raises:
    ValueError: the index is not JSON with a weight_map of file names.
    FileNotFoundError: a shard the index names is missing.
  """
  if os.path.isfile(os.path.join(path, WEIGHTS_NAME)):
    return [os.path.join(path, WEIGHTS_NAME)]
  index_path = os.path.join(path, INDEX_NAME)
  if not os.path.isfile(index_path):
    return []
  weight_map = read_json_file(index_path).get("weight_map")
  if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
    raise ValueError(f"{index_path}: no weight_map of tensor names to file names")
  files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
  for file in files:
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{index_path} names {os.path.basename(file)}, which is missing")
  return files


def missing_files(path: str) -> list[str]:
  """What `path` lacks to be a Hugging Face checkpoint that load_hf reads: [] when nothing."""
  missing = []
  if not os.path.isfile(os.path.join(path, "config.json")):
    missing.append("config.json")
  if not any(os.path.isfile(os.path.join(path, n)) for n in (WEIGHTS_NAME, INDEX_NAME)):
    missing.append(f"{WEIGHTS_NAME} or {INDEX_NAME}")
  return missing


def read_json_file(path: str) -> dict:
  """The JSON object in a checkpoint's file; ValueError naming the file when it holds anything
  else."""
  try:
    with open(path, encoding="utf-8") as fp:
      value = json.load(fp)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


def read_config(path: str, **overrides) -> ModelConfig:
  """The ModelConfig of a checkpoint: a directory's config.json, or a GGUF file's metadata
  (`hf_config.from_hf_dict` either way).

  Raises:
    FileNotFoundError: no config.json, or no such GGUF file.
    ValueError: config.json or the metadata is damaged, lacks a key or holds a model type or
      feature that is not supported; the message names the file.
  """
  if gguf_checkpoint.is_gguf(path):
    reader = gguf_checkpoint.open_reader(path)
    return _config_from_dict(gguf_checkpoint.hf_config_dict(path, reader), path, **overrides)
  config_path = os.path.join(path, "config.json")
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"no config.json in {path}")
  return _config_from_dict(read_json_file(config_path), config_path, **overrides)


def _config_from_dict(values: dict, source: str, **overrides) -> ModelConfig:
  try:
    return hf_config.from_hf_dict(values, **overrides)
  except ValueError as e:
    raise ValueError(f"{source}: {e}") from None


class _TensorReader:
  """Name -> tensor over the safetensors files of a checkpoint directory (`weight_files`)."""

  def __init__(self, path: str, stack: contextlib.ExitStack):
    files = weight_files(path)
    if not files:
      raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {path}")
    self._handles = {}
    for file in files:
      try:
        handle = stack.enter_context(safe_open(file, framework="np"))
      except safetensors.SafetensorError as e:
        raise ValueError(f"{file}: not a complete safetensors file ({e})") from None
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
    **overrides,
) -> Qwen2 | Qwen2Critic:
  """Loads a local Hugging Face Qwen2 / Qwen2.5, Qwen3, Llama 3.x or Qwen2.5-VL checkpoint
  directory.

  Args:
    path: directory with config.json and model.safetensors, or sharded
      model-*.safetensors with model.safetensors.index.json (`weight_files`
      says which when both are there). Local only.
    dtype: activation dtype.
    param_dtype: parameter dtype; defaults to `dtype`.
    critic: return a Qwen2Critic (decoder from the checkpoint, zero value head).
    sharding: optional `logical axes -> jax Sharding` (sharding.Sharder.named):
      every tensor is placed straight into its sharding.
    **overrides: other ModelConfig fields (remat, attention).

  Returns:
    The Qwen2 (or Qwen2Critic) module with the checkpoint's weights (the Qwen2 classes run all
    the families, `config.model_type` says which); a Qwen2_5_VL, a Qwen2 with the vision tower,
    for Qwen2.5-VL (its critic takes the language model alone).

  Raises:
    FileNotFoundError: config.json or the weights are missing.
    ValueError: a damaged file (named); a tensor is missing, unexpected, or has the wrong shape.
  """
  param_dtype = dtype if param_dtype is None else param_dtype
  config = read_config(path, dtype=dtype, param_dtype=param_dtype, **overrides)
  with contextlib.ExitStack() as stack:
    return _build(config, _TensorReader(path, stack), critic, sharding, "config.json")


def load_gguf(
    path: str,
    dtype=jnp.float32,
    param_dtype=None,
    *,
    critic: bool = False,
    sharding=None,
    **overrides,
) -> Qwen2 | Qwen2Critic:
  """Loads a GGUF file's Llama, Qwen2 or Qwen3 decoder, every tensor dequantised to float32 by
  the `gguf` package and then cast to `param_dtype` (models/gguf_checkpoint.py: the format, the
  q/k row order undone). Arguments and result as `load_hf`'s.

  Raises:
    FileNotFoundError: no such file.
    ValueError: not GGUF, damaged or cut short; an unsupported architecture, feature or tensor
      type; a missing or unexpected tensor, or one whose shape disagrees with the metadata. The
      message names the file.
  """
  param_dtype = dtype if param_dtype is None else param_dtype
  reader = gguf_checkpoint.open_reader(path)
  config = _config_from_dict(
      gguf_checkpoint.hf_config_dict(path, reader),
      path,
      dtype=dtype,
      param_dtype=param_dtype,
      **overrides,
  )
  tensors = gguf_checkpoint.GGUFTensors(path, reader, config.num_heads, config.num_kv_heads)
  try:
    return _build(config, tensors, critic, sharding, "the metadata")
  except ValueError as e:
    message = str(e)
    raise ValueError(message if message.startswith(path) else f"{path}: {message}") from None


def load(path: str, dtype=jnp.float32, param_dtype=None, **kwargs) -> Qwen2 | Qwen2Critic:
  """`load_gguf` for a GGUF file, `load_hf` for a Hugging Face directory (same arguments)."""
  loader = load_gguf if gguf_checkpoint.is_gguf(path) else load_hf
  return loader(path, dtype, param_dtype, **kwargs)


def _build(config: ModelConfig, reader, critic: bool, sharding, source: str):
  """The model of `config` with its weights from `reader` (HF name -> array; `_TensorReader` or
  `gguf_checkpoint.GGUFTensors`), one stacked parameter at a time."""
  cls = model_class(config, critic=critic)
  model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  if config.vision is not None:
    reader = vl_checkpoint.hub_names(reader)
  np_dtype = np.dtype(config.param_dtype)
  c = config
  dec = model.decoder
  v, d = c.vocab_size, c.hidden_size
  fill = lambda var, build, dt=np_dtype: _fill(var, build, dt, sharding)
  fill(dec.embedding, lambda b: b.__setitem__(..., reader.get("model.embed_tokens.weight", (v, d))))
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
  if config.vision is not None and critic:
    reader.unused.difference_update([n for n in reader.unused if "visual." in n])
  elif config.vision is not None:
    vl_checkpoint.fill_tower(model.visual, reader, fill)
  unexpected = sorted(n for n in reader.unused if not n.endswith(_IGNORED_SUFFIXES))
  if unexpected:
    raise ValueError(
        f"checkpoint has tensors that {source} does not account for: "
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
  if c.vision is not None:
    yield from vl_checkpoint.tower_tensors(model.visual)


def _place_shards(out_dir: str, shards: list[tuple[str, list[str]]]) -> set[str]:
  """Renames the staged (temporary file, tensor names) into transformers' file names, with the
  index when there are several; returns the names of the files now in place."""
  if len(shards) == 1:
    os.replace(shards[0][0], os.path.join(out_dir, WEIGHTS_NAME))
    return {WEIGHTS_NAME}
  weight_map, total = {}, 0
  for i, (tmp, names) in enumerate(shards):
    final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    os.replace(tmp, os.path.join(out_dir, final))
    total += os.path.getsize(os.path.join(out_dir, final))
    weight_map.update({name: final for name in names})
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  atomic_write.write_text(os.path.join(out_dir, INDEX_NAME), json.dumps(index, indent=2))
  return {INDEX_NAME, *weight_map.values()}


def save_hf(model: Qwen2, out_dir: str, *, max_shard_bytes: int = 4 * 2**30) -> None:
  """Writes config.json and safetensors that `transformers` loads as the model's family
  (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM or, with the tower in the Hub's key
  layout, Qwen2_5_VLForConditionalGeneration).

  Tensors keep the model's param_dtype. A model with LoRA adapters is written merged
  (`lora.merge`: W + scale * A @ B), as the plain checkpoint of its function. Checkpoints larger than
  `max_shard_bytes` are split into model-0000i-of-0000n.safetensors plus
  model.safetensors.index.json, as transformers does.

  Over an earlier export the directory ends with one set of weight files: the new files are
  written under temporary names and renamed into place first, config.json after them, and only
  then are the earlier set's files that the new set does not replace removed. An interrupted
  export leaves a complete set (the earlier one where model.safetensors still wins).

  Args:
    model: a Qwen2 causal LM.
    out_dir: output directory (created if needed).
    max_shard_bytes: largest shard size.
  """
  if not isinstance(model, Qwen2):
    raise TypeError(f"save_hf expects a Qwen2 causal LM, got {type(model).__name__}")
  model = lora.merge(model)
  os.makedirs(out_dir, exist_ok=True)
  shards, current, size = [], {}, 0

  def stage():
    shards.append(
        (os.path.join(out_dir, f"shard-{len(shards):05d}.tmp{os.getpid()}"), list(current))
    )
    safetensors.numpy.save_file(current, shards[-1][0], metadata={"format": "pt"})

  try:
    for name, array in _hf_tensors(model):
      if current and size + array.nbytes > max_shard_bytes:
        stage()
        current, size = {}, 0
      current[name] = array
      size += array.nbytes
    stage()
    del current
    written = _place_shards(out_dir, shards)
  finally:  # A failed export leaves no temporary files behind.
    for tmp, _ in shards:
      if os.path.exists(tmp):
        os.remove(tmp)
  atomic_write.write_text(
      os.path.join(out_dir, "config.json"), json.dumps(hf_config.to_hf_dict(model.config), indent=2)
  )
  for name in os.listdir(out_dir):
    is_weights = name in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_NAME.fullmatch(name)
    if is_weights and name not in written:
      os.remove(os.path.join(out_dir, name))

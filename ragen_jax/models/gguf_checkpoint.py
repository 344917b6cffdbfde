"""GGUF files (llama.cpp's single-file checkpoints): the decoder's config from the metadata, and
its tensors dequantised and renamed to Hugging Face's layout.

    reader = gguf_checkpoint.open_reader(path)
    config_dict = gguf_checkpoint.hf_config_dict(path, reader)   # what config.json would hold
    tensors = gguf_checkpoint.GGUFTensors(path, reader, num_heads, num_kv_heads)
    w_q = tensors.get("model.layers.0.self_attn.q_proj.weight", (H * Dh, D))  # float32 [out, in]

`models.load_gguf` (models/checkpoint.py) builds the model from these, through the same code that
reads a Hugging Face directory. The `gguf` package (maintained with llama.cpp) parses the file and
dequantises every tensor type it implements; nothing here decodes a quantisation format.

Two things of the format matter for a decoder:
  - Shapes are stored in ggml's order (fastest dimension first): a [out, in] matrix is listed as
    [in, out]; the reader's arrays are already in NumPy's (row-major) order.
  - llama.cpp's converter permutes the rows of the q and k projections of Llama-architecture
    models, so that each head's rotary pairs are interleaved (its "normal" RoPE) instead of split
    in halves (Hugging Face's). Loading undoes it; a loader that does not still runs and gives
    plausible but wrong logits. Qwen2 and Qwen3 files are not permuted (llama.cpp's NeoX RoPE).

Every error names the file and what is wrong in one line: a file that is not GGUF or is cut short,
an architecture, tensor type or feature this decoder lacks, a missing tensor, or a shape that
disagrees with the metadata.
"""

import functools
import os
from typing import Any

import gguf
import numpy as np

# general.architecture -> Hugging Face model_type (the families models/config.py implements).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# Architectures whose q/k rows llama.cpp's converter permutes (module doc).
_PERMUTED_QK = frozenset({"llama"})
_MAGIC = b"GGUF"

# Hugging Face tensor name -> llama.cpp's, outside the layers and inside layer N.
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_OF_LAYER_SUFFIX = {gguf_name: hf for hf, gguf_name in _LAYER_NAMES.items()}
_HF_OF_GLOBAL = {gguf_name: hf for hf, gguf_name in _GLOBAL_NAMES.items()}


def is_gguf(path: str) -> bool:
  """Whether `path` names a GGUF file: a `.gguf` name (a damaged one is then refused as GGUF,
  not as a directory), or a file that starts with GGUF's magic bytes."""
  if str(path).endswith(".gguf"):
    return True
  if not os.path.isfile(path):
    return False
  with open(path, "rb") as fp:
    return fp.read(4) == _MAGIC


def open_reader(path: str) -> gguf.GGUFReader:
  """The gguf package's reader of `path` (memory-mapped, read-only).

  The reader parses every metadata entry as it opens (SmolLM2's 98k vocabulary entries: seconds),
  and a run reads one file three times (the config, the weights, the tokenizer): the last file
  opened is kept while it is unchanged on disk.

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a GGUF file, or damaged or cut short (the message names the file).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such GGUF file")
  stat = os.stat(path)
  return _open(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _open(path: str, size: int, mtime_ns: int) -> gguf.GGUFReader:
  del size, mtime_ns  # the cache key: a file rewritten in place is read again
  try:
    return gguf.GGUFReader(path, "r")
  except Exception as e:  # pylint: disable=broad-except
    # The reader meets damage in whatever NumPy or struct raises (a tensor cut short cannot be
    # reshaped to its size); all of them mean one thing here.
    raise ValueError(
        f"{path}: not a readable GGUF file, damaged or cut short ({type(e).__name__}: {e})"
    ) from None


def metadata_value(reader: gguf.GGUFReader, key: str, default=None):
  """One metadata value as a Python value (str, number, bool or list); `default` when absent."""
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def hf_config_dict(path: str, reader: gguf.GGUFReader) -> dict[str, Any]:
  """The Hugging Face config.json of the file's decoder (for `hf_config.from_hf_dict`).

  Raises:
    ValueError: an architecture or feature the decoder lacks, or missing metadata (the message
      names the file and the key).
  """
  arch = metadata_value(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise ValueError(
        f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
    )
  names = {t.name for t in reader.tensors}
  get = lambda key, default=None: metadata_value(reader, f"{arch}.{key}", default)

  def need(key):
    value = get(key)
    if value is None:
      raise ValueError(f"{path}: metadata lacks {arch}.{key}")
    return value

  for key in ("expert_count", "attention.sliding_window"):
    if get(key):
      raise ValueError(f"{path}: {arch}.{key} = {get(key)} is not supported (a dense decoder only)")
  scaling = get("rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in names:
    # Llama 3.1's frequency remapping is stored as a tensor of factors, not its parameters.
    raise ValueError(f"{path}: RoPE frequency scaling ({scaling}, rope_freqs) is not supported")
  hidden, heads = need("embedding_length"), need("attention.head_count")
  head_dim = get("attention.key_length") or hidden // heads
  for key in ("attention.value_length", "rope.dimension_count"):
    if get(key) not in (None, head_dim):
      raise ValueError(
          f"{path}: {arch}.{key} = {get(key)} differs from the head size {head_dim}: partial "
          "rotary and unequal key and value sizes are not supported"
      )
  embed = [t for t in reader.tensors if t.name == "token_embd.weight"]
  if not embed:
    raise ValueError(f"{path}: missing tensor 'token_embd.weight'")
  return {
      "model_type": ARCHITECTURES[arch],
      # The embedding's rows (ggml order [D, V]) when the metadata does not state it.
      "vocab_size": int(get("vocab_size", embed[0].shape[-1])),
      "hidden_size": int(hidden),
      "intermediate_size": int(need("feed_forward_length")),
      "num_hidden_layers": int(need("block_count")),
      "num_attention_heads": int(heads),
      "num_key_value_heads": int(get("attention.head_count_kv", heads)),
      "head_dim": int(head_dim),
      "rope_theta": float(get("rope.freq_base", 10000.0)),
      "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
      "max_position_embeddings": int(get("context_length", 2048)),
      # llama.cpp omits the head when it is the embedding.
      "tie_word_embeddings": "output.weight" not in names,
  }


def hf_name(gguf_name: str) -> str:
  """The Hugging Face name of a llama.cpp tensor name; unknown names are returned unchanged."""
  if gguf_name in _HF_OF_GLOBAL:
    return _HF_OF_GLOBAL[gguf_name]
  block, _, rest = gguf_name.partition(".")
  layer, _, suffix = rest.partition(".")
  if block == "blk" and layer.isdigit() and suffix in _HF_OF_LAYER_SUFFIX:
    return f"model.layers.{int(layer)}.{_HF_OF_LAYER_SUFFIX[suffix]}"
  return gguf_name


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
  """Inverts llama.cpp's q/k permutation: within each head, rows (2i, 2i+1) go back to
  (i, i + Dh/2)."""
  rows = w.shape[0]
  return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFTensors:
  """Hugging Face name -> float32 array of a GGUF file, in Hugging Face's orientation, with the
  same interface as models/checkpoint.py's safetensors reader (`__contains__`, `get`, `unused`:
  the names not yet read, unknown llama.cpp names kept as they are)."""

  def __init__(self, path: str, reader: gguf.GGUFReader, num_heads: int, num_kv_heads: int):
    self._path = path
    self._arch = metadata_value(reader, "general.architecture")
    self._heads = {"q_proj": num_heads, "k_proj": num_kv_heads}
    self._tensors = {hf_name(t.name): t for t in reader.tensors}
    self.unused = set(self._tensors)

  def __contains__(self, name: str) -> bool:
    return name in self._tensors

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor `name` dequantised to float32, checked against the `shape` the metadata implies."""
    if name not in self._tensors:
      gguf_name = _GLOBAL_NAMES.get(name) or _layer_gguf_name(name)
      raise ValueError(f"{self._path}: missing tensor {gguf_name!r} (Hugging Face {name!r})")
    tensor = self._tensors[name]
    try:
      values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
      raise ValueError(
          f"{self._path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the "
          "gguf package cannot dequantise"
      ) from None
    # ggml lists dimensions fastest first; NumPy's order is the reverse.
    values = np.asarray(values, np.float32).reshape(tuple(int(n) for n in tensor.shape[::-1]))
    if values.shape != tuple(shape):
      raise ValueError(
          f"{self._path}: tensor {tensor.name!r} has shape {values.shape} (Hugging Face order) but "
          f"the metadata implies {tuple(shape)}"
      )
    projection = name.rsplit(".", 2)[-2]
    if self._arch in _PERMUTED_QK and projection in self._heads:
      values = _unpermute_rows(values, self._heads[projection])
    self.unused.discard(name)
    return values


def _layer_gguf_name(name: str) -> str:
  parts = name.split(".", 3)  # model, layers, N, suffix
  if len(parts) == 4 and parts[3] in _LAYER_NAMES:
    return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
  return name

"""Tiny GGUF files for the tests, written as llama.cpp's converter writes them, and the same
weights as a Hugging Face directory (a shared helper: imported by test files, no tests here).

    config = write_gguf(path, "llama", GGMLQuantizationType.Q8_0)   # its HF config, returned
    write_hf_directory(directory, "llama")     # the same F32 weights and tokenizer, HF layout

`write_gguf` writes with the `gguf` package (llama.cpp's writer) a tiny random decoder in
Hugging Face naming: names from gguf's own tensor map, the q/k rows of Llama permuted into
llama.cpp's rotary order, every matrix in one tensor type (quantised by gguf, or random blocks
for the K-quants gguf cannot quantise) and the norms in F32, and a byte-level BPE tokenizer
trained here by the `tokenizers` package in the metadata. `write_hf_directory` writes the same
seed's tensors unpermuted to model.safetensors, with config.json and the tokenizer's own
tokenizer.json: a second route to the same model that shares none of the GGUF reading.
"""

import functools
import json
import os

import gguf
from gguf import GGMLQuantizationType as Q
import numpy as np
from safetensors import numpy as safetensors_numpy
import tokenizers as hf_tokenizers

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    # RAGEN's FrozenLake prompts (the launch test plays them within the smoke context).
    "You're a helpful assistant. You are solving the FrozenLake puzzle. The observation includes "
    "both a symbol grid and zero-indexed coordinates for the start, goal, player, and any holes."
    "\nCoordinates range from the top-left corner (0, 0) to the bottom-right corner (3, 3).\n"
    "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile."
    "\nRespond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n\nThe "
    "meaning of each symbol in the state is:\nP: player, _: empty, O: hole, G: goal, X: player "
    "in hole, √: player on goal\nYour available actions are:\nLeft, Down, Right, Up\nYou can "
    'make up to 10 actions, separated by the action separator " || "\n',
    "\nTurn 1:\nState:\nCoordinates: \nBoard size: 4 rows x 4 cols (zero-indexed).\nStart: "
    "(1, 1)\nGoal: (0, 1)\nPlayer: (1, 1)\nHoles: (1, 3), (2, 0)\nGrid Map: \n_G__\n_P_O\n"
    "O___\n____\nYou have 10 actions left. Always output: <think>...</think><answer>...</answer>"
    " with no extra text. Strictly follow this format. Max response length: 100 words (tokens).",
    "Reward:\n-0.1\n",
    "<think>The goal is below me, so I move Down.</think><answer>Down || Right</answer>",
    "Sokoban: push the box onto the target. Turn 12: State:\n#\t#\t#\n#\tP\t_\n  2048 + 17 = 2065",
    "The capital of France is Paris. Numbers like 123456 and 3.14159 appear too, isn't it?",
    "Indented   text   with   triple   spaces   (two of each run form a token of their own).",
]
# (K-quant, the byte ranges of its fp16 scales in a block): random blocks with these set small.
K_QUANT_SCALES = {
    Q.Q2_K: (80, 84),
    Q.Q3_K: (108, 110),
    Q.Q4_K: (0, 4),
    Q.Q5_K: (0, 4),
    Q.Q6_K: (208, 210),
}
MODELS = {  # arch -> Hugging Face config of a tiny decoder (vocab_size set from the tokenizer)
    # K-quant blocks are 256 wide: the Llama model's matrices have 256-multiple inputs.
    "llama": dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # Qwen3: a head size that is not hidden / heads (its metadata's key_length; transformers
    # reads none and takes Qwen3's 128), an untied head.
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}


@functools.lru_cache(maxsize=None)
def trained_tokenizer(digits_first: bool = False) -> hf_tokenizers.Tokenizer:
  """A byte-level BPE of ~600 tokens with the chat markers as special tokens, learned with
  GPT-2's split, or with every digit split off first (as SmolLM's was)."""
  tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
  pre = hf_tokenizers.pre_tokenizers
  tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
  if digits_first:
    tok.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True), tok.pre_tokenizer])
  trainer = hf_tokenizers.trainers.BpeTrainer(
      vocab_size=600,
      special_tokens=list(SPECIALS),
      initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator(CORPUS * 20, trainer)
  return tok


def hf_tensors(config: dict, vocab: int, seed: int) -> dict[str, np.ndarray]:
  """Random weights in Hugging Face naming and [out, in] layout."""
  rng = np.random.default_rng(seed)
  d, f, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
  h, k = config["num_attention_heads"], config["num_key_value_heads"]
  dh = config.get("head_dim", d // h)
  w = lambda *shape: (0.05 * rng.standard_normal(shape)).astype(np.float32)
  norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
  out = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": norm(d)}
  if not config["tie_word_embeddings"]:
    out["lm_head.weight"] = w(vocab, d)
  for i in range(layers):
    p = f"model.layers.{i}."
    out |= {
        p + "input_layernorm.weight": norm(d),
        p + "post_attention_layernorm.weight": norm(d),
        p + "self_attn.q_proj.weight": w(h * dh, d),
        p + "self_attn.k_proj.weight": w(k * dh, d),
        p + "self_attn.v_proj.weight": w(k * dh, d),
        p + "self_attn.o_proj.weight": w(d, h * dh),
        p + "mlp.gate_proj.weight": w(f, d),
        p + "mlp.up_proj.weight": w(f, d),
        p + "mlp.down_proj.weight": w(d, f),
    }
    if config["model_type"] == "qwen2":
      for name, n in (("q", h), ("k", k), ("v", k)):
        out[p + f"self_attn.{name}_proj.bias"] = w(n * dh)
    if config["model_type"] == "qwen3":
      out[p + "self_attn.q_norm.weight"] = norm(dh)
      out[p + "self_attn.k_norm.weight"] = norm(dh)
  return out


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter's q/k row order: each head's halves interleaved."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _k_quant_blocks(rows: int, cols: int, qtype, rng) -> np.ndarray:
  """Random K-quant bytes whose values stay near 0.05 (scales set small, then rescaled)."""
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  lo, hi = K_QUANT_SCALES[qtype]
  data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
  data[..., lo:hi] = np.full((hi - lo) // 2, 1.0, np.float16).view(np.uint8)
  peak = np.abs(gguf.quants.dequantize(data.reshape(rows, -1), qtype)).max()
  data[..., lo:hi] = np.full((hi - lo) // 2, 0.05 / peak, np.float16).view(np.uint8)
  return data.reshape(rows, -1)


def write_gguf(
    path, arch="llama", qtype=Q.F32, *, seed=0, drop=(), types=None, edit_meta=None, pre="gpt2"
):
  """Writes a tiny `arch` decoder as a GGUF file (module doc), every matrix in `qtype` but those
  `types` names (llama.cpp name -> type), without the tensors `drop` names, with `edit_meta`
  (key -> (value, GGUFValueType)) added; returns its HF config."""
  config = dict(MODELS[arch])
  tok = trained_tokenizer(digits_first=pre == "smollm")
  vocab = tok.get_vocab_size()
  config["vocab_size"] = vocab
  h, k = config["num_attention_heads"], config["num_key_value_heads"]
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(config["num_hidden_layers"])
  writer.add_context_length(4096)
  writer.add_embedding_length(config["hidden_size"])
  writer.add_feed_forward_length(config["intermediate_size"])
  writer.add_head_count(h)
  writer.add_head_count_kv(k)
  writer.add_rope_freq_base(config["rope_theta"])
  writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
  if "head_dim" in config:
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
  tokens = [tok.id_to_token(i) for i in range(vocab)]
  merges = json.loads(tok.to_str())["model"]["merges"]
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
  writer.add_bos_token_id(tokens.index("<|im_start|>"))
  writer.add_eos_token_id(tokens.index("<|im_end|>"))
  writer.add_pad_token_id(tokens.index("<|endoftext|>"))
  writer.add_add_bos_token(False)
  writer.add_chat_template(CHATML)
  for key, (value, vtype) in (edit_meta or {}).items():
    writer.add_key_value(key, value, vtype)
  names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
  rng = np.random.default_rng(seed + 1)
  for hf_name, w in hf_tensors(config, vocab, seed).items():
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name in drop:
      continue
    if arch == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
      w = _llama_cpp_permute(w, h if "attn_q" in name else k)
    qtype_here = (types or {}).get(name, qtype)
    if w.ndim == 1:
      writer.add_tensor(name, w)
    elif qtype_here == Q.I32:
      writer.add_tensor(name, (w * 100).astype(np.int32))
    elif qtype_here in K_QUANT_SCALES:
      writer.add_tensor(name, _k_quant_blocks(*w.shape, qtype_here, rng), raw_dtype=qtype_here)
    elif qtype_here == Q.F16:
      writer.add_tensor(name, w.astype(np.float16))
    elif qtype_here == Q.F32:
      writer.add_tensor(name, w)
    else:
      writer.add_tensor(name, gguf.quants.quantize(w, qtype_here), raw_dtype=qtype_here)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return config


def write_hf_directory(path, arch="llama", *, seed=0, pre="gpt2"):
  """Writes to directory `path` the model `write_gguf(..., arch, Q.F32, seed=seed, pre=pre)`
  writes, in Hugging Face's layout: config.json, model.safetensors (rows in HF's order) and the
  trained tokenizer (tokenizer.json, tokenizer_config.json with the chat markers and template);
  returns its HF config."""
  os.makedirs(path, exist_ok=True)
  config = dict(MODELS[arch])
  tok = trained_tokenizer(digits_first=pre == "smollm")
  config["vocab_size"] = tok.get_vocab_size()
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fp:
    json.dump(config, fp)
  tensors = hf_tensors(config, config["vocab_size"], seed)
  safetensors_numpy.save_file(tensors, os.path.join(path, "model.safetensors"))
  tok.save(os.path.join(path, "tokenizer.json"))
  special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}
  with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as fp:
    json.dump(special, fp)
  return config

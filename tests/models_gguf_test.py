"""GGUF checkpoints held to transformers' own GGUF loader, on files written here.

Every file is written by the `gguf` package (llama.cpp's writer) from a tiny random decoder in
Hugging Face naming, as llama.cpp's converter writes one: names from gguf's own tensor map,
the q/k rows of Llama permuted into llama.cpp's rotary order, every matrix in one tensor type
(quantised by gguf, or random blocks for the K-quants gguf cannot quantise) and the norms in
F32, and a byte-level BPE tokenizer trained here by the `tokenizers` package in the metadata.
transformers (`from_pretrained(dir, gguf_file=...)`, its own reader and dequantisers) then
gives the reference logits, greedy tokens, token ids and chat prompt.

Dimensions: B batch, T tokens, V vocabulary.
"""

import functools
import json
import os
import subprocess
import sys

import gguf
from gguf import GGMLQuantizationType as Q
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers as hf_tokenizers
import torch
import transformers

from ragen_jax import logging_utils
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import restore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _hf_tensors(config: dict, vocab: int, seed: int) -> dict[str, np.ndarray]:
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
  for hf_name, w in _hf_tensors(config, vocab, seed).items():
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


def reference(path):
  """transformers' model and tokenizer from the GGUF file (its own loader and dequantisers)."""
  directory, name = os.path.split(str(path))
  model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=name, dtype=torch.float32
  )
  return model.eval(), transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


def _ids(vocab: int, batch=2, length=12):
  rng = np.random.default_rng(3)
  ids_BxT = rng.integers(3, vocab, (batch, length)).astype(np.int32)
  mask_BxT = np.ones_like(ids_BxT)
  mask_BxT[1, :4] = 0  # left padding
  return ids_BxT, mask_BxT


def _reference_logits(hf_model, ids_BxT, mask_BxT):
  with torch.no_grad():
    return hf_model(
        input_ids=torch.tensor(ids_BxT, dtype=torch.long), attention_mask=torch.tensor(mask_BxT)
    ).logits.numpy()


def _assert_logits_match(ours_BxTxV, theirs_BxTxV, mask_BxT):
  real = mask_BxT.astype(bool)  # transformers' logits at padding are not defined alike
  np.testing.assert_allclose(ours_BxTxV[real], theirs_BxTxV[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "arch,qtype",
    [("llama", q) for q in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, *K_QUANT_SCALES)]
    + [("qwen2", Q.Q8_0), ("qwen2", Q.F16), ("qwen3", Q.Q4_1), ("qwen3", Q.F32)],
    ids=lambda v: getattr(v, "name", v),
)
def test_logits_match_transformers_gguf_loader(tmp_path, arch, qtype):
  path = tmp_path / f"{arch}.gguf"
  config = write_gguf(path, arch, qtype)
  hf_model, _ = reference(path)
  model = models.load_gguf(str(path))
  assert model.config.model_type == arch and model.config.vocab_size == config["vocab_size"]
  ids_BxT, mask_BxT = _ids(config["vocab_size"])
  ours = np.asarray(model(jnp.asarray(ids_BxT), attention_mask=jnp.asarray(mask_BxT)))
  _assert_logits_match(ours, _reference_logits(hf_model, ids_BxT, mask_BxT), mask_BxT)


def test_greedy_tokens_match_transformers(tmp_path):
  path = tmp_path / "llama.gguf"
  config = write_gguf(path, "llama", Q.Q8_0)
  hf_model, _ = reference(path)
  ids_BxT = np.random.default_rng(5).integers(3, config["vocab_size"], (2, 9)).astype(np.int32)
  ours = sampling.generate(
      models.load_gguf(str(path)),
      ids_BxT,
      np.ones_like(ids_BxT),
      key=jax.random.key(0),
      options=sampling.SamplingOptions(max_new_tokens=8, temperature=0.0),
  )
  with torch.no_grad():
    theirs = hf_model.generate(
        torch.tensor(ids_BxT, dtype=torch.long), max_new_tokens=8, min_new_tokens=8, do_sample=False
    )
  np.testing.assert_array_equal(np.asarray(ours.tokens_BxN), theirs[:, 9:].numpy())


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "llama.gguf"
  write_gguf(path, "llama", Q.Q4_1, pre="llama-bpe")
  return path


def test_chat_template_and_special_tokens_match_transformers(llama_file):
  ours, (_, theirs) = tokenizers.load(str(llama_file)), reference(llama_file)
  messages = [
      {"role": "system", "content": "You are x"},
      {"role": "user", "content": "Turn 1:\n_G__\nP_O_"},
      {"role": "assistant", "content": "<think>go</think><answer>Down</answer>"},
  ]
  for generation in (True, False):
    text = ours.apply_chat_template(messages, add_generation_prompt=generation)
    assert text == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation
    )
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  assert ours.eos_id == theirs.convert_tokens_to_ids("<|im_end|>") == ours.encode("<|im_end|>")[0]
  assert ours.pad_id == theirs.convert_tokens_to_ids("<|endoftext|>")
  assert ours.decode(ours.encode("a<|im_end|>b"), skip_special_tokens=True) == "ab"


_TEXT = st.lists(
    st.sampled_from(list("abcPG_O#\n\t .,'!?<>|0123456789éü中🙂") + ["<|im_end|>", "  ", "'s"]),
    max_size=40,
).map("".join)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_token_ids_match_transformers(tmp_path, pre):
  path = tmp_path / "tok.gguf"
  write_gguf(path, "qwen2", Q.F32, pre=pre)
  ours, (_, theirs) = tokenizers.load(str(path)), reference(path)

  @hypothesis.given(_TEXT)
  @hypothesis.settings(max_examples=150)
  def same_ids(text):
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == text

  same_ids()


def test_smollm_rule_splits_digits_first_where_transformers_does_not(tmp_path):
  """llama.cpp's "smollm" rule (SmolLM's own tokenizer) splits digits off before GPT-2's rule;
  transformers' GGUF conversion applies GPT-2's alone. They agree on text without a whitespace
  run before a digit, and differ on one."""
  path = tmp_path / "smollm.gguf"
  write_gguf(path, "llama", Q.F32, pre="smollm")
  ours, (_, theirs) = tokenizers.load(str(path)), reference(path)
  for text in ("Turn 1: 2048 + 17", "a 7 b", "(3, 1)\nGoal"):
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  # "x  7": GPT-2's rule gives "x", " ", " 7"; digits first give "x", "  ", "7".
  spaces = ours.encode("  ")
  assert len(spaces) == 1 and ours.encode("x  7") == ours.encode("x") + spaces + ours.encode("7")
  assert theirs.encode("x  7", add_special_tokens=False) != ours.encode("x  7")


def test_export_of_a_gguf_file_loads_in_transformers(tmp_path, llama_file):
  out = str(tmp_path / "hf")
  # Through the command: ragen_jax.export's flags would clash with ragen_jax.evaluate's in one
  # test process.
  run = subprocess.run(
      [sys.executable, "-m", "ragen_jax.export", f"--checkpoint={llama_file}", f"--out={out}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert run.returncode == 0 and f"exported {llama_file} to {out}" in run.stdout, run.stderr[-2000:]
  theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  model = models.load_gguf(str(llama_file))
  ids_BxT, mask_BxT = _ids(model.config.vocab_size)
  ours = np.asarray(model(jnp.asarray(ids_BxT), attention_mask=jnp.asarray(mask_BxT)))
  _assert_logits_match(ours, _reference_logits(theirs, ids_BxT, mask_BxT), mask_BxT)
  hf_tok, ours_tok = transformers.AutoTokenizer.from_pretrained(out), tokenizers.load(out)
  messages = [{"role": "user", "content": "Left || Up, 12"}]
  text = ours_tok.apply_chat_template(messages, add_generation_prompt=True)
  assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
  assert hf_tok.encode(text, add_special_tokens=False) == ours_tok.encode(text)
  assert tokenizers.load(str(llama_file)).encode(text) == ours_tok.encode(text)


def _error(fn, path) -> str:
  with pytest.raises((ValueError, FileNotFoundError)) as info:
    fn(str(path))
  message = str(info.value)
  assert str(path) in message and "\n" not in message, message
  return message


def test_bad_files_are_refused_in_one_line_naming_the_file(tmp_path, llama_file):
  data = llama_file.read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[: len(data) - 1000])
  assert "not a readable GGUF file, damaged or cut short" in _error(models.load_gguf, cut)
  header = tmp_path / "header.gguf"
  header.write_bytes(data[:200])
  assert "not a readable GGUF file" in _error(models.load_gguf, header)
  junk = tmp_path / "junk.gguf"
  junk.write_bytes(b"PK\x03\x04" + bytes(100))
  assert "not a readable GGUF file" in _error(models.load_gguf, junk)
  assert "no such GGUF file" in _error(models.load_gguf, tmp_path / "absent.gguf")

  missing = tmp_path / "missing.gguf"
  write_gguf(missing, "llama", drop=("blk.1.ffn_up.weight",))
  assert "missing tensor 'blk.1.ffn_up.weight'" in _error(models.load_gguf, missing)
  wrong = tmp_path / "wrong.gguf"
  write_gguf(
      wrong, "qwen2", edit_meta={"qwen2.feed_forward_length": (96, gguf.GGUFValueType.UINT32)}
  )
  assert "the metadata implies" in _error(models.load_gguf, wrong)
  scaled = tmp_path / "scaled.gguf"
  write_gguf(
      scaled, "llama", edit_meta={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)}
  )
  assert "RoPE frequency scaling" in _error(models.load_gguf, scaled)


def test_unsupported_architecture_tensor_type_and_tokenizer(tmp_path):
  arch = tmp_path / "gemma.gguf"
  writer = gguf.GGUFWriter(str(arch), "gemma")
  writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  assert "architecture 'gemma' is not supported" in _error(models.load_gguf, arch)
  assert "does not describe a tokenizer" in _error(tokenizers.load, arch)

  odd = tmp_path / "i32.gguf"
  write_gguf(odd, "qwen2", types={"blk.0.ffn_up.weight": Q.I32})
  assert "has type I32, which the gguf package cannot dequantise" in _error(models.load_gguf, odd)

  spm = tmp_path / "spm.gguf"
  write_gguf(spm, "qwen2", edit_meta={"tokenizer.ggml.model": ("llama", gguf.GGUFValueType.STRING)})
  assert "tokenizer.ggml.model 'llama' is not supported" in _error(tokenizers.load, spm)


def test_every_checkpoint_taker_reads_gguf(llama_file):
  config = models.checkpoint.read_config(str(llama_file))
  assert (config.model_type, config.num_layers, config.hidden_size) == ("llama", 2, 256)
  assert restore.checkpoint_kind(str(llama_file)) == "gguf"
  spec = cli.load_config_file("configs/bandit_ppo.py:smoke")
  spec.model.checkpoint, spec.model.warm_start = str(llama_file), False
  assert schema.from_config(spec).model.checkpoint == str(llama_file)


def test_one_rl_step_of_a_fetched_model_through_launch(tmp_path, llama_file):
  """`configs/frozenlake_ppo.py:smollm2,smoke` with the fetched file stood in for by a tiny one
  (XDG_CACHE_HOME): the config names it, launch.py trains a step with LoRA, then evaluates."""
  env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
  code = (
      "from ragen_jax.models import fetch; import os, shutil, sys; p = fetch.path(sys.argv[1]); "
      "os.makedirs(os.path.dirname(p)); shutil.copy(sys.argv[2], p)"
  )
  subprocess.run(
      [sys.executable, "-c", code, "smollm2-135m-instruct", str(llama_file)], env=env, check=True
  )
  workdir = tmp_path / "run"
  run = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, "launch.py"),
          "--config=configs/frozenlake_ppo.py:smollm2,smoke",
          "--config.trainer.total_steps=1",
          "--config.trainer.eval_every=1",
          f"--workdir={workdir}",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  stored = json.loads((workdir / "config.json").read_text())
  assert stored["model"]["checkpoint"].startswith(str(tmp_path / "cache"))
  assert stored["model"]["lora"]["rank"] == 64 and stored["sft"]["steps"] == 0
  scalars = logging_utils.read_scalars(str(workdir))
  assert [step for step, _ in scalars["actor/pg_loss"]] == [1]
  assert [step for step, _ in scalars["val/success"]][0] == 0
  assert (workdir / "checkpoints" / "1").is_dir()

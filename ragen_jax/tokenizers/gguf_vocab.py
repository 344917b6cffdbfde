"""The tokenizer a GGUF file describes in its metadata, rebuilt with the `tokenizers` package.

    tok = tokenizers.load("SmolLM2-135M-Instruct.Q4_1.gguf")   # an HFTokenizer
    tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))

A GGUF file has no tokenizer.json; llama.cpp's converter stores the vocabulary as metadata:
`tokenizer.ggml.model` ("gpt2": byte-level BPE, the only kind read here; it is what Llama 3,
Qwen2, Qwen3 and SmolLM use), `.tokens` and `.merges` (in byte-level spelling), `.token_type`
(3 control, 4 user-defined), `.pre` (which text-splitting rule the merges were learned with),
the special ids, and `tokenizer.chat_template`. The tokenizer built from them encodes as
transformers' own GGUF conversion does (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`):
control tokens are special added tokens, user-defined ones plain added tokens, and `.pre` picks
the split pattern (GPT-2's byte-level rule for files that name no other). One difference, on
purpose: for SmolLM's rule ("smollm") the digits are split off first, as llama.cpp and the
model's own tokenizer do and transformers' conversion does not (`SPLITS`).
"""

from typing import Any

import tokenizers as hf_tokenizers
from tokenizers import decoders
from tokenizers import models as bpe_models
from tokenizers import pre_tokenizers
from tokenizers import Regex

from ragen_jax.models import gguf_checkpoint
from ragen_jax.tokenizers import hf

_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp's split rules by `tokenizer.ggml.pre`, for the families read here; a rule is a regular
# expression applied before GPT-2's byte-level one. Files that name none of these use GPT-2's
# rule alone.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's rule differs from Llama 3's in one place: every digit is a piece of its own.
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# SmolLM's (and StarCoder's) vocabulary was learned with every digit split off first, then
# GPT-2's rule: a whitespace run before a digit stays whole ("  7" -> "  ", "7"). transformers'
# own GGUF conversion leaves this rule out and splits such runs differently.
_DIGITS_FIRST = r"\p{N}"
# `tokenizer.ggml.pre` -> (the rule, whether GPT-2's rule still follows it).
SPLITS = {
    "llama3": (_LLAMA3_SPLIT, False),
    "llama-v3": (_LLAMA3_SPLIT, False),
    "llama-bpe": (_LLAMA3_SPLIT, False),
    "smaug-bpe": (_LLAMA3_SPLIT, False),
    "qwen2": (_QWEN2_SPLIT, False),
    "deepseek-r1-qwen": (_QWEN2_SPLIT, False),
    "smollm": (_DIGITS_FIRST, True),
    "starcoder": (_DIGITS_FIRST, True),
    "refact": (_DIGITS_FIRST, True),
}
# tokenizer_config.json's names for the metadata's special ids.
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _byte_alphabet() -> dict[int, str]:
  """GPT-2's byte -> printable character table (byte-level BPE spells every token with it):
  printable Latin-1 bytes stand for themselves, the rest map to U+0100 onwards in byte order."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
  kept += range(ord("®"), ord("ÿ") + 1)
  table, extra = {}, 0
  for byte in range(256):
    if byte in kept:
      table[byte] = chr(byte)
    else:
      table[byte] = chr(256 + extra)
      extra += 1
  return table


def _pre_tokenizer(pre: str | None):
  """The text splitting of llama.cpp's `tokenizer.ggml.pre` rule (`SPLITS`)."""
  if pre not in SPLITS:
    return pre_tokenizers.ByteLevel(add_prefix_space=False)
  split, then_gpt2 = SPLITS[pre]
  return pre_tokenizers.Sequence(
      [
          pre_tokenizers.Split(Regex(split), behavior="isolated"),
          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=then_gpt2),
      ]
  )


def _field(reader, key: str, path: str):
  value = gguf_checkpoint.metadata_value(reader, key)
  if value is None:
    raise ValueError(f"{path}: the metadata does not describe a tokenizer (no {key})")
  return value


def build(path: str, reader=None) -> hf.HFTokenizer:
  """The tokenizer of a GGUF file's metadata (module doc).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not GGUF or damaged; no tokenizer in the metadata, or one that is not byte-level
      BPE, or whose tokens, types, merges or special ids disagree (the message names the file).
  """
  reader = gguf_checkpoint.open_reader(path) if reader is None else reader
  kind = _field(reader, "tokenizer.ggml.model", path)
  if kind != "gpt2":
    raise ValueError(
        f"{path}: tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)"
    )
  tokens = list(_field(reader, "tokenizer.ggml.tokens", path))
  merges = list(_field(reader, "tokenizer.ggml.merges", path))
  types = list(gguf_checkpoint.metadata_value(reader, "tokenizer.ggml.token_type") or ())
  if types and len(types) != len(tokens):
    raise ValueError(f"{path}: {len(types)} token types for {len(tokens)} tokens")
  alphabet = _byte_alphabet()
  spelled = set(alphabet.values())
  # Tokens are stored byte-level spelled; one that is not (some converters write added tokens
  # as plain text) is spelled here, so that the BPE model can reach it.
  vocab = {
      t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8")): i
      for i, t in enumerate(tokens)
  }
  try:
    pairs = [tuple(m.split(" ")) for m in merges]
    model = bpe_models.BPE(vocab, pairs, continuing_subword_prefix="", end_of_word_suffix="")
  except Exception as e:  # pylint: disable=broad-except
    # The Rust library raises a bare Exception for merges of tokens the vocabulary lacks.
    raise ValueError(f"{path}: the tokenizer's merges do not fit its tokens ({e})") from None
  tok = hf_tokenizers.Tokenizer(model)
  tok.pre_tokenizer = _pre_tokenizer(gguf_checkpoint.metadata_value(reader, "tokenizer.ggml.pre"))
  tok.decoder = decoders.ByteLevel()
  # Control tokens (chat markers) match whole and are special; user-defined ones (e.g. <think>)
  # match whole too. A control token spelled outside the byte alphabet is a converter's mislabel.
  typed = list(zip(tokens, types))
  tok.add_special_tokens(
      [
          hf_tokenizers.AddedToken(t, normalized=False, special=True)
          for t, kind in typed
          if kind == _CONTROL and set(t) <= spelled
      ]
  )
  tok.add_tokens(
      [
          hf_tokenizers.AddedToken(t, normalized=False, special=False)
          for t, kind in typed
          if kind == _USER_DEFINED and t in vocab
      ]
  )
  config: dict[str, Any] = {}
  for name, key in _SPECIAL_IDS.items():
    token_id = gguf_checkpoint.metadata_value(reader, key)
    if token_id is None:
      continue
    if not 0 <= token_id < len(tokens):
      raise ValueError(f"{path}: {key} {token_id} is outside the {len(tokens)} tokens")
    config[name] = tokens[token_id]
  if "eos_token" not in config:
    raise ValueError(
        f"{path}: the metadata names no end-of-turn token (tokenizer.ggml.eos_token_id)"
    )
  config.setdefault("pad_token", config["eos_token"])
  template = gguf_checkpoint.metadata_value(reader, "tokenizer.chat_template")
  return hf.HFTokenizer(tok, config, template)

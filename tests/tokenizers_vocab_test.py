"""QwenVocabTokenizer (real Qwen2.5 ids) and the shipped SentencePiece model."""

import importlib.resources
import random

import hypothesis
from hypothesis import strategies as st
import pytest

from ragen_jax import models
from ragen_jax import tokenizers
from ragen_jax.tokenizers import train_sentencepiece

# Qwen2.5's tokenisation of its own default system turn (ids as produced by
# the Hugging Face tokenizer of Qwen2.5-*-Instruct).
QWEN25_SYSTEM_IDS = [
    151644,
    8948,
    198,
    2610,
    525,
    1207,
    16948,
    11,
    3465,
    553,
    54364,
    14817,
    13,
    1446,
    525,
    264,
    10950,
    17847,
    13,
    151645,
    198,
]


def env_texts(n=30):
  rng = random.Random(7)
  texts = []
  for i in range(n):
    messages = (
        train_sentencepiece.bandit_episode(rng)
        if i % 3 == 2
        else train_sentencepiece.grid_episode(rng, sokoban=i % 3 == 0)
    )
    texts.append(tokenizers.render_chatml(messages, add_generation_prompt=True))
  return texts


@pytest.fixture(scope="module")
def qwen():
  return tokenizers.load("qwen2.5")


@pytest.fixture(scope="module")
def spm():
  return tokenizers.load("sentencepiece")


def test_qwen_vocab_special_ids(qwen):
  assert qwen.token_to_id("<|endoftext|>") == 151643 == qwen.pad_id
  assert qwen.token_to_id("<|im_start|>") == 151644
  assert qwen.token_to_id("<|im_end|>") == 151645 == qwen.eos_id
  assert qwen.token_to_id("<|file_sep|>") == 151664
  assert qwen.vocab_size == 151665
  assert qwen.vocab_size <= models.get_config("qwen2.5-0.5b").vocab_size


def test_qwen_vocab_matches_known_qwen25_ids(qwen):
  text = tokenizers.render_chatml([], default_system=tokenizers.QWEN_DEFAULT_SYSTEM)
  assert qwen.encode(text) == QWEN25_SYSTEM_IDS
  assert qwen.encode("Hello world") == [9707, 1879]
  assert qwen.encode_chat([{"role": "user", "content": "hi"}], True)[-3:] == [
      151644,
      77091,
      198,
  ]  # "<|im_start|>assistant\n"


def test_qwen_vocab_round_trips_env_prompts(qwen):
  for text in env_texts():
    ids = qwen.encode(text)
    assert qwen.decode(ids) == text
    assert "<|im_start|>" not in qwen.decode(ids, skip_special_tokens=True)
  # Padded model-vocabulary ids (>= 151665) decode to nothing, not an error.
  assert qwen.decode([9707, 151900]) == "Hello"


def test_sentencepiece_matches_tiny_preset_and_has_single_markers(spm):
  assert spm.vocab_size == models.get_config("tiny").vocab_size
  for marker in (
      "<|im_start|>",
      "<|im_end|>",
      "<|endoftext|>",
      "<think>",
      "</think>",
      "<answer>",
      "</answer>",
  ):
    assert spm.encode(marker) == [spm.token_to_id(marker)]
  assert spm.eos_id == spm.token_to_id("<|im_end|>")
  assert spm.pad_id == spm.token_to_id("<|endoftext|>")
  # Grid symbols are real pieces, not UTF-8 byte fallbacks.
  for symbol in "#_OX√PSGW.CBA@":
    (piece,) = spm.encode(symbol)
    assert not spm._sp.is_byte(piece), symbol  # pylint: disable=protected-access


def test_sentencepiece_round_trips_env_prompts_compactly(spm, qwen):
  total_spm = total_qwen = 0
  for text in env_texts():
    ids = spm.encode(text)
    assert spm.decode(ids) == text
    assert all(0 <= i < spm.vocab_size for i in ids)
    total_spm, total_qwen = total_spm + len(ids), total_qwen + len(qwen.encode(text))
  # Trained on this domain: no longer than Qwen's 150k vocabulary on it.
  assert total_spm <= total_qwen


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.text(max_size=40))
def test_sentencepiece_round_trips_arbitrary_text(text):
  tok = tokenizers.load("sentencepiece")
  assert tok.decode(tok.encode(text)) == text


def test_unknown_tokens_raise_key_error(spm, qwen):
  with pytest.raises(KeyError):
    spm.token_to_id("definitely not a piece")
  with pytest.raises(KeyError):
    qwen.token_to_id("Hello world")


def test_training_script_reproduces_the_shipped_model(tmp_path):
  out = tmp_path / "spm.model"
  train_sentencepiece.train(str(out))
  shipped = tokenizers.SentencePieceTokenizer.load_default()
  retrained = tokenizers.SentencePieceTokenizer(str(out))
  text = "\n".join(env_texts(5))
  assert retrained.encode(text) == shipped.encode(text)
  assert retrained.vocab_size == shipped.vocab_size
  # Byte-identical (sentencepiece is pinned; training is single-threaded).
  asset = importlib.resources.files("ragen_jax") / "assets" / "ragen_sentencepiece.model"
  assert out.read_bytes() == asset.read_bytes()

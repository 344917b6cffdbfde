"""A Hugging Face checkpoint's own tokenizer, read from local files only.

Uses the `tokenizers` package on tokenizer.json (no transformers import), and
tokenizer_config.json / chat_template.jinja for the special tokens and the chat
template. The template is rendered with jinja2 the way transformers does when
jinja2 is installed; otherwise the built-in Qwen2.5 ChatML renderer is used.
"""

import json
import os
from typing import Any, Sequence

# Absolute import of the Hugging Face package, not this ragen_jax subpackage.
import tokenizers as hf_tokenizers

from ragen_jax import atomic_write
from ragen_jax.models import checkpoint as hf_checkpoint
from ragen_jax.tokenizers import base

# tokenizer_config.json keys `save` keeps.
_CONFIG_KEYS = (
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "add_bos_token",
    "model_max_length",
)


def _token_text(value: Any) -> str | None:
  """tokenizer_config.json stores tokens as a string or {"content": ...}."""
  if isinstance(value, dict):
    return value.get("content")
  return value


class HFTokenizer(base.Tokenizer):
  """Tokenizer of a local Hugging Face checkpoint directory."""

  def __init__(
      self,
      tokenizer: hf_tokenizers.Tokenizer,
      config: dict[str, Any],
      chat_template: str | None = None,
  ):
    self._tok = tokenizer
    self._config = config
    self._chat_template = chat_template
    self._eos_id = self._id_of(config.get("eos_token"), base.IM_END)
    self._pad_id = self._id_of(config.get("pad_token"), base.ENDOFTEXT)

  @classmethod
  def from_dir(cls, path: str) -> "HFTokenizer":
    """Reads tokenizer.json (+ tokenizer_config.json, chat_template.jinja).

    Args:
      path: local checkpoint directory; nothing is downloaded.

    Returns:
      The tokenizer.

    Raises:
      FileNotFoundError: no tokenizer.json.
      ValueError: tokenizer.json or tokenizer_config.json is damaged (the message names it).
    """
    tok_path = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tok_path):
      raise FileNotFoundError(f"no tokenizer.json in {path}")
    try:
      tokenizer = hf_tokenizers.Tokenizer.from_file(tok_path)
    except Exception as e:  # pylint: disable=broad-except
      # The Rust library raises a bare Exception for any file it cannot parse.
      raise ValueError(f"{tok_path}: not a tokenizer the tokenizers package reads ({e})") from None
    config = {}
    config_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(config_path):
      config = hf_checkpoint.read_json_file(config_path)
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
      named = {t["name"]: t["template"] for t in template}
      template = named.get("default", next(iter(named.values()), None))
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja_path):  # transformers v5 writes it separately.
      with open(jinja_path, encoding="utf-8") as fp:
        template = fp.read()
    return cls(tokenizer, config, template)

  def save(self, out_dir: str) -> bool:
    """Writes tokenizer.json and tokenizer_config.json (special tokens, chat template), which
    `from_dir` and transformers' `AutoTokenizer.from_pretrained(out_dir)` read back."""
    os.makedirs(out_dir, exist_ok=True)
    self._tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {k: v for k, v in self._config.items() if k in _CONFIG_KEYS}
    # transformers' class for a plain tokenizer.json (it keeps the file's pipeline as it is).
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if self._chat_template is not None:
      config["chat_template"] = self._chat_template
    atomic_write.write_text(
        os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=2)
    )
    return True

  def _id_of(self, configured: Any, fallback: str) -> int:
    text = _token_text(configured) or fallback
    token_id = self._tok.token_to_id(text)
    if token_id is None:
      raise ValueError(f"special token {text!r} is not in the vocabulary")
    return token_id

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int:
    token_id = self._tok.token_to_id(token)
    if token_id is None:
      raise KeyError(f"{token!r} is not a single token of this tokenizer")
    return token_id

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def pad_id(self) -> int:
    return self._pad_id

  def apply_chat_template(self, messages, add_generation_prompt=False, tools=None) -> str:
    """Renders the checkpoint's own template (jinja2; its own tools block), else Qwen2.5
    ChatML."""
    if self._chat_template is None:
      return super().apply_chat_template(messages, add_generation_prompt, tools)
    try:
      import jinja2.ext  # pylint: disable=g-import-not-at-top
      import jinja2.sandbox  # pylint: disable=g-import-not-at-top
    except ImportError:
      return super().apply_chat_template(messages, add_generation_prompt, tools)
    # Same environment options as transformers' chat template renderer.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)

    def raise_exception(message):
      raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    specials = {
        k: _token_text(self._config.get(k))
        for k in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    return env.from_string(self._chat_template).render(
        messages=[dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        tools=[dict(t) for t in tools] if tools else None,
        **specials,
    )

"""The tokenizer interface shared by all implementations, and the Qwen chat template.

Every tokenizer maps text <-> int ids, knows its end-of-sequence and padding
ids, and renders chat messages with Qwen2.5's ChatML template:

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{...}<|im_end|>\\n
    ... and, for generation, <|im_start|>assistant\\n

No tensors here; ids are Python lists (the rollout code pads them into
tokens_BxT arrays).
"""

import abc
import json
from typing import Any, Mapping, Optional, Sequence

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Qwen2.5-Instruct's template inserts this when the first message is not a
# system message (the base models' template says "You are a helpful assistant.").
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

Message = Mapping[str, str]
Schema = Mapping[str, Any]  # a tool as chat templates take it (ragen_jax.envs.tools.Tool.schema)


def tools_block(tools: Sequence[Schema]) -> str:
  """What Qwen2.5's template appends to the system message's text when tools are given."""
  listed = "".join("\n" + json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
  return (
      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
      + listed
      + "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
      '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
  )


def tool_response(content: str) -> str:
  """A tool's result as Qwen2.5's template shows it (inside a user turn)."""
  return f"<tool_response>\n{content}\n</tool_response>"


def render_chatml(
    messages: Sequence[Message],
    add_generation_prompt: bool = False,
    default_system: str | None = QWEN_DEFAULT_SYSTEM,
    tools: Optional[Sequence[Schema]] = None,
) -> str:
  """Renders `messages` exactly as Qwen2.5's chat template does.

  Args:
    messages: dicts with "role" (system, user, assistant or tool) and
      "content".
    add_generation_prompt: append the assistant header to prompt a reply.
    default_system: system text used when messages[0] is not a system message;
      None inserts no system turn (with tools: an empty system text).
    tools: tool schemas ({"type": "function", "function": {...}}); their block
      (`tools_block`) ends the system message.

  Returns:
    The prompt string.

  Raises:
    ValueError: unknown role, or an assistant message with tool calls.
  """
  parts = []
  has_system = bool(messages) and messages[0]["role"] == "system"
  if tools:
    system = messages[0]["content"] if has_system else (default_system or "")
    parts.append(f"{IM_START}system\n{system}{tools_block(tools)}{IM_END}\n")
    messages = messages[1:] if has_system else messages
  elif default_system is not None and not has_system:
    parts.append(f"{IM_START}system\n{default_system}{IM_END}\n")
  for i, message in enumerate(messages):
    role, content = message["role"], message["content"]
    if message.get("tool_calls"):
      raise ValueError("assistant tool_calls are not supported by render_chatml")
    if role in ("system", "user", "assistant"):
      parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
    elif role == "tool":
      # Consecutive tool results share one user turn, as in Qwen's template.
      if i == 0 or messages[i - 1]["role"] != "tool":
        parts.append(f"{IM_START}user")
      parts.append("\n" + tool_response(content))
      if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
        parts.append(f"{IM_END}\n")
    else:
      raise ValueError(f"unknown chat role {role!r}; expected system, user, " "assistant or tool")
  if add_generation_prompt:
    parts.append(f"{IM_START}assistant\n")
  return "".join(parts)


class Tokenizer(abc.ABC):
  """Text <-> ids, special ids, and the chat template.

  Subclasses implement `encode`, `decode`, `token_to_id`, `vocab_size`,
  `eos_id` and `pad_id`; `apply_chat_template` defaults to Qwen2.5's ChatML.
  Special markers in the text (e.g. "<|im_start|>") encode to their single id.
  """

  default_system: str | None = QWEN_DEFAULT_SYSTEM

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Ids of `text`; no BOS/EOS is added."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids`; special tokens dropped when skip_special_tokens."""

  @abc.abstractmethod
  def token_to_id(self, token: str) -> int:
    """The id of a single token string; KeyError if it is not one token."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can produce (<= the model's vocab_size)."""

  @property
  @abc.abstractmethod
  def eos_id(self) -> int:
    """Id that ends a generated turn (<|im_end|> for chat models)."""

  @property
  @abc.abstractmethod
  def pad_id(self) -> int:
    """Id used for padding (<|endoftext|> for Qwen)."""

  def save(self, out_dir: str) -> bool:
    """Writes the files that load this tokenizer again (`tokenizers.load(out_dir)`) beside an
    exported checkpoint; False when it has none (a named one, `tokenizers.load("qwen2.5")`)."""
    del out_dir
    return False

  def apply_chat_template(
      self,
      messages: Sequence[Message],
      add_generation_prompt: bool = False,
      tools: Optional[Sequence[Schema]] = None,
  ) -> str:
    """The chat prompt for `messages` (Qwen2.5 template).

    Args:
      messages: list of {"role": ..., "content": ...}.
      add_generation_prompt: end with "<|im_start|>assistant\\n".
      tools: tool schemas shown in the system message (None: no tools).

    Returns:
      The prompt text; `encode` it to get ids.
    """
    return render_chatml(messages, add_generation_prompt, self.default_system, tools)

  def encode_chat(
      self,
      messages: Sequence[Message],
      add_generation_prompt: bool = False,
      tools: Optional[Sequence[Schema]] = None,
  ) -> list[int]:
    """Shorthand for encode(apply_chat_template(...))."""
    return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools))

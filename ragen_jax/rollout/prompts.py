"""RAGEN's prompt text and response parsing (host side, one episode at a time).

Each environment owns its own text (instruction, legend, action names: `Env.instruction`,
`Env.grid_vocab`, a TextEnv's attributes); this module frames it the same way for all.

Conversation of one episode (Qwen ChatML, as RAGEN's ctx_manager builds it):

  system:    "You're a helpful assistant. " + instruction + symbol legend + action names + budget
  user:      "\\nTurn 1:\\nState:\\n<render>\\nYou have N actions left. Always output: ..."
  assistant: "<think>" + sampled reply          (generation starts after the "<think>" prefix)
  user:      "Reward:\\n<r>\\n" + "\\nTurn 2:\\n..."
  ...

The "compact" style (not RAGEN's; for small models on small machines) states the output rule
once, at the end of the system message, and each user turn is only "\\nTurn k:\\n<render>\\n
Actions left: N\\n": RAGEN repeats about 30 tokens of rules every turn, which in a five-turn
Sokoban episode outweigh the boards.

Parsing follows RAGEN: regex `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (DOTALL, search),
special tokens stripped from the captures, the answer split on the separator, trimmed, empties
dropped, at most `max_actions` kept, then each word matched to an action name ignoring case.
Nothing here raises on model output: junk simply parses to no actions.

Tool calls (an environment that declares `tools`, ragen_jax.envs.tools): a reply whose text after
the think block (with `enable_think`; else the whole reply) holds `<tool_call>` is a tool-call
turn: its first `<tool_call>...</tool_call>` (one action a turn, as RAGEN's; later calls are
ignored) is parsed and checked (`parse_tool_call`), and the `<answer>` rule does not apply. Any
other reply is parsed as above, so the text form stays open beside the tool-call form.
"""

import dataclasses
import re
from typing import Dict, Optional, Sequence, Tuple

from ragen_jax.envs import tools as tools_lib
from ragen_jax.tokenizers import base as tok_base

PROMPT_STYLES = ("ragen", "compact")
SPECIAL_TOKENS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def output_rule(enable_think: bool = True, max_tokens_hint: int = 100, tools: bool = False) -> str:
  """The reply-format rule RAGEN's user turns end with (with tools, the tool-call form too)."""
  think = "<think>...</think>" if enable_think else ""
  fmt = f"{think}<answer>...</answer>"
  if tools:
    fmt += f" or {think}{tools_lib.TOOL_CALL_OPEN}...{tools_lib.TOOL_CALL_CLOSE}"
  return (
      f"Always output: {fmt} with no extra text. Strictly follow this format. Max response "
      f"length: {max_tokens_hint} words (tokens).\n"
  )


def system_prompt(
    instruction: str,
    grid_vocab: Dict[str, str],
    action_names: Optional[Sequence[str]],
    max_actions_per_traj: int,
    action_sep: str = "||",
    enable_think: bool = True,
    max_tokens_hint: int = 100,
    style: str = "ragen",
    tools: bool = False,
) -> str:
  """System message in a PROMPT_STYLES style: instruction, symbol legend, action names (none for
  free-text answers), the action budget, and in the compact style the output rule (RAGEN's
  style puts it at the end of every user turn instead). The tools themselves are the chat
  template's to show (`tools`: the environment declares some)."""
  text = "You're a helpful assistant. " + instruction
  if grid_vocab:
    text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
        f"{k}: {v}" for k, v in grid_vocab.items()
    )
  if action_names is not None:
    text += "\nYour available actions are:\n" + ", ".join(action_names)
  text += (
      f"\nYou can make up to {max_actions_per_traj} actions, separated by the action "
      f'separator " {action_sep} "\n'
  )
  return text + (output_rule(enable_think, max_tokens_hint, tools) if style == "compact" else "")


def turn_prompt(
    turn: int,
    state_text: str,
    actions_left: int,
    enable_think: bool = True,
    max_tokens_hint: int = 100,
    style: str = "ragen",
    tools: bool = False,
) -> str:
  """The user text of turn `turn` (1-based) in a PROMPT_STYLES style."""
  if style == "compact":
    return f"\nTurn {turn}:\n{state_text}\nActions left: {actions_left}\n"
  return (
      f"\nTurn {turn}:\nState:\n{state_text}\nYou have {actions_left} actions left. "
      + output_rule(enable_think, max_tokens_hint, tools)
  )


def reward_prompt(reward: float) -> str:
  """Opens the user message after a reply (RAGEN prints the turn reward this way)."""
  return f"Reward:\n{round(float(reward), 4)}\n"


def generation_prefix(enable_think: bool = True) -> str:
  """Text the assistant turn starts with; generation continues after it."""
  return "<think>" if enable_think else "<answer>"


def user_message(content: str, enable_think: bool = True) -> str:
  """A user message and the opening of the reply after it (ChatML and the generation prefix)."""
  return (
      f"{tok_base.IM_START}user\n{content}{tok_base.IM_END}\n{tok_base.IM_START}assistant\n"
      + generation_prefix(enable_think)
  )


@dataclasses.dataclass(frozen=True)
class Parsed:
  actions: Tuple[str, ...]  # answer words, at most max_actions, as written
  matched: bool  # the tag regex matched


def parse_response(
    text: str, enable_think: bool = True, action_sep: str = "||", max_actions: int = 2
) -> Parsed:
  """Parses a full reply (generation prefix included); never raises."""
  match = (_THINK_ANSWER if enable_think else _ANSWER).search(text)
  if match is None:
    return Parsed((), False)
  answer = match.group(2 if enable_think else 1)
  for token in SPECIAL_TOKENS:
    answer = answer.replace(token, "")
  words = [w.strip() for w in answer.split(action_sep)] if action_sep else [answer.strip()]
  return Parsed(tuple(w for w in words if w)[:max_actions], True)


def match_actions(words: Sequence[str], action_names: Sequence[str]) -> Tuple[list, int]:
  """(action indices of the words that name an action, number of words that do not)."""
  lookup = {name.lower(): i for i, name in enumerate(action_names)}
  indices = [lookup[w.lower()] for w in words if w.lower() in lookup]
  return indices, len(words) - len(indices)


def turn_penalised(parsed: Parsed, num_invalid: int) -> bool:
  """RAGEN's format penalty condition: a missing tag, an unknown action, or no action at all."""
  return (not parsed.matched) or num_invalid > 0 or not parsed.actions


@dataclasses.dataclass(frozen=True)
class ToolParse:
  call: Optional[tools_lib.ToolCall]  # None: the call was malformed (a format penalty)
  error: str  # what was wrong ("" for a good call), shown in the next user turn


def parse_tool_call(
    text: str, tools: Sequence[tools_lib.Tool], enable_think: bool = True
) -> Optional[ToolParse]:
  """The reply's tool call (module doc), or None when the reply makes none; never raises."""
  if enable_think:
    think = _THINK.search(text)
    if think is None:
      return None
    text = text[think.end() :]
  start = text.find(tools_lib.TOOL_CALL_OPEN)
  if start < 0:
    return None
  start += len(tools_lib.TOOL_CALL_OPEN)
  end = text.find(tools_lib.TOOL_CALL_CLOSE, start)
  if end < 0:
    return ToolParse(None, f"the tool call is not closed by {tools_lib.TOOL_CALL_CLOSE}")
  return ToolParse(*tools_lib.parse_call(text[start:end], tools))


def tool_error_text(error: str) -> str:
  """What the user turn after a malformed tool call says about it (after the reward)."""
  return f"Invalid tool call: {error}\n"

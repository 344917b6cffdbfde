"""Tool calls: the tools an environment declares, and the structured action a call becomes.

    SEARCH = tools.Tool(
        "search", "Search the encyclopedia.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    )

    class Search(envs.TextEnv):
      tools = (SEARCH,)                        # read after reset, like `instruction`
      def step(self, action):
        if isinstance(action, tools.ToolCall):  # action.name, action.arguments["query"]
          ...

An environment with `tools` (a sequence of `Tool`) gets them in its system message as the chat
template shows them (Qwen2.5's tools block, ragen_jax.tokenizers.base.tools_block; a checkpoint's
own template renders its own), and a reply's `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` reaches `step` as a `ToolCall` (ragen_jax.rollout.prompts.parse_tool_call). A call
that is not JSON, names an unknown tool, or whose arguments miss a required key or have the wrong
JSON type is a format penalty; `parse_call` returns the message naming what is wrong, which the
rollout shows in the next user turn.

Argument checks follow the schema's `properties` (`type`, a type name or a list of them, and
`enum`), `required`, and `additionalProperties: false`; nested schemas are not checked further.
"""

import dataclasses
import json
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


def _is_type(value: Any, json_type: str) -> bool:
  """Whether `value` (decoded JSON) has the JSON-schema type `json_type`."""
  if json_type == "integer":
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )
  if json_type == "number":
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  python = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}
  return isinstance(value, python[json_type])


def _types(schema: Mapping[str, Any]) -> Tuple[str, ...]:
  kind = schema.get("type", ())
  return (kind,) if isinstance(kind, str) else tuple(kind)


@dataclasses.dataclass(frozen=True)
class Tool:
  """One function an environment offers: its name, what it does, and its parameters as a
  JSON schema of type "object" (the form OpenAI and transformers' chat templates take)."""

  name: str
  description: str
  parameters: Mapping[str, Any]

  def __post_init__(self):
    where = f"tool {self.name!r}"
    if not isinstance(self.name, str) or not _NAME.match(self.name):
      raise ValueError(f"{where}: a name is letters, digits, '_', '.' or '-', not starting a digit")
    if not isinstance(self.description, str):
      raise ValueError(f"{where}: description must be a string")
    params = self.parameters
    if not isinstance(params, Mapping) or params.get("type") != "object":
      raise ValueError(f'{where}: parameters must be a JSON schema with "type": "object"')
    properties = params.get("properties", {})
    if not isinstance(properties, Mapping) or not all(
        isinstance(p, Mapping) for p in properties.values()
    ):
      raise ValueError(f'{where}: "properties" must map each argument to its schema')
    for arg, schema in properties.items():
      unknown = [t for t in _types(schema) if t not in _JSON_TYPES]
      if unknown:
        raise ValueError(f"{where}: argument {arg!r} has unknown type(s) {unknown}")
    required = params.get("required", [])
    if not isinstance(required, (list, tuple)) or not all(r in properties for r in required):
      raise ValueError(f'{where}: "required" must list argument names of "properties"')

  def schema(self) -> Dict[str, Any]:
    """The tool as chat templates take it: {"type": "function", "function": {...}}."""
    function = {"name": self.name, "description": self.description, "parameters": self.parameters}
    return {"type": "function", "function": function}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A reply's tool call, as `step` receives it: a declared tool's name and checked arguments."""

  name: str
  arguments: Mapping[str, Any]


def check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> str:
  """A message naming the first misfit of `arguments` to the tool's schema ("" if none)."""
  properties = tool.parameters.get("properties", {})
  for arg in tool.parameters.get("required", []):
    if arg not in arguments:
      return f"tool {tool.name!r} needs the argument {arg!r}"
  for arg, value in arguments.items():
    schema = properties.get(arg)
    if schema is None:
      if tool.parameters.get("additionalProperties", True) is False:
        return f"tool {tool.name!r} has no argument {arg!r} (its arguments: {sorted(properties)})"
      continue
    types = _types(schema)
    if types and not any(_is_type(value, t) for t in types):
      return f"argument {arg!r} of tool {tool.name!r} must be of type {' or '.join(types)}"
    if "enum" in schema and value not in schema["enum"]:
      return f"argument {arg!r} of tool {tool.name!r} must be one of {list(schema['enum'])}"
  return ""


def check_call(call: ToolCall, tools: Sequence[Tool]) -> str:
  """What is wrong with `call` for `tools` ("" when it names one with fitting arguments)."""
  by_name = {tool.name: tool for tool in tools}
  if call.name not in by_name:
    return f"unknown tool {call.name!r} (the tools are: {', '.join(by_name) or 'none'})"
  if not isinstance(call.arguments, Mapping):
    return f'the "arguments" of tool {call.name!r} must be a JSON object'
  return check_arguments(by_name[call.name], call.arguments)


def parse_call(body: str, tools: Sequence[Tool]) -> Tuple[Optional[ToolCall], str]:
  """(the call, "") of the text between <tool_call> and </tool_call>, or (None, what is
  wrong): not JSON, not {"name": str, "arguments": object}, or failing `check_call`."""
  try:
    obj = json.loads(body)
  except (ValueError, RecursionError) as e:
    return None, f"the tool call is not JSON ({str(e)[:120]})"
  if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
    return None, 'a tool call is a JSON object {"name": <tool>, "arguments": {...}}'
  if not isinstance(obj.get("arguments"), dict):
    return None, f'the tool call of {obj["name"]!r} has no "arguments" object'
  call = ToolCall(obj["name"], obj["arguments"])
  error = check_call(call, tools)
  return (None, error) if error else (call, "")


def as_tools(value: Any) -> Tuple[Tool, ...]:
  """An environment's `tools` attribute as a tuple (None: no tools); TypeError when it is not
  a sequence of `Tool` with distinct names."""
  if value is None:
    return ()
  if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
    raise TypeError(f"tools={value!r:.80} is not a sequence of ragen_jax.envs.tools.Tool")
  if not all(isinstance(t, Tool) for t in value):
    raise TypeError(f"tools={value!r:.80} holds something other than ragen_jax.envs.tools.Tool")
  names = [t.name for t in value]
  if len(set(names)) != len(names):
    raise TypeError(f"tools declares a name twice: {names}")
  return tuple(value)

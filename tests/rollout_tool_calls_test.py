"""Tool calls: declaring tools, parsing and checking a reply's call, and the whole path through
the rollout engine with scripted replies and the real SearchQA and code environments."""

import json

from flax import nnx
from hypothesis import given, settings, strategies as st
import jax
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax.envs.text import sandbox as sb
from ragen_jax.envs import tools as tools_lib
from ragen_jax.envs.host.pool import HostPool
from ragen_jax.envs.text import code_env
from ragen_jax.envs.text import search_qa
from ragen_jax.rollout import policies
from ragen_jax.rollout import prompts
from ragen_jax.tokenizers import base as tok_base

TOK = tokenizers.load("qwen2.5")  # decodes exactly what it encoded
LOOKUP = tools_lib.Tool(
    "lookup",
    "Look a word up.",
    {
        "type": "object",
        "properties": {
            "word": {"type": "string"},
            "limit": {"type": "integer"},
            "mode": {"type": ["string", "null"], "enum": ["short", "long", None]},
        },
        "required": ["word"],
        "additionalProperties": False,
    },
)


def call(name, arguments, think="I call a tool."):
  body = json.dumps({"name": name, "arguments": arguments})
  return f"<think>{think}</think>\n<tool_call>\n{body}\n</tool_call>"


# ------------------------------------------------------------------ declaring and checking


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "lookup", "arguments": {"word": "cat"}}', ""),
        ('{"name": "lookup", "arguments": {"word": "cat", "limit": 3.0, "mode": null}}', ""),
        ('{"name": "lookup", "arguments": {word: "cat"}}', "the tool call is not JSON"),
        ('["lookup", {"word": "cat"}]', 'a tool call is a JSON object {"name"'),
        ('{"name": "lookup", "arguments": "cat"}', 'has no "arguments" object'),
        ('{"name": "define", "arguments": {}}', "unknown tool 'define' (the tools are: lookup)"),
        ('{"name": "lookup", "arguments": {"limit": 3}}', "needs the argument 'word'"),
        ('{"name": "lookup", "arguments": {"word": 7}}', "'word' of tool 'lookup' must be of type"),
        ('{"name": "lookup", "arguments": {"word": "a", "limit": true}}', "type integer"),
        ('{"name": "lookup", "arguments": {"word": "a", "mode": "mid"}}', "must be one of"),
        ('{"name": "lookup", "arguments": {"word": "a", "x": 1}}', "has no argument 'x'"),
    ],
)
def test_parse_call_checks_the_schema(body, error):
  parsed, message = tools_lib.parse_call(body, [LOOKUP])
  assert (parsed is None) == bool(error)
  assert error in message if error else message == ""
  if not error:
    assert parsed == tools_lib.ToolCall("lookup", json.loads(body)["arguments"])


def test_bad_declarations_are_refused_with_the_tool_named():
  with pytest.raises(ValueError, match="'9lives'"):
    tools_lib.Tool("9lives", "", {"type": "object"})
  with pytest.raises(ValueError, match='"type": "object"'):
    tools_lib.Tool("f", "", {"type": "string"})
  with pytest.raises(ValueError, match="required"):
    tools_lib.Tool("f", "", {"type": "object", "properties": {}, "required": ["x"]})
  with pytest.raises(ValueError, match="unknown type"):
    tools_lib.Tool("f", "", {"type": "object", "properties": {"x": {"type": "str"}}})
  with pytest.raises(TypeError, match="twice"):
    tools_lib.as_tools([LOOKUP, LOOKUP])
  with pytest.raises(TypeError, match="not a sequence"):
    tools_lib.as_tools(LOOKUP.schema())


@pytest.mark.parametrize(
    "reply, think, expected",
    [
        (call("lookup", {"word": "a"}), True, tools_lib.ToolCall("lookup", {"word": "a"})),
        # The first call of several; the <answer> form is not needed.
        (call("lookup", {"word": "a"}) + call("lookup", {"word": "b"}), True, {"word": "a"}),
        ("<think>x</think><answer>cat</answer>", True, None),  # the text form: no tool call
        ("<think>I may use <tool_call> later", True, None),  # inside an unclosed think
        ('<think>x</think><tool_call>{"name": "lookup"', True, "not closed by </tool_call>"),
        (
            '<tool_call>{"name": "lookup", "arguments": {"word": "z"}}</tool_call>',
            False,
            {"word": "z"},
        ),
    ],
)
def test_parse_tool_call_reads_the_first_call_after_the_think_block(reply, think, expected):
  parsed = prompts.parse_tool_call(reply, [LOOKUP], think)
  if expected is None:
    assert parsed is None
  elif isinstance(expected, str):
    assert parsed.call is None and expected in parsed.error
  else:
    assert parsed.call.arguments == (expected if isinstance(expected, dict) else expected.arguments)


PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", '"name"', '"arguments"', '"lookup"']
PIECES += ['{"word": "a"}', "{", "}", "[", "]", ":", ",", '"', "\\", "1e999", "null", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), max_size=30).map("".join))
def test_any_reply_parses_without_raising(text):
  for think in (True, False):
    parsed = prompts.parse_tool_call(text, [LOOKUP], think)
    assert parsed is None or (parsed.call is None) == bool(parsed.error)


@settings(max_examples=100, deadline=None)
@given(
    st.text(),
    st.one_of(st.none(), st.integers(-(2**60), 2**60)),
    st.sampled_from(["short", "long", None]),
)
def test_a_well_formed_call_round_trips(word, limit, mode):
  arguments = {"word": word, **({} if limit is None else {"limit": limit}), "mode": mode}
  parsed = prompts.parse_tool_call(call("lookup", arguments), [LOOKUP])
  assert parsed.error == "" and parsed.call == tools_lib.ToolCall("lookup", arguments)


def test_the_environments_take_the_tool_form_by_hand():
  env = envs.make("search", tools=True)
  env.reset(0)
  query = env.instance.item.searches[0]
  by_text = search_qa.SearchQA()
  by_text.reset(0)
  assert env.step(envs.ToolCall("search", {"query": query})) == by_text.step(f"search[{query}]")
  observation, _, done, info = env.step(envs.ToolCall("search", {"q": query}))
  assert observation.startswith(search_qa.INVALID) and not done and not info["action_is_valid"]
  assert [t.name for t in env.instance.tools] == ["search", "finish"]
  assert search_qa.SearchQA().tools == ()  # off by default: the prompt shows no tools


# ------------------------------------------------------------------ through the rollout


def config(**overrides):
  values = dict(
      env_groups=1,
      group_size=2,
      max_turns=8,
      max_new_tokens=256,
      max_context=6000,
      max_turn_tokens=1536,
      max_actions_per_traj=10,
  )
  values.update(overrides)
  return rollout.RolloutConfig(**values)


class Recording(policies.ScriptedPolicy):
  """A scripted policy that also keeps each turn's sampling options."""

  def __init__(self, *args):
    super().__init__(*args)
    self.options = []

  def respond(self, inputs):
    self.options.append(inputs.options)
    return super().respond(inputs)


def play(env, fn, cfg, seed=5):
  engine = rollout.Rollout(env, TOK, cfg)
  policy = Recording(fn, TOK, cfg.max_new_tokens)
  try:
    rows = policies.Rows(0, engine.batch_size, engine.batch_size)
    return engine._play(policy, jax.random.key(0), seed, rows), policy.options  # pylint: disable=protected-access
  finally:
    engine.close()


BAD_CALLS = [  # (reply, what the next user turn says)
    (
        '<think>x</think><tool_call>{"name": "search", "arguments": {query}}</tool_call>',
        "the tool call is not JSON",
    ),
    (call("lookup", {"query": "q"}), "unknown tool 'lookup' (the tools are: search, finish)"),
    (call("search", {"q": "q"}), "tool 'search' needs the argument 'query'"),
]


def search_policy(plan, ep):
  """Member 0: three malformed calls, then the expert's actions as tool calls; member 1:
  the expert's actions in RAGEN's text form."""
  turn = len(ep.turns)
  if ep.index_in_group == 0 and turn < len(BAD_CALLS):
    return BAD_CALLS[turn][0][7:]  # after the generation prefix "<think>"
  kind, argument = search_qa.parse_action(plan.answers[0])
  if ep.index_in_group == 1:
    return f"ok</think><answer>{kind}[{argument}]</answer>"
  return call(kind, {"search": {"query": argument}, "finish": {"answer": argument}}[kind])[7:]


@pytest.mark.parametrize("window", [None, 1])
def test_search_by_tool_calls_end_to_end(window):
  cfg = config(**({} if window is None else dict(context_window="last_k", window_turns=window)))
  result, options = play(envs.make("search", tools=True), search_policy, cfg)
  schemas = [t.schema() for t in search_qa.TOOLS]
  block = tok_base.tools_block(schemas)
  tools_ep, text_ep = result.episodes
  for ep in (tools_ep, text_ep):
    assert ep.success and ep.env_done and not ep.env_error
    assert ep.turns[-1].env_reward == 1.0
    for turn in ep.turns if window is not None else ep.turns[:1]:
      assert block in TOK.decode(turn.context)  # every prompt shows the tools
  first = TOK.decode(tools_ep.turns[0].context)
  assert first == TOK.apply_chat_template(tools_ep.messages[:2], True, schemas) + "<think>"
  rule = "<think>...</think><answer>...</answer> or <think>...</think><tool_call>...</tool_call>"
  assert f"Always output: {rule} with no extra text." in tools_ep.messages[1]["content"]
  # Each malformed call: the format penalty, nothing stepped, the next turn says why.
  for j, (_, why) in enumerate(BAD_CALLS):
    turn = tools_ep.turns[j]
    assert turn.penalty == cfg.format_penalty and turn.executed == 0 and turn.env_reward == 0
    assert f"Invalid tool call: {why}" in tools_ep.messages[2 * j + 3]["content"]
  assert tools_ep.score == pytest.approx(1.0 + len(BAD_CALLS) * cfg.format_penalty)
  assert text_ep.score == pytest.approx(1.0)
  # A search's result is the next state, in the template's tool-result block; the text form's
  # is not wrapped. The reference: the environment played by hand.
  by_hand = search_qa.SearchQA()
  by_hand.reset(5)
  query = by_hand.item.searches[0]
  results = by_hand.step(f"search[{query}]")[0]
  k = len(BAD_CALLS)
  assert tools_ep.turns[k].actions == (envs.ToolCall("search", {"query": query}),)
  assert f"State:\n{tok_base.tool_response(results)}\n" in tools_ep.messages[2 * k + 3]["content"]
  assert f"State:\n{results}\n" in text_ep.messages[3]["content"]
  assert "<tool_response>" not in text_ep.messages[3]["content"]
  # Generation stops at </tool_call> as well as </answer>.
  stops = options[0].stop_token_ids + sum(options[0].stop_sequences, ())
  assert TOK.token_to_id("</tool_call>") in stops


def test_without_tools_nothing_changes():
  """Tool-call text in a reply to an environment without tools is RAGEN's text form (here a
  missing <answer>: the format penalty), and sampling keeps the rollout's own stops."""
  result, options = play(
      envs.make("search"), lambda plan, ep: call("search", {"query": "x"})[7:], config(max_turns=1)
  )
  assert options == [None]
  ep = result.episodes[0]
  assert ep.turns[0].penalised and ep.turns[0].actions == () and ep.turns[0].tool_error == ""
  assert "# Tools" not in TOK.decode(ep.turns[0].context)
  assert "</answer> with no extra text" in ep.messages[1]["content"]


@pytest.fixture(scope="module")
def isolation():
  try:
    sb.Sandbox().interpreter()
  except sb.SandboxUnavailable as e:
    pytest.skip(str(e))


def test_code_by_tool_calls_in_worker_processes(isolation):  # pylint: disable=unused-argument,redefined-outer-name
  """Member 0 submits a wrong function, then the reference, by tool call; member 1 answers in
  the text form. The environment runs in a worker process: the ToolCall crosses over."""
  env = envs.make("code", tools=True, max_attempts=2, pool="process", workers=1)

  def policy(plan, ep):
    if ep.index_in_group == 1:
      return f"ok</think><answer>{plan.answers[0]}</answer>"
    code = "def nothing():\n    pass" if not ep.turns else plan.answers[0]
    return call("submit", {"code": code})[7:]

  result, _ = play(env, policy, config(max_turns=2))
  tools_ep, text_ep = result.episodes
  assert tools_ep.success and text_ep.success and not tools_ep.env_error
  assert tools_ep.turns[0].env_reward == 0.0 and tools_ep.turns[1].env_reward == 1.0
  shown = tools_ep.messages[3]["content"]
  assert "State:\n<tool_response>\n" in shown and "Feedback: Passed 0/" in shown
  assert tok_base.tools_block([t.schema() for t in code_env.TOOLS]) in TOK.decode(
      tools_ep.turns[0].context
  )


class BadTools(envs.TextEnv):

  def __init__(self, tools):
    self.tools = tools

  def reset(self, seed):
    return "start"

  def step(self, action):
    return "after", 0.0, True, {}


def test_bad_tools_fail_their_episode_only():
  pool = HostPool(lambda: BadTools([LOOKUP.schema()]), mode="thread", step_timeout_s=5)
  try:
    (fault,) = pool.reset([0])
    assert fault.kind == "bad_output" and "ragen_jax.envs.tools.Tool" in fault.message
  finally:
    pool.close()
  pool = HostPool(lambda: BadTools((LOOKUP,)), mode="thread", step_timeout_s=5)
  try:
    (start,) = pool.reset([0])
    assert start.tools == (LOOKUP,)
  finally:
    pool.close()


def test_the_llm_samples_with_the_tool_call_stop(monkeypatch):
  """The model's sampler gets the options with "</tool_call>" only where tools are declared
  (the sampler itself is replaced by one that answers nothing: no compilation)."""
  seen = []

  def silent(graphdef, params, cache, ids_BxC, *args, options, **kwargs):
    del graphdef, params, args, kwargs
    seen.append(options)
    b, n = ids_BxC.shape[0], options.max_new_tokens
    empty = np.full((b, n), options.pad_id, np.int32)
    return sampling.SampleOutput(empty, np.zeros((b, n), np.float32), np.zeros(b, np.int32)), cache

  monkeypatch.setattr(policies.sampling, "extend", silent)
  spm = tokenizers.load("sentencepiece")
  model = models.Qwen2(models.PRESETS["tiny"], rngs=nnx.Rngs(0))
  cfg = config(group_size=1, max_turns=1, max_new_tokens=4, max_context=2048, max_turn_tokens=64)
  for tools in (True, False):
    engine = rollout.Rollout(envs.make("search", tools=tools), spm, cfg)
    result = engine.run(model, jax.random.key(0), seed=0)
    engine.close()
    assert result.episodes[0].turns[0].penalised  # an empty reply
  with_tools, without = seen
  stop = tuple(spm.encode("</tool_call>"))
  assert stop in with_tools.stop_sequences and without == engine.options
  assert stop not in without.stop_sequences

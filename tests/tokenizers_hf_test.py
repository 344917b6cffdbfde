"""HFTokenizer and the Qwen2.5 chat template against Hugging Face transformers.

A tokenizer directory is built in the test (byte-level BPE trained with the
`tokenizers` package, Qwen's special tokens, Qwen2.5-Instruct's chat template
in tokenizer_config.json); transformers' AutoTokenizer is the reference.
"""

import json
import re

import pytest
import tokenizers as hf_tokenizers
import transformers

from ragen_jax import tokenizers
from ragen_jax.envs import tools as envs_tools

# Qwen2.5-Instruct's chat template (tokenizer_config.json): the tools block, the
# tool-free part and the tool-result branch (not the assistant tool_calls branch),
# written out for the test.
QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    'tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function '
    "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
    '<|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not '
    'loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "
    '"tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

SOKOBAN_STATE = "######\n#O####\n#__###\n#X_###\n#_P_##\n######"
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You're a helpful assistant. Solve Sokoban."},
        {
            "role": "user",
            "content": f"Turn 1:\nState:\n{SOKOBAN_STATE}\n" "You have 10 actions left.",
        },
        {"role": "assistant", "content": "<think>Push up.</think><answer>Up || Up" "</answer>"},
        {"role": "user", "content": "Reward:\n-0.2\n\nTurn 2:\nState:\n√ P"},
    ],
    [
        {"role": "user", "content": "call"},
        {"role": "tool", "content": "result one"},
        {"role": "tool", "content": "result two"},
        {"role": "assistant", "content": "done"},
        {"role": "system", "content": "late system"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen_like_tokenizer")
  tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
  tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf_tokenizers.decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  trainer = hf_tokenizers.trainers.BpeTrainer(
      vocab_size=400,
      special_tokens=specials,
      initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
  )
  corpus = [json.dumps(c) for c in CONVERSATIONS] * 20
  tok.train_from_iterator(corpus, trainer)
  tok.save(str(path / "tokenizer.json"))
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>",
      "bos_token": None,
      "chat_template": QWEN25_TEMPLATE,
      "model_max_length": 32768,
  }
  with open(path / "tokenizer_config.json", "w") as fp:
    json.dump(config, fp)
  return str(path)


@pytest.fixture(scope="module")
def hf_reference(tokenizer_dir):
  return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("generation", [False, True])
def test_chat_template_matches_transformers(tokenizer_dir, hf_reference, index, generation):
  messages = CONVERSATIONS[index]
  expected = hf_reference.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=generation
  )
  assert tokenizers.render_chatml(messages, generation) == expected
  ours = [
      tokenizers.HFTokenizer.from_dir(tokenizer_dir),
      tokenizers.load("qwen2.5"),
      tokenizers.load("sentencepiece"),
  ]
  for tok in ours:
    assert tok.apply_chat_template(messages, generation) == expected


# Tools as ragen_jax.envs.tools.Tool.schema writes them (key order kept), one with
# non-ASCII text and nested schemas.
TOOLS = [
    envs_tools.Tool(
        "search",
        "Search the encyclopedia; returns the best passages.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    ).schema(),
    envs_tools.Tool(
        "set_mode",
        "Wähle den Modus — «schnell» oder 'genau'.",
        {
            "type": "object",
            "properties": {
                "mode": {"type": "string", "enum": ["fast", "exact"]},
                "limits": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["mode"],
            "additionalProperties": False,
        },
    ).schema(),
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("count", [1, 2])
def test_tools_block_matches_transformers(tokenizer_dir, hf_reference, index, count):
  messages, tools = CONVERSATIONS[index], TOOLS[:count]
  expected = hf_reference.apply_chat_template(
      messages, tools=tools, tokenize=False, add_generation_prompt=True
  )
  assert tokenizers.render_chatml(messages, True, tools=tools) == expected
  assert (
      tokenizers.HFTokenizer.from_dir(tokenizer_dir).apply_chat_template(messages, True, tools)
      == expected
  )
  assert tokenizers.load("qwen2.5").apply_chat_template(messages, True, tools) == expected
  # No tools renders as before.
  assert tokenizers.render_chatml(messages, True, tools=[]) == tokenizers.render_chatml(
      messages, True
  )


def test_builtin_renderer_without_a_template_matches(tokenizer_dir, hf_reference, tmp_path):
  # A checkpoint without chat_template falls back to the Qwen2.5 renderer.
  for name in ("tokenizer.json",):
    (tmp_path / name).write_bytes(open(f"{tokenizer_dir}/{name}", "rb").read())
  tok = tokenizers.HFTokenizer.from_dir(str(tmp_path))
  messages = CONVERSATIONS[1]
  assert tok.apply_chat_template(messages, True) == (
      hf_reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  )


def test_encode_decode_and_special_ids_match_transformers(tokenizer_dir, hf_reference):
  tok = tokenizers.load(tokenizer_dir)
  assert isinstance(tok, tokenizers.HFTokenizer)
  assert tok.eos_id == hf_reference.convert_tokens_to_ids("<|im_end|>")
  assert tok.pad_id == hf_reference.pad_token_id
  assert tok.vocab_size == len(hf_reference)
  for messages in CONVERSATIONS:
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(text)
    assert ids == hf_reference.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text == hf_reference.decode(ids)
    assert tok.decode(ids, skip_special_tokens=True) == hf_reference.decode(
        ids, skip_special_tokens=True
    )
    assert ids.count(tok.token_to_id("<|im_start|>")) == text.count("<|im_start|>")


def test_load_rejects_unknown_specs(tmp_path):
  with pytest.raises(ValueError, match="sentencepiece"):
    tokenizers.load("gpt2")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    tokenizers.HFTokenizer.from_dir(str(tmp_path))


def test_subpackage_does_not_shadow_huggingface_tokenizers():
  from ragen_jax.tokenizers import hf  # pylint: disable=g-import-not-at-top

  assert hf.hf_tokenizers is hf_tokenizers
  assert hf.hf_tokenizers.__name__ == "tokenizers"


@pytest.mark.parametrize(
    "name, damage, message",
    [
        ("tokenizer.json", lambda b: b[: len(b) // 2], "not a tokenizer the tokenizers package"),
        ("tokenizer.json", lambda b: b"<html>404</html>", "not a tokenizer the tokenizers package"),
        ("tokenizer.json", lambda b: b"{}", "not a tokenizer the tokenizers package"),
        ("tokenizer_config.json", lambda b: b[: len(b) // 2], "not valid JSON"),
        ("tokenizer_config.json", lambda b: b'"eos"', "expected a JSON object, got str"),
    ],
)
def test_a_damaged_tokenizer_file_is_named(tokenizer_dir, tmp_path, name, damage, message):
  for file in ("tokenizer.json", "tokenizer_config.json"):
    data = open(f"{tokenizer_dir}/{file}", "rb").read()
    (tmp_path / file).write_bytes(damage(data) if file == name else data)
  with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name}: {message}")):
    tokenizers.load(str(tmp_path))

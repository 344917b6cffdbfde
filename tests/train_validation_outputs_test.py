"""What a validation leaves for people to read: the trajectories' JSON lines and TensorBoard text.

The JSON lines are checked under an ASCII-only locale and against a write that fails half way;
the TensorBoard text is rendered by TensorBoard's own text plugin (Python-Markdown, then its
HTML sanitiser, which lets links and images through) for model replies that try to leave the
code block.
"""

import base64
import io
import json
import os
import re
import subprocess
import sys
import textwrap

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import PIL.Image
import pytest
from tensorboard import context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins.text import text_plugin

from ragen_jax import logging_utils
from ragen_jax import rollout
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import validation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An ASCII-only locale: no coercion to C.UTF-8, no UTF-8 mode (PEP 538, PEP 540).
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
HEADER = "<p><strong>sokoban seed 3</strong>: success True, reward 1.00, turns 2</p>"
ESCAPE = "done\n```\n![x](http://evil.example/x.png) [click](http://evil.example/) <http://a.b>"


def episode(*replies):
  messages = [{"role": "system", "content": "Solve it."}]
  for reply in replies:
    messages += [
        {"role": "user", "content": "State: √ #_P"},
        {"role": "assistant", "content": reply},
    ]
  return {
      "env": "sokoban",
      "seed": 3,
      "success": True,
      "reward": 1.0,
      "turns": 2,
      "messages": messages,
  }


def run_python(code, env=None):
  return subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)],
      cwd=ROOT,
      env={**os.environ, **(env or {})},
      capture_output=True,
      text=True,
      timeout=120,
      check=False,  # the callers read the return code
  )


def test_json_lines_are_utf8_under_an_ascii_locale(tmp_path):
  path = tmp_path / "eval.jsonl"
  proc = run_python(
      f"""
      import locale
      from ragen_jax.train import validation
      assert locale.getpreferredencoding(False) == "ANSI_X3.4-1968", locale.getpreferredencoding()
      validation.write_jsonl({ascii(str(path))}, [{ascii(episode("√ up"))}])
      """,
      ASCII_LOCALE,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  data = path.read_bytes()
  assert "√ up".encode("utf-8") in data
  assert [json.loads(line) for line in data.decode("utf-8").splitlines()] == [episode("√ up")]


def test_a_write_that_fails_half_way_leaves_the_earlier_file(tmp_path):
  """A file-size limit makes the disk 'full' after 4 KB; the 40 KB of new lines never land."""
  path = tmp_path / "eval.jsonl"
  validation.write_jsonl(str(path), [episode("left")])
  before = path.read_bytes()
  proc = run_python(f"""
      import resource, signal
      from ragen_jax.train import validation
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a kill
      resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
      validation.write_jsonl({ascii(str(path))}, [{ascii(episode("up " * 2000))}] * 10)
      """)
  assert proc.returncode == 1 and "File too large" in proc.stderr, proc.stderr[-2000:]
  assert path.read_bytes() == before
  assert os.listdir(tmp_path) == ["eval.jsonl"]  # no temporary file left beside it


def test_a_record_that_does_not_serialise_leaves_the_earlier_file(tmp_path):
  path = tmp_path / "eval.jsonl"
  validation.write_jsonl(str(path), [episode("left")])
  before = path.read_bytes()
  bad = {**episode("right"), "reward": object()}
  with pytest.raises(TypeError, match="not JSON serializable"):
    validation.write_jsonl(str(path), [episode("right")] * 3 + [bad])
  assert path.read_bytes() == before


def render(markdown_text):
  """HTML of the Text dashboard for one text summary (the plugin's own renderer)."""
  value = np.array(markdown_text.encode("utf-8"), dtype=object)
  return text_plugin.text_array_to_html(value, enable_markdown=True)


def outside_code_blocks(html):
  return re.sub(r"<pre><code>.*?</code></pre>|<!--.*?-->", "", html, flags=re.DOTALL)


def test_a_reply_that_closes_the_fence_stays_inside_it(tmp_path):
  """Through the trainer's path: SummaryWriter.text, the event file, TensorBoard's provider."""
  with logging_utils.SummaryWriter(tmp_path) as writer:
    writer.text(1, "val/sokoban/trajectories", validation.markdown([episode(ESCAPE, "````")]))
  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(tmp_path))
  mux.Reload()
  provider = data_provider.MultiplexerDataProvider(mux, str(tmp_path))
  texts = provider.read_tensors(
      context.RequestContext(), experiment_id="", plugin_name="text", downsample=10
  )
  html = text_plugin.text_array_to_html(
      texts["."]["val/sokoban/trajectories"][0].numpy, enable_markdown=True
  )
  assert "<a" not in html and "<img" not in html
  assert outside_code_blocks(html).split() == HEADER.split()
  assert "![x](http://evil.example/x.png) [click](http://evil.example/) &lt;http://a.b&gt;" in html
  assert "\n````\n" in html and "State: √ #_P" in html


# Pieces that Markdown gives meaning to, URLs, and the characters Python-Markdown deletes or
# rewrites before it looks for fences (STX, ETX, CR, tabs, NUL).
PIECES = ["`", "```", "\n```\n", "\n````\n", "~~~", "\n~~~\n", "[", "]", "(", ")", "!", "<", ">"]
PIECES += ["\n", "\r", "\t", " ", "    ", "\x02", "\x03", "\x00", "&amp;", "http://evil.example/x"]
PIECES += ["[click](http://e.example)", "![x](http://e.example/x.png)", "<http://a.b>"]
PIECES += ["<a href='http://e.example'>a</a>", "<img src=http://e.example/x.png>"]
REPLIES = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=30).map("".join)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(REPLIES, min_size=1, max_size=3))
@hypothesis.example(["```"])
@hypothesis.example([ESCAPE])
@hypothesis.example(["``\x02`\n[a](http://e.example)"])
def test_no_reply_renders_a_link_or_an_image(replies):
  html = render(validation.markdown([episode(*replies), episode("fine")]))
  assert "<a" not in html and "<img" not in html
  assert outside_code_blocks(html).split() == f"{HEADER}\n{HEADER}".split()


def test_a_visual_environments_records_carry_each_turns_frame(tmp_path):
  """Validation of visual FrozenLake under a scripted policy that draws each state it is shown
  (render_image, one state at a time): the records hold exactly those frames, one PNG a turn,
  and the viewer page carries them."""
  config = cli.load_config_file(os.path.join(ROOT, "configs", "visual_frozenlake_ppo.py:smoke"))
  with config.unlocked():
    config.envs.visual_frozenlake.val_groups = 2
    config.rollout.val_group_size = 2
    config.rollout.val_batch_groups = 2
    config.rollout.max_turns = 3
  exp = schema.from_config(config)
  engines = validation.engines(exp, tokenizers.load("sentencepiece"))
  draw = jax.jit(engines["visual_frozenlake"].env.render_image)
  drawn = {}

  def policy(state, ep):
    turn = len(ep.turns)  # turns before this one
    drawn[(ep.group_id, ep.index_in_group, turn)] = np.asarray(draw(state))
    return f"<think>go</think><answer>{('Right', 'Down', 'Down')[turn]}</answer>"

  _, episodes = validation.run(exp, engines, rollout.ScriptedPolicy(policy))
  validation.write_outputs(str(tmp_path), 7, episodes, None, ["visual_frozenlake"], 0)
  records = [json.loads(line) for line in (tmp_path / "eval" / "step_7.jsonl").open()]
  assert len(records) == 4 and sum(r["turns"] for r in records) == len(drawn)
  changed = 0
  for r in records:
    uris = r["turn_frames"]
    assert len(uris) == r["turns"] and all(u.startswith("data:image/png;base64,") for u in uris)
    for turn, uri in enumerate(uris):
      png = base64.b64decode(uri.split(",", 1)[1], validate=True)
      with PIL.Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), drawn[(r["group_id"], r["episode"], turn)])
      changed += turn > 0 and uri != uris[turn - 1]
  assert changed  # the player moved: a frame of the wrong turn would show
  page = (tmp_path / "viewer" / "step_7.html").read_text(encoding="utf-8")
  assert all(uri in page for r in records for uri in r["turn_frames"])

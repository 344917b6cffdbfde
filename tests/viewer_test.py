"""Tests of ragen_jax.viewer: the page's data, its safety against model text, Chromium, the CLI."""

import base64
import html.parser
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest

from ragen_jax import viewer

GRIDS = (
    "######\n#_P__#\n#_X__#\n#_O__#\n######",
    "######\n#____#\n#_P__#\n#_X__#\n######",
    "######\n#____#\n#____#\n#_S__#\n######",
)
THINKS = (
    "The box is below me, push it down.",
    "Again down & the box <lands> on O.",
    "Done? One more look.",
)
EVIL = "</script><b>x<!-- & --> <script>alert(1)</script>"
# Frame sources a record must not smuggle into the page: all dropped (the turn shows no image).
EVIL_FRAMES = (
    "javascript:alert(1)",
    'data:image/png;base64,AAAA" onerror="alert(1)',
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "https://evil.example/x.png",
    "data:image/png;base64," + "A" * viewer.MAX_FRAME_CHARS,
    7,
)


def _png_uri(colour):
  """A 6x6 PNG of one colour with a dark pixel, as a data URI (written with pillow)."""
  pixels = np.full((6, 6, 3), colour, np.uint8)
  pixels[2, 3] = 0
  buffer = io.BytesIO()
  PIL.Image.fromarray(pixels).save(buffer, "PNG")
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


FRAMES = tuple(_png_uri(c) for c in ((200, 40, 40), (40, 200, 40), (40, 40, 200)))


def _user(turn, state, left, reward=None):
  head = f"Reward:\n{reward}\n" if reward is not None else ""
  return {
      "role": "user",
      "content": (
          f"{head}\nTurn {turn}:\nState:\n{state}\nYou have {left} actions left. Always output: "
          "<think>...</think><answer>...</answer> with no extra text.\n"
      ),
  }


def _reply(text):
  return {"role": "assistant", "content": text}


def _known():
  """A 3-turn Sokoban episode: the box goes down onto the target on turn 2."""
  messages = [
      {"role": "system", "content": "You're a helpful assistant. Sokoban."},
      _user(1, GRIDS[0], 10),
      _reply(f"<think>{THINKS[0]}</think><answer>Down</answer>"),
      _user(2, GRIDS[1], 9, reward=-0.1),
      _reply(f"<think>{THINKS[1]}</think><answer>Down || Up</answer>"),
      _user(3, GRIDS[2], 7, reward=10.9),
      _reply(f"<think>{THINKS[2]}</think> <answer>Left</answer>"),
  ]
  return {
      "messages": messages,
      "turn_rewards": [-0.1, 10.9, -0.1],
      "success": True,
      "reward": 10.700000000000001,
      "turns": 3,
      "group_id": 4,
      "env": "sokoban",
      "seed": 10004,
      "episode": 1,
      "context_truncated": False,
      "reply_starts": [1, 2, 3],
      "turn_frames": list(FRAMES),  # as validation writes them for a visual environment
  }


def _adversarial():
  """Hostile text everywhere, malformed replies, no turn_rewards (an older record)."""
  messages = [
      {"role": "system", "content": EVIL},
      _user(1, "#" + EVIL, 4),
      _reply(EVIL),
      _user(2, "####\n#P_#", 3, reward=-0.1),
      _reply(""),
      _user(3, "####", 2, reward=-0.1),
      _reply("<think>unclosed <answer>Up"),
  ]
  return {
      "messages": messages,
      "success": False,
      "reward": float("nan"),
      "turns": 3,
      "group_id": 0,
      "env": "frozen<lake>",
      "seed": 1,
      "episode": 0,
      "context_truncated": True,
      "turn_frames": [EVIL_FRAMES[0], EVIL_FRAMES[1]],
  }


def _third():
  messages = [
      {"role": "system", "content": "Bandit."},
      _user(1, "Pull an arm.", 1),
      _reply("<think>Phoenix sounds risky.</think><answer>Phoenix</answer>"),
  ]
  return {
      "messages": messages,
      "turn_rewards": [0.25],
      "success": True,
      "reward": 0.25,
      "turns": 1,
      "group_id": 2,
      "env": "bandit",
      "seed": 7,
      "episode": 0,
      "context_truncated": False,
  }


def _episodes():
  return [_known(), _adversarial(), _third()]


class _Scripts(html.parser.HTMLParser):
  """Collects the text of every <script> element and the ids of all elements."""

  def __init__(self):
    super().__init__()
    self.scripts, self.ids, self._open = [], [], None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if "id" in attrs:
      self.ids.append(attrs["id"])
    if tag == "script":
      self._open = [attrs.get("id"), ""]

  def handle_data(self, data):
    if self._open is not None:
      self._open[1] += data

  def handle_endtag(self, tag):
    if tag == "script" and self._open is not None:
      self.scripts.append(tuple(self._open))
      self._open = None


def test_episode_view_of_known_trajectory():
  view = viewer.episode_view(_known())
  assert [s["turn"] for s in view["steps"]] == [1, 2, 3]
  assert [s["state"] for s in view["steps"]] == list(GRIDS)
  assert [s["think"] for s in view["steps"]] == list(THINKS)
  assert [s["actions"] for s in view["steps"]] == [["Down"], ["Down", "Up"], ["Left"]]
  assert [s["reward"] for s in view["steps"]] == [-0.1, 10.9, -0.1]
  assert [s["actions_left"] for s in view["steps"]] == [10, 9, 7]
  assert (view["env"], view["seed"], view["group_id"], view["episode"]) == ("sokoban", 10004, 4, 1)
  assert view["success"] is True and view["context_truncated"] is False
  assert [s["frame"] for s in view["steps"]] == list(FRAMES)


def test_episode_view_of_malformed_replies_and_old_records():
  view = viewer.episode_view(_adversarial())
  steps = view["steps"]
  assert [s["reply"] for s in steps] == [EVIL, "", "<think>unclosed <answer>Up"]
  assert all(s["think"] is None and s["answer"] is None and s["actions"] == [] for s in steps)
  # No turn_rewards: the next user message's "Reward:" line, blank for the last turn.
  assert [s["reward"] for s in steps] == [-0.1, -0.1, None]
  assert view["reward"] is None  # NaN cannot travel as JSON
  # Junk that is not a conversation at all still gives a page.
  junk = viewer.episode_view({"messages": [None, {"role": "assistant"}, {"role": "user"}]})
  assert [s["reply"] for s in junk["steps"]] == ["", None]
  assert viewer.episode_view({})["steps"] == []
  # A frame that is not a bounded PNG data URI is dropped; a record without frames has none.
  assert [s["frame"] for s in steps] == [None, None, None]
  for bad in EVIL_FRAMES:
    assert viewer.episode_view({**_known(), "turn_frames": [bad]})["steps"][0]["frame"] is None
  assert all(s["frame"] is None for s in viewer.episode_view(_third())["steps"])


def test_page_holds_every_turn_and_survives_hostile_text(tmp_path):
  episodes = _episodes()
  path = viewer.write_html(str(tmp_path / "viewer" / "step_3.html"), episodes, title="a <b> & c")
  assert path == str(tmp_path / "viewer" / "step_3.html")
  text = open(path, encoding="utf-8").read()
  parser = _Scripts()
  parser.feed(text)
  parser.close()
  # Exactly the two scripts of the page: hostile text opened or closed none.
  assert [sid for sid, _ in parser.scripts] == ["ragen-data", None]
  assert text.count("</script>") == 2 and "<!--" not in text and "<b>" not in text
  for needle in ("counter", "prev", "next", "list", "view", "env-filter", "result-filter"):
    assert parser.ids.count(needle) == 1
  blob = json.loads(parser.scripts[0][1])
  assert blob["title"] == "a <b> & c"
  assert blob["episodes"] == [viewer.episode_view(ep) for ep in episodes]
  steps = blob["episodes"][0]["steps"]
  assert [(s["state"], s["think"], s["reward"]) for s in steps] == list(
      zip(GRIDS, THINKS, [-0.1, 10.9, -0.1])
  )
  assert blob["episodes"][1]["steps"][0]["reply"] == EVIL
  # As the page encodes them: grids verbatim, '<' and '&' as JSON escapes.
  for grid in GRIDS:
    assert json.dumps(grid)[1:-1] in text
  assert "Again down \\u0026 the box \\u003clands\\u003e on O." in text
  assert all(frame in text for frame in FRAMES)
  assert "javascript:" not in text and "onerror" not in text  # _adversarial's frames dropped
  # Self-contained: nothing is fetched.
  for ref in ("http://", "https://", "src=", "href=", "@import"):
    assert ref not in text


def _chromium():
  path = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")
  if path:
    return path
  if os.environ.get("RAGEN_JAX_REQUIRE_CHROMIUM") == "1":
    pytest.fail("RAGEN_JAX_REQUIRE_CHROMIUM=1 but Chromium is missing (apt-get install chromium)")
  pytest.skip(
      "Chromium is not installed (Debian: apt-get install chromium); "
      "set RAGEN_JAX_REQUIRE_CHROMIUM=1 to make this a failure"
  )


def _headless(chromium, tmp_path, url, *args):
  """Runs headless Chromium on `url` with the page's scripts given time; returns stdout."""
  cmd = [
      chromium,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
      "--hide-scrollbars",
      f"--user-data-dir={tmp_path / 'chromium_profile'}",
      "--virtual-time-budget=5000",
      "--window-size=1280,1200",
      *args,
      url,
  ]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
  except subprocess.TimeoutExpired:
    # It takes ~2 s; a script that escaped the page (an alert, say) blocks it for good.
    pytest.fail(f"headless Chromium did not finish on {url} in 60 s")
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout


def test_chromium_renders_turns_and_navigates(tmp_path):
  chromium = _chromium()
  path = viewer.write_html(str(tmp_path / "page.html"), _episodes())
  url = "file://" + path
  dom = _headless(chromium, tmp_path, url, "--dump-dom")
  # The escaped forms are how --dump-dom serializes text nodes.
  assert 'id="counter">1 / 3<' in dom
  for grid, think in zip(GRIDS, THINKS):
    assert grid in dom
    assert think.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in dom
  assert "Trajectory 1: sokoban" in dom and "10 actions left" in dom
  assert dom.count('class="card turn"') == 3
  # A visual trajectory: each turn's image beside its text.
  for turn, frame in enumerate(FRAMES, 1):
    assert f'<img class="frame" alt="turn {turn} image" src="{frame}">' in dom
  # The URL hash selects a trajectory: #2 is the hostile one, rendered as inert text.
  dom = _headless(chromium, tmp_path, url + "#2", "--dump-dom")
  assert 'id="counter">2 / 3<' in dom
  assert "&lt;/script&gt;&lt;b&gt;x&lt;!-- &amp; --&gt;" in dom
  assert "Reply did not parse" in dom and "(empty reply)" in dom
  assert "<b>x" not in dom and "alert(1)</script>" not in dom
  assert '<img class="frame"' not in dom and "onerror" not in dom and "javascript:" not in dom
  dom = _headless(chromium, tmp_path, url + "#3", "--dump-dom")
  assert 'id="counter">3 / 3<' in dom
  assert "Phoenix sounds risky." in dom and "Pull an arm." in dom and GRIDS[0] not in dom
  png = tmp_path / "page.png"
  _headless(chromium, tmp_path, url, f"--screenshot={png}")
  data = png.read_bytes()
  assert data.startswith(b"\x89PNG") and len(data) > 10_000


# Drives the page as a user would: the next button, the right arrow key, then a filter.
_CLICKS = """<script>
var log = [];
function note() { log.push(document.getElementById("counter").textContent); }
setTimeout(function () { document.getElementById("next").click(); }, 100);
setTimeout(function () { note(); document.dispatchEvent(
    new KeyboardEvent("keydown", {key: "ArrowRight"})); }, 200);
setTimeout(function () { note(); var f = document.getElementById("result-filter");
    f.value = "failure"; f.dispatchEvent(new Event("change")); }, 300);
setTimeout(function () { note(); document.getElementById("view").setAttribute(
    "data-log", log.join("|")); }, 400);
</script>
</body>"""


def test_chromium_buttons_keys_and_filters(tmp_path):
  chromium = _chromium()
  path = viewer.write_html(str(tmp_path / "page.html"), _episodes())
  with open(path, encoding="utf-8") as fp:
    text = fp.read()
  with open(path, "w", encoding="utf-8") as fp:
    fp.write(text.replace("</body>", _CLICKS))
  dom = _headless(chromium, tmp_path, "file://" + path, "--dump-dom")
  # next -> 2, right arrow -> 3, "failure" filter -> the only failed trajectory (2), 1 of 1.
  assert 'data-log="2 / 3|3 / 3|1 / 1 (of 3)"' in dom
  assert "Trajectory 2: frozen&lt;lake&gt;" in dom


def test_cli_builds_a_page_from_jsonl(tmp_path):
  jsonl = tmp_path / "eval" / "step_5.jsonl"
  jsonl.parent.mkdir()
  jsonl.write_text(
      "".join(json.dumps(ep, ensure_ascii=False) + "\n" for ep in [_known(), _third()]) + "\n",
      encoding="utf-8",
  )
  out = tmp_path / "pages" / "five.html"
  proc = subprocess.run(
      [sys.executable, "-m", "ragen_jax.viewer", str(jsonl), f"--out={out}"],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert "2 trajectories" in proc.stdout
  text = out.read_text(encoding="utf-8")
  assert all(json.dumps(grid)[1:-1] in text for grid in GRIDS)
  assert "step_5.jsonl" in text
  # Without --out the page lands next to the records.
  assert viewer.main([str(jsonl)]) == str(tmp_path / "eval" / "step_5.html")
  jsonl.write_text("{}\nnot json\n", encoding="utf-8")
  with pytest.raises(ValueError, match="step_5.jsonl:2"):
    viewer.main([str(jsonl)])

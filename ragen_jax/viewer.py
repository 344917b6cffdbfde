"""A static HTML trajectory viewer: one self-contained page per evaluation.

  python -m ragen_jax.viewer runs/sokoban_ppo/eval/step_100.jsonl [--out=step_100.html]

The trainer writes `<workdir>/viewer/step_<s>.html` next to `eval/step_<s>.jsonl`. Each
episode record (see ragen_jax.train.validation) is reduced to its turns: the state rendered in
that turn's user message, the reply split into reasoning and answer words (the raw reply where it
does not parse), and the turn's reward. The turns travel as a JSON blob inside the page, with `<`,
`>` and `&` written as \\u escapes so no model text can close the script or open a comment; a
small inline script shows one trajectory at a time (previous/next buttons, arrow keys, `#k` in the
URL, filters by environment and outcome). The page loads nothing from the network.

A visual environment's records carry each turn's frame (`turn_frames`, PNG data URIs written by
validation): the page shows it beside the turn's text, as an <img> whose source the script sets
from the blob. Only a URI that is exactly `data:image/png;base64,` and base64 characters (at
most `MAX_FRAME_CHARS`) is kept; anything else is dropped, so a record cannot point the page at
the network or at script.
"""

import argparse
import html
import importlib.resources
import json
import math
import os
import re
from typing import Any, Dict, List, Optional

from ragen_jax import atomic_write
from ragen_jax.rollout import prompts

DEFAULT_TITLE = "ragen_jax trajectories"
MAX_FRAME_CHARS = 1 << 20  # a frame's data URI (a few hundred bytes for the built-in games)
_FRAME_URI = re.compile(r"data:image/png;base64,[A-Za-z0-9+/]+={0,2}")
# The records do not say how many actions per turn the run allowed; show every answer word.
_MAX_WORDS = 1000
_REWARD = re.compile(r"\s*Reward:\n([^\n]*)\n")
_TURN = re.compile(r"\s*Turn (\d+):\n")
_LEFT = re.compile(r"\nYou have (\d+) actions? left\.")
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# JSON may hold these raw; inside <script> they could end the element or start a comment.
_SCRIPT_UNSAFE = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _float(x: Any) -> Optional[float]:
  """A finite float, or None (NaN would make the blob invalid JSON for the browser)."""
  try:
    x = float(x)
  except (TypeError, ValueError):
    return None
  return x if math.isfinite(x) else None


def _int(x: Any) -> Optional[int]:
  try:
    return int(x)
  except (TypeError, ValueError):
    return None


def _bool(x: Any) -> Optional[bool]:
  return None if x is None else bool(x)


def split_user(text: str) -> Dict[str, Any]:
  """Splits a user turn message into the previous reward, turn number, state and actions left.

  Text that does not follow RAGEN's layout ends up whole in `state`.
  """
  reward = turn = left = None
  match = _REWARD.match(text)
  if match:
    reward, text = _float(match.group(1)), text[match.end() :]
  match = _TURN.match(text)
  if match:
    turn, text = int(match.group(1)), text[match.end() :]
  if text.startswith("State:\n"):
    text = text[len("State:\n") :]
  match = _LEFT.search(text)
  if match:
    left, text = int(match.group(1)), text[: match.start()]
  return {"prev_reward": reward, "turn": turn, "state": text, "actions_left": left}


def split_reply(text: str) -> Dict[str, Any]:
  """Reasoning, answer and action words of a reply; all None/empty when it does not parse."""
  parsed = prompts.parse_response(text, enable_think=True, max_actions=_MAX_WORDS)
  match = _THINK_ANSWER.search(text)
  if parsed.matched and match:
    return {
        "think": match.group(1).strip(),
        "answer": match.group(2).strip(),
        "actions": list(parsed.actions),
    }
  # Runs with enable_think=False reply with the answer alone; a think-mode reply like this was
  # penalised, and the page says that no reasoning came before the answer.
  parsed = prompts.parse_response(text, enable_think=False, max_actions=_MAX_WORDS)
  match = _ANSWER.search(text)
  if parsed.matched and match:
    return {"think": None, "answer": match.group(1).strip(), "actions": list(parsed.actions)}
  return {"think": None, "answer": None, "actions": []}


def frame_uri(value: Any) -> Optional[str]:
  """A turn's frame as the page may show it: a PNG data URI (module doc), else None."""
  if isinstance(value, str) and len(value) <= MAX_FRAME_CHARS and _FRAME_URI.fullmatch(value):
    return value
  return None


def _saw(window: Any, k: int) -> Dict[str, Any] | None:
  """What turn k (0-based) of a context-window episode saw: the turns shown (1-based, first
  and last; none when first > last) and the memory text standing in for earlier ones."""
  if not isinstance(window, (list, tuple)) or len(window) != 2:
    return None
  first = _int(window[0])
  return {
      "first": None if first is None else first + 1,
      "last": k,
      "memory": str(window[1] or ""),
  }


def episode_view(episode: Dict[str, Any]) -> Dict[str, Any]:
  """What the page shows of one episode record: its header fields and one entry per turn.

  A turn starts at each user message; the assistant message after it is its reply. Its reward is
  `turn_rewards[k]`, else (older records) the "Reward:" line of the next user message.
  """
  system, steps = "", []
  for message in episode.get("messages") or []:
    if not isinstance(message, dict):
      continue
    role, content = message.get("role"), str(message.get("content") or "")
    if role == "system" and not steps:
      system = content
    elif role == "user":
      user = split_user(content)
      if steps:
        steps[-1]["text_reward"] = user["prev_reward"]
      steps.append(
          {
              "turn": user["turn"] or len(steps) + 1,
              "state": user["state"],
              "actions_left": user["actions_left"],
              "reply": None,
          }
      )
    elif role == "assistant":
      if not steps or steps[-1]["reply"] is not None:  # a reply without its own user turn
        steps.append({"turn": len(steps) + 1, "state": "", "actions_left": None, "reply": None})
      steps[-1]["reply"] = content
  rewards = episode.get("turn_rewards")
  rewards = list(rewards) if isinstance(rewards, (list, tuple)) else None
  windows = episode.get("turn_windows")
  windows = list(windows) if isinstance(windows, (list, tuple)) else []
  frames = episode.get("turn_frames")
  frames = list(frames) if isinstance(frames, (list, tuple)) else []
  for k, step in enumerate(steps):
    text_reward = step.pop("text_reward", None)
    step["reward"] = _float(rewards[k]) if rewards is not None and k < len(rewards) else text_reward
    step.update(split_reply(step["reply"] or ""))
    step["saw"] = _saw(windows[k], k) if k < len(windows) else None
    step["frame"] = frame_uri(frames[k]) if k < len(frames) else None
  return {
      "env": str(episode.get("env") or "?"),
      "seed": _int(episode.get("seed")),
      "group_id": _int(episode.get("group_id")),
      "episode": _int(episode.get("episode")),
      "success": _bool(episode.get("success")),
      "reward": _float(episode.get("reward")),
      "turns": _int(episode.get("turns")),
      "context_truncated": _bool(episode.get("context_truncated")),
      "window": _int(episode.get("window")),
      "system": system,
      "steps": steps,
  }


def script_json(value: Any) -> str:
  """JSON that is safe verbatim inside a <script> element (no <, >, & characters)."""
  text = json.dumps(value, ensure_ascii=False, allow_nan=False)
  return re.sub("[<>&\u2028\u2029]", lambda m: _SCRIPT_UNSAFE[m.group(0)], text)


def _asset(name: str) -> str:
  return (importlib.resources.files("ragen_jax") / "assets" / "viewer" / name).read_text("utf-8")


def page(episodes: List[Dict[str, Any]], title: str = DEFAULT_TITLE) -> str:
  """The HTML text of the viewer page for `episodes` (records as the trainer writes them)."""
  blob = {"title": title, "episodes": [episode_view(ep) for ep in episodes]}
  title_html = html.escape(title)
  return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title_html}</title>
<style>
{_asset("viewer.css")}</style>
</head>
<body>
<header>
  <h1>{title_html}</h1>
  <button id="prev" type="button" title="previous trajectory (left arrow)">&larr; previous</button>
  <span id="counter">0 / {len(episodes)}</span>
  <button id="next" type="button" title="next trajectory (right arrow)">next &rarr;</button>
  <label>env <select id="env-filter"><option value="">all</option></select></label>
  <label>outcome <select id="result-filter"><option value="">all</option>
    <option value="success">success</option><option value="failure">failure</option>
  </select></label>
  <span id="stats"></span>
</header>
<div class="layout">
  <nav><ol id="list"></ol></nav>
  <main id="view"><noscript>This page needs JavaScript to show the trajectories.</noscript></main>
</div>
<script type="application/json" id="ragen-data">{script_json(blob)}</script>
<script>
{_asset("viewer.js")}</script>
</body>
</html>
"""


def write_html(path: str, episodes: List[Dict[str, Any]], title: str = DEFAULT_TITLE) -> str:
  """Writes the viewer page for `episodes` to `path` (atomically: a reader never sees half a page).

  Args:
    path: the HTML file to write; missing parent directories are made.
    episodes: episode records (`messages`, `turn_rewards`, `success`, `reward`, `env`, ...).
    title: the page title.

  Returns:
    `path`.
  """
  return atomic_write.write_text(path, page(episodes, title))


def read_jsonl(path: str) -> List[Dict[str, Any]]:
  """Episode records of a JSONL file (blank lines skipped); a bad line raises naming its number."""
  episodes = []
  with open(path, encoding="utf-8") as fp:
    for number, line in enumerate(fp, 1):
      if not line.strip():
        continue
      try:
        episodes.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not a JSON record ({e})") from None
  return episodes


def main(argv: Optional[List[str]] = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("eval_jsonl", help="episode records, one JSON object a line")
  parser.add_argument("--out", help="the page to write (default: EVAL_JSONL with .html)")
  parser.add_argument("--title", help="page title (default: the file's name)")
  args = parser.parse_args(argv)
  out = args.out or os.path.splitext(args.eval_jsonl)[0] + ".html"
  title = args.title or f"{DEFAULT_TITLE}: {os.path.basename(args.eval_jsonl)}"
  episodes = read_jsonl(args.eval_jsonl)
  write_html(out, episodes, title)
  print(f"wrote {out} ({len(episodes)} trajectories)")
  return out


if __name__ == "__main__":
  main()

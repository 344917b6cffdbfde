"""(prompt x, reasoning z) pairs of a rollout, per-step reasoning metrics, and RAGEN-2's sampling.

For every assistant turn of every episode (host side, from the typed episodes of
`RolloutResult`s):
  x = the tokens the model saw before writing that turn, ending with the generation prefix
      `<think>` (so `<think>` belongs to x): the episode's earlier turns and this turn's context
      (with a context window, the turn's own prompt); in a visual environment x also shows the
      frames of the turns its prompt holds (`shown`, diagnostics.prompt_images);
  z = the reasoning between `<think>` and `</think>` of the reply, special tokens removed,
      whitespace stripped, tokenised on its own. A turn with empty or unclosed reasoning is not
      valid (its share is the valid-thinking rate).

Sampling (RAGEN-2, ../shared/reference/ragen.md §5):
  first turn: up to `num_samples` valid first turns without replacement; one column per env group
    present (all first prompts of a group are the same level, so token-identical);
  multi-turn: `num_samples` draws with replacement, an episode uniformly among those with a valid
    turn, then one of its valid turns uniformly; every draw is its own column.
Columns with token-identical prompts share an id, so retrieving either counts as correct.
"""

import dataclasses
import re
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ragen_jax.rollout import prompts

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def reasoning_text(reply: str) -> str:
  """The reasoning of a reply (generation prefix included); '' when missing or unclosed."""
  match = _THINK.search(reply)
  if match is None:
    return ""
  text = match.group(1)
  for token in prompts.SPECIAL_TOKENS:
    text = text.replace(token, "")
  return text.strip()


@dataclasses.dataclass(frozen=True)
class ReasoningTurn:
  """One assistant turn as the diagnostics see it: where it came from, its context x and its
  reasoning z (tokens)."""

  episode: int  # index over all episodes of the step (tags in order)
  group: Tuple[str, int]  # (env tag, group id): episodes sharing a start state
  turn: int  # 0-based
  context: np.ndarray  # int32 [|x|]
  reasoning: Tuple[int, ...]  # z's tokens; empty = not a valid thinking turn
  shown: Tuple[int, ...] = ()  # the episode's turns that x holds (this one last): whose frames
  # its image blocks show in a visual environment


def collect_turns(results: Dict[str, object], tokenizer) -> List[ReasoningTurn]:
  """Every assistant turn of a step's rollouts (`{tag: RolloutResult}`), in episode order."""
  turns, episode = [], 0
  for tag, result in results.items():
    for ep in result.episodes:
      for t, turn in enumerate(ep.turns):
        text = reasoning_text(turn.text)
        z = tuple(tokenizer.encode(text)) if text else ()
        x = np.array(ep.seen(t), np.int32)  # what the reply was sampled after
        shown = tuple(range(turn.shown_from, t + 1))  # a window's kept turns, or all so far
        turns.append(ReasoningTurn(episode, (tag, int(ep.group_id)), t, x, z, shown))
      episode += 1
  return turns


def step_metrics(turns: Sequence[ReasoningTurn]) -> Dict[str, float]:
  """Every-step reasoning metrics: valid-thinking rate and reasoning lengths (tokens)."""
  if not turns:
    return {}
  lengths = np.array([len(t.reasoning) for t in turns], np.float32)
  valid = lengths > 0
  first = np.array([t.turn == 0 for t in turns])
  out = {
      "collapse/valid_thinking_rate": float(valid.mean()),
      "collapse/first_turn_num_total": float(first.sum()),
      "collapse/first_turn_num_valid": float((first & valid).sum()),
      "collapse/first_turn_valid_rate": float((first & valid).sum() / max(first.sum(), 1)),
      "reasoning_length/mean": float(lengths[valid].mean()) if valid.any() else 0.0,
      "reasoning_length/max": float(lengths.max()),
  }
  return out


@dataclasses.dataclass(frozen=True)
class Sample:
  """A sampled (x, z) set ready for scoring: z_i is scored under every column prompt x_j."""

  reasonings: List[Tuple[int, ...]]  # S reasoning token tuples
  prompts: List[np.ndarray]  # P column contexts
  prompt_index: np.ndarray  # int32 [S], z_i's own column
  column_ids: np.ndarray  # int32 [P], equal for token-identical prompts
  # (episode, turns shown) of each column: its frames in a visual environment
  column_frames: List[Tuple[int, Tuple[int, ...]]] = dataclasses.field(default_factory=list)

  @property
  def num_samples(self) -> int:
    return len(self.reasonings)


def _column_ids(contexts: Sequence[np.ndarray]) -> np.ndarray:
  seen = {}
  return np.array([seen.setdefault(c.tobytes(), len(seen)) for c in contexts], np.int32)


def first_turn_sample(
    turns: Sequence[ReasoningTurn], num_samples: int, rng: np.random.Generator
) -> Sample | None:
  """Valid first turns without replacement; one column per env group present (None if none)."""
  valid = [t for t in turns if t.turn == 0 and t.reasoning]
  if not valid:
    return None
  picks = rng.choice(len(valid), size=min(num_samples, len(valid)), replace=False)
  chosen = [valid[i] for i in sorted(picks)]
  columns: Dict[Tuple[str, int], int] = {}
  contexts: List[np.ndarray] = []
  column_frames = []
  for t in chosen:
    if t.group not in columns:
      columns[t.group] = len(contexts)
      contexts.append(t.context)
      column_frames.append((t.episode, t.shown))  # the group's start state: one frame
    elif not np.array_equal(contexts[columns[t.group]], t.context):
      raise ValueError(
          f"first-turn prompts of group {t.group} differ; a group must share its " "start state"
      )
  return Sample(
      [t.reasoning for t in chosen],
      contexts,
      np.array([columns[t.group] for t in chosen], np.int32),
      _column_ids(contexts),
      column_frames,
  )


def multi_turn_sample(
    turns: Sequence[ReasoningTurn], num_samples: int, rng: np.random.Generator
) -> Sample | None:
  """`num_samples` draws with replacement: an episode, then one of its valid turns."""
  by_episode: Dict[int, List[ReasoningTurn]] = {}
  for t in turns:
    if t.reasoning:
      by_episode.setdefault(t.episode, []).append(t)
  if not by_episode:
    return None
  episodes = sorted(by_episode)
  chosen = []
  for e in rng.choice(len(episodes), size=num_samples, replace=True):
    options = by_episode[episodes[e]]
    chosen.append(options[rng.integers(len(options))])
  contexts = [t.context for t in chosen]
  return Sample(
      [t.reasoning for t in chosen],
      contexts,
      np.arange(len(chosen), dtype=np.int32),
      _column_ids(contexts),
      [(t.episode, t.shown) for t in chosen],
  )

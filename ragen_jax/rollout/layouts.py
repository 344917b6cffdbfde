"""The context layout: what each turn's prompt holds, how it meets the model's KV cache, and the
training rows (`RolloutConfig.context_window`).

    layout = layouts.make(config, tokenizer, env)    # FullContext, or windows.Window
    layout.window                          # Episode.window: None, or the k earlier turns shown
    layout.system_prefix(ep)               # the tokens every prompt of `ep` opens with, cached
    layout.prompt(ep, turn, user)          # episodes.TurnPrompt, or None: the turn cannot fit
    layout.ready_cache(llm, inputs, ids_BxC, mask_BxC, active_B)   # the model's cache
    layout.shown_messages(ep)              # the conversation an endpoint sees
    layout.rows(eps, k, pad_id, failed, use_turn_scores)   # (arrays, token_turns, row_episodes_R)

`FullContext` (below) keeps one append-only sequence per episode: turn t appends only [last
sampled token] + the closing of the last reply + the reward + the new user text, so prefill cost
per turn is the new text, not the whole history, and the training batch holds one sequence per
episode. When an episode's next turn would not fit `max_context` (history + new user turn +
`max_new_tokens`), or one user turn exceeds `max_turn_tokens`, the episode stops before that
turn (never mid-turn) with `context_truncated`. `windows.Window` shows the system message, the
last k turns and the current one, and each turn is its own training row (rollout.windows).

Dimension legend: B episodes, T tokens of a row, C appended chunk length.
"""

from typing import List, Optional

import numpy as np

from ragen_jax import sampling
from ragen_jax.rollout import images
from ragen_jax.rollout import prompts
from ragen_jax.rollout import windows
from ragen_jax.rollout.episodes import empty_rows
from ragen_jax.rollout.episodes import TurnPrompt
from ragen_jax.tokenizers import base as tok_base


def make(config, tokenizer, env, shown=None):
  """The layout `config.context_window` names (`env` may define the windows' memory hook);
  `shown` (rollout.images) encodes the turns' text and images (default: text alone)."""
  shown = images.TextTurns(tokenizer) if shown is None else shown
  if config.window is None:
    return FullContext(tokenizer, config, shown)
  return windows.Window(config.window, tokenizer, config, windows.memory_hook(env), shown)


class FullContext:
  """The whole conversation, one sequence per episode (see the module doc)."""

  window = None  # every earlier turn is shown

  def __init__(self, tokenizer, config, shown):
    self.tok, self.config, self.shown = tokenizer, config, shown

  def system_prefix(self, ep) -> List[int]:
    """Nothing is cached apart: the first prompt opens the episode's own sequence."""
    del ep
    return []

  def prompt(self, ep, turn: int, user: str) -> Optional[TurnPrompt]:
    """The tokens appended before turn `turn`: the first prompt, or [last token] + the closing
    of the last reply + the user message `user` (the reward text opens it). An episode whose
    turn would overflow stops (None)."""
    c, tok = self.config, self.tok
    if turn == 1:
      ep.messages.append({"role": "user", "content": user})
      prompt = tok.apply_chat_template(ep.messages, True, ep.tool_schemas)
      ids = self.shown.encode(prompt + prompts.generation_prefix(c.enable_think))
      if len(ids) + c.max_new_tokens > c.max_context:
        raise ValueError(
            f"the first prompt ({len(ids)} tokens) plus max_new_tokens "
            f"exceeds max_context={c.max_context}"
        )
      return TurnPrompt(ids, ids, len(ids))
    closed = ep.last_token == tok.eos_id
    rest = self.shown.encode(
        ("" if closed else tok_base.IM_END) + "\n" + prompts.user_message(user, c.enable_think)
    )
    history = len(ep.tokens())
    if len(rest) > c.max_turn_tokens or history + len(rest) + c.max_new_tokens > c.max_context:
      ep.done, ep.context_truncated = True, True
      return None
    ep.messages.append({"role": "user", "content": user})
    # The last sampled token is already the previous turn's: the cache appends it, the turn's
    # record does not.
    return TurnPrompt([ep.last_token] + rest, rest, history + len(rest))

  def ready_cache(self, llm, inputs, ids_BxC, mask_BxC, active_B):
    """The chunk extends each row's cache (policies.ModelTurns.grow)."""
    return llm.grow(inputs, ids_BxC, mask_BxC, active_B)

  def shown_messages(self, ep):
    return ep.messages

  def row_turns(self, eps, k: int):
    """(episode, turns shown) of each training row: every turn of the episode's sequence."""
    del k
    return [(i, range(len(ep.turns))) for i, ep in enumerate(eps)]

  def rows(self, eps, k: int, pad_id: int, failed: np.ndarray, use_turn_scores: bool):
    """One left-padded row per episode: ({name: [B, T]}, token_turns_BxT, None)."""
    del k  # a sequence holds every turn
    lists = [ep.arrays(use_turn_scores) for ep in eps]
    width = sampling.bucket(max(max(len(r["tokens"]) for r in lists), 1))
    arrays = empty_rows(len(eps), width, pad_id)
    for i, r in enumerate(lists):
      n = len(r["tokens"])
      if failed[i]:  # no training signal; one attended token keeps attention well defined
        arrays["mask"][i, width - max(n, 1) :] = 1
        arrays["tokens"][i, width - n :] = r["tokens"]
        continue
      for name in ("tokens", "loss", "logprobs", "rewards"):
        arrays[name][i, width - n :] = r[name]
      arrays["mask"][i, width - n :] = 1
    return arrays, _token_turns(eps, width, failed), None


def _token_turns(eps, width: int, failed: np.ndarray) -> np.ndarray:
  """[B, T]: the turn of each sampled token of the sequences (right-aligned rows); -1 elsewhere
  and on a failed episode's row."""
  token_turns_BxT = np.full((len(eps), width), -1, np.int32)
  for i, ep in enumerate(eps):
    if failed[i]:
      continue
    offset = width - len(ep.tokens())
    for j, (turn, start) in enumerate(zip(ep.turns, ep.reply_starts())):
      token_turns_BxT[i, offset + start : offset + start + len(turn.reply)] = j
  return token_turns_BxT

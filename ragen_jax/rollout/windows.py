"""Context windows: each turn's prompt holds the system message, the last k turns and the current
observation, and each turn is its own training row (`RolloutConfig.context_window`).

    rollout.context_window = "last_k"; rollout.window_turns = 5    # RAGEN's 2048 and Lean
    rollout.context_window = "single_turn"                         # k = 0

The prompt of turn t is the chat template of [system, user/assistant messages of turns
max(1, t - k) .. t - 1, the current user message] (as the conversation recorded them), plus the
generation prefix. An environment that defines `memory(history) -> str` (RAGEN's hook) gets the
messages of the turns left out (user and assistant, in order) and its text opens the first user
message shown, standing in for them. When the window does not fit `max_context` with
`max_new_tokens`, its oldest turns leave it (and join the memory) until it does; an episode whose
current turn alone does not fit, or whose user turn exceeds `max_turn_tokens`, stops before the
turn (`context_truncated`), as in full mode.

The KV cache is rebuilt every turn: the system message's slots, prefilled once per batch when
every episode shares it (else once per episode, `policies.ModelTurns`), are copied into an empty
cache and each row's rest of the prompt is prefilled after them. The images of the turns shown
(an environment seen as images) come back from the features kept when each was first shown
(rollout.images): the vision tower runs once per frame. Its size is the window's, not
the episode's: a 200-turn episode needs the cache of a short one.

Training rows (`RolloutBatch.row_episodes_R`): row b·K + j holds turn j of episode b, exactly the
tokens the sampler saw followed by the reply (loss mask on the reply); rows of turns not played
(or of an episode that failed) are empty with one attended padding token. Episode-level arrays
(scores, group ids, the per-turn records) stay per episode; advantages are computed per episode
or per turn and read by each row through `row_episodes_R` (ragen_jax.algos.train_step).

`Window` is this layout of rollout.layouts (the other is the full context).

Dimension legend: B episodes, K turns (max_turns), R = B·K rows, T tokens of a row, P system
tokens.
"""

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ragen_jax import sampling
from ragen_jax.rollout import prompts
from ragen_jax.rollout.episodes import empty_rows
from ragen_jax.rollout.episodes import TurnPrompt

Message = Dict[str, str]
Memory = Callable[[Sequence[Message]], str]


def memory_hook(env) -> Optional[Memory]:
  """The environment's `memory(history) -> str`, or None when it defines none.

  Pure-JAX environments define it as a method (`envs.Env.memory` returns None by default); a
  text environment's class defines it as a static or class method (`HostEnv.memory`).
  """
  hook = getattr(env, "memory", None)
  return hook if callable(hook) else None


class Window:
  """The system message, the last `k` turns and the current one (see the module doc)."""

  def __init__(self, k: int, tokenizer, config, memory: Optional[Memory], shown):
    self.window, self.tok, self.config, self.memory = k, tokenizer, config, memory
    self.shown = shown  # encodes text and the images it marks (rollout.images)

  def system_prefix(self, ep) -> List[int]:
    """The tokens of the episode's system message alone (the prefix its prompts share), or none
    when the chat template does not tokenise it as a prefix of a prompt (each prompt is then
    prefilled whole)."""
    tok = self.tok
    ids = tok.encode(tok.apply_chat_template(ep.messages[:1], False, ep.tool_schemas))
    probe = ep.messages[:1] + [{"role": "user", "content": "?"}]
    return ids if prefix_length(tok.encode_chat(probe, True, ep.tool_schemas), ids) else []

  def prompt(self, ep, turn: int, user: str) -> Optional[TurnPrompt]:
    """The whole prompt of turn `turn` (user message `user`); an episode whose turn cannot fit
    stops before it (None)."""
    c = self.config
    shown = self._fit(ep, user)
    own = self.shown.encode(prompts.user_message(user, c.enable_think))
    if shown is None or len(own) > c.max_turn_tokens:
      if turn == 1:
        raise ValueError(
            f"the first prompt plus max_new_tokens exceeds max_context={c.max_context} (or its "
            f"user turn exceeds max_turn_tokens={c.max_turn_tokens})"
        )
      ep.done, ep.context_truncated = True, True
      return None
    if prefix_length(shown.context, ep.prefix) != len(ep.prefix):
      raise ValueError(
          "the tokenizer's chat template does not render the system message as a prefix of "
          "every prompt, which window modes need (the cached system slots)"
      )
    ep.messages.append({"role": "user", "content": user})
    return shown

  def _fit(self, ep, user: str) -> Optional[TurnPrompt]:
    """The window of the most earlier turns (up to k) that fits `max_context`; None if even the
    current turn alone does not."""
    c, tok, played = self.config, self.tok, len(ep.turns)
    prefix = prompts.generation_prefix(c.enable_think)
    for start in range(max(0, played - self.window), played + 1):
      dropped = ep.messages[1 : 1 + 2 * start]
      text = self.memory(list(dropped)) if self.memory is not None and dropped else ""
      if not isinstance(text, str):
        raise TypeError(
            f"an environment's memory() must return a string, got {type(text).__name__}"
        )
      messages = [dict(m) for m in ep.messages[:1] + ep.messages[1 + 2 * start :]]
      messages.append({"role": "user", "content": user})
      if text:
        messages[1]["content"] = f"{text}\n{messages[1]['content']}"
      ids = self.shown.encode(tok.apply_chat_template(messages, True, ep.tool_schemas) + prefix)
      if len(ids) + c.max_new_tokens <= c.max_context:
        return TurnPrompt(ids[len(ep.prefix) :], ids, len(ids), start, text)
    return None

  def ready_cache(self, llm, inputs, ids_BxC, mask_BxC, active_B):
    """Every turn the model's cache restarts from the system message's slots (prefilled on the
    first turn); the chunk is the rest of each prompt."""
    del active_B  # every row restarts
    if inputs.turn == 1:
      llm.prefill_system(*system_rows(inputs.episodes, llm.rows, self.tok.pad_id))
    llm.restore_system()
    return ids_BxC, mask_BxC

  def shown_messages(self, ep) -> List[Message]:
    """What an endpoint sees: the system message and the last k turns (no memory text)."""
    start = max(0, len(ep.turns) - self.window)
    return ep.messages[:1] + ep.messages[1 + 2 * start :]

  def row_turns(self, eps, k: int):
    """(episode, turns shown) of each training row: row i·K + j shows turns shown_from..j of
    episode i (none for a turn not played)."""
    out = [(i, range(0)) for i in range(len(eps)) for _ in range(k)]
    for i, ep in enumerate(eps):
      for j, turn in enumerate(ep.turns):
        out[i * k + j] = (i, range(turn.shown_from, j + 1))
    return out

  def rows(self, eps, k: int, pad_id: int, failed: np.ndarray, use_turn_scores: bool):
    """A row per turn: ({name: [R, T] array}, token_turns_RxT, row_episodes_R).

    Rewards sit as in the sequence layout: each turn's reward on its last token
    (`use_turn_scores`), else the episode's score on its last turn's last token.
    """
    b = len(eps)
    lengths = [len(t.context) + len(t.reply) for ep in eps for t in ep.turns]
    width = sampling.bucket(max(lengths + [1]))
    r = b * k
    arrays = empty_rows(r, width, pad_id)
    token_turns_RxT = np.full((r, width), -1, np.int32)
    arrays["mask"][:, -1] = 1  # an empty row attends one padding token (attention well defined)
    for i, ep in enumerate(eps):
      if failed[i]:
        continue
      for j, turn in enumerate(ep.turns):
        row, n_ctx, n_reply = i * k + j, len(turn.context), len(turn.reply)
        lo = width - n_ctx - n_reply
        arrays["tokens"][row, lo:] = turn.context + turn.reply
        arrays["mask"][row, lo:] = 1
        arrays["loss"][row, width - n_reply :] = 1
        arrays["logprobs"][row, width - n_reply :] = turn.logprobs
        token_turns_RxT[row, width - n_reply :] = j
        if use_turn_scores:
          arrays["rewards"][row, -1] += turn.reward
        elif j == len(ep.turns) - 1:
          arrays["rewards"][row, -1] += ep.score
    return arrays, token_turns_RxT, np.repeat(np.arange(b, dtype=np.int32), k)


def prefix_length(ids: Sequence[int], system: Sequence[int]) -> int:
  """How many leading tokens of a prompt are the system message's (0 when the template does
  not tokenise it as a prefix; the prompt is then prefilled whole)."""
  n = len(system)
  return n if n < len(ids) and list(ids[:n]) == list(system) else 0


def system_rows(eps, rows, pad_id: int):
  """The episodes' system-message tokens (ids_BxP, mask_BxP), left-padded to a width every
  process agrees on (`rows`: policies.Rows)."""
  (longest,) = rows.agree_max([max((len(ep.prefix) for ep in eps), default=0)])
  width = sampling.bucket(max(longest, 1))
  ids_BxP = np.full((len(eps), width), pad_id, np.int32)
  mask_BxP = np.zeros((len(eps), width), np.int32)
  for i, ep in enumerate(eps):
    if ep.prefix:
      ids_BxP[i, width - len(ep.prefix) :] = ep.prefix
      mask_BxP[i, width - len(ep.prefix) :] = 1
  return ids_BxP, mask_BxP

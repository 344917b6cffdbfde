"""What a rollout is made of: its knobs, the typed host records of episodes and their turns,
and the result derived from them once (ragen_jax.rollout.engine plays them).

Dimension legend: B episodes, T tokens, K turns (max_turns).
"""

import dataclasses
from typing import Annotated, Any, Dict, List, Optional, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from ragen_jax import sampling
from ragen_jax.batch import RolloutBatch
from ragen_jax.batch import TurnBatch
from ragen_jax.config_checks import check_fields, FiniteFloat, PositiveFloat
from ragen_jax.config_checks import NonNegativeInt, OneOf, PositiveInt, Range
from ragen_jax.rollout import prompts
from ragen_jax.rollout import state_keys

# full: one append-only sequence per episode; last_k: the system message, the last k turns
# and the current observation; single_turn: k = 0. In the window modes every turn is its own
# training row (ragen_jax.rollout.windows).
CONTEXT_WINDOWS = ("full", "last_k", "single_turn")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Knobs of the agent loop, RAGEN's defaults (its config/base.yaml and agent_proxy).

  The config's `rollout` section holds every field but `env_groups`, `instruction` and
  `PER_TAG`, which each environment tag sets (its `envs.<tag>` section). The `val_*` fields are
  read by validation (`for_validation`), and the dynamic sampling ones by the training
  collection (train/dynamic_sampling.py), not by the engine.
  """

  env_groups: PositiveInt = 8  # groups; each shares one start state
  group_size: PositiveInt = 16  # episodes per group (sharing a start state)
  max_turns: PositiveInt = 5  # agent turns per episode (agent_proxy.max_turn)
  max_actions_per_turn: PositiveInt = 2  # answer words kept per turn
  max_actions_per_traj: PositiveInt = 10  # action budget of an episode
  action_sep: str = "||"  # separator between actions in <answer>
  format_penalty: FiniteFloat = -0.1  # per turn with a missing tag, unknown or no action
  unchanged_penalty: FiniteFloat = 0.0  # per training turn after which the state reads as
  # before (not RAGEN; validation rewards never carry it)
  enable_think: bool = True  # <think>...</think><answer>...</answer> format
  prompt_style: Annotated[str, OneOf(prompts.PROMPT_STYLES)] = (
      "ragen"  # prompts.PROMPT_STYLES: RAGEN's text, or "compact" (the output
  )
  # rule once in the system message, short user turns)
  max_new_tokens: PositiveInt = 400  # sampled tokens per turn (RAGEN response_length)
  max_context: PositiveInt = 3600  # tokens of a whole conversation (RAGEN max_model_len); with
  # a context window, of one turn's prompt and reply
  max_turn_tokens: PositiveInt = 512  # longest appended user turn (sizes the KV cache slack)
  temperature: PositiveFloat = 1.0  # training rollout temperature (log-probs divide by it)
  top_p: Annotated[float, Range(0, 1, open_low=True)] = 1.0  # nucleus mass (1 = off)
  top_k: NonNegativeInt = 0  # top-k (0 = off)
  render_format: str = "grid"  # grid | coord | grid_coord | image (visual environments)
  max_tokens_hint: PositiveInt = 100  # the prompt's "Max response length: N words (tokens)."
  use_turn_scores: bool = False  # also put each turn's reward on its last token
  instruction: str | None = None  # None: the environment's own (RAGEN's for the built-in ones)
  val_group_size: PositiveInt = 1  # validation episodes per group (pass@k, k = this)
  val_temperature: PositiveFloat = 0.5  # RAGEN's evaluation temperature
  val_batch_groups: PositiveInt = 64  # validation groups played per batch (memory bound)
  context_window: Annotated[str, OneOf(CONTEXT_WINDOWS)] = (
      "full"  # CONTEXT_WINDOWS: what each turn's prompt holds (module doc)
  )
  window_turns: int | None = None  # k of `last_k`: earlier turns a prompt shows
  # DAPO's dynamic sampling (train/dynamic_sampling.py): groups without reward spread are
  # replaced by groups of fresh levels, up to `max_sampling_rounds` rollouts per step and tag
  dynamic_sampling: bool = False
  max_sampling_rounds: Annotated[int, Range(1, 64)] = 3  # rollouts per step and tag, the
  # first included (dynamic_sampling only)

  PER_TAG = ("render_format", "max_actions_per_traj", "max_tokens_hint")

  def __post_init__(self):
    check_fields(self, "rollout")
    if not self.max_context > self.max_new_tokens:
      raise ValueError("rollout.max_context must exceed rollout.max_new_tokens")
    self.window  # pylint: disable=pointless-statement  # validates the window knobs
    if self.dynamic_sampling and self.group_size < 2:
      raise ValueError(
          "rollout.dynamic_sampling needs rollout.group_size >= 2: a group of one episode "
          "never has reward spread"
      )

  @property
  def window(self) -> int | None:
    """Earlier turns each prompt shows: None for the whole conversation (`full`), else k."""
    mode, k = self.context_window, self.window_turns
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
      raise ValueError(f"rollout.window_turns must be an integer >= 0, got {k!r}")
    if mode == "full":
      if k is not None:
        raise ValueError(
            "rollout.window_turns is set but rollout.context_window is 'full' (every turn "
            "sees the whole conversation): set context_window='last_k' or drop window_turns"
        )
      return None
    if mode == "single_turn":
      if k not in (None, 0):
        raise ValueError(
            f"rollout.context_window='single_turn' shows no earlier turn; "
            f"rollout.window_turns={k} contradicts it"
        )
      return 0
    if k is None:
      raise ValueError("rollout.context_window='last_k' needs rollout.window_turns (k >= 0)")
    return k

  @property
  def sampling_rounds(self) -> int:
    """Rollouts a training step may play per tag: 1 without dynamic sampling."""
    return self.max_sampling_rounds if self.dynamic_sampling else 1

  @property
  def cache_slots(self) -> int:
    """KV-cache slots per episode (`cache_slots`)."""
    return cache_slots(self.max_context, self.max_turn_tokens)

  def for_validation(self) -> "RolloutConfig":
    """Validation plays `val_group_size` episodes per group at `val_temperature`, with RAGEN's
    rewards (no training-only shaping), and never samples dynamically (fixed levels)."""
    return dataclasses.replace(
        self,
        group_size=self.val_group_size,
        temperature=self.val_temperature,
        unchanged_penalty=0.0,
        dynamic_sampling=False,
    )


def cache_slots(max_context: int, max_turn_tokens: int) -> int:
  """KV-cache slots the rollout allocates per episode: the one formula that the engine, the
  memory estimate and the hardware variants share.

  A row's history plus its new tokens never exceed `max_context` (rounded up to 256); the
  batch's shared write offset adds at most one user turn in its prefill bucket (at least 256:
  a bucketed first prompt stays within 255 of its size).
  """
  return -(-max_context // 256) * 256 + max(sampling.bucket(max_turn_tokens), 256)


@dataclasses.dataclass
class Turn:
  """One turn of an episode: the tokens the cache saw, and what came of the reply."""

  context: List[int]  # appended before the reply: prompt, or closing + reward + user text
  reply: List[int] = dataclasses.field(default_factory=list)  # sampled tokens
  logprobs: List[float] = dataclasses.field(default_factory=list)  # of the sampled tokens
  actions: Tuple[Any, ...] = ()  # what went to the environment (strings, or one ToolCall)
  penalised: bool = False  # format penalty: missing tag, unknown action or no action
  tool_error: str = ""  # a malformed tool call: what was wrong (shown in the next user turn)
  env_reward: float = 0.0  # sum of the executed actions' rewards
  penalty: float = 0.0  # format penalty
  shaping: float = 0.0  # unchanged-turn penalty (RolloutConfig.unchanged_penalty)
  executed: int = 0
  effective: int = 0
  env_valid: bool = True  # the environment accepted every action (info action_is_valid)
  unchanged: bool = False  # the observation after the turn reads as before it
  text: str = ""  # the reply as its assistant message holds it (generation prefix included)
  state_key: int = 0  # 64-bit key of the state the reply acted from (rollout.state_keys)
  shown_from: int = 0  # window modes: the first earlier turn (0-based) the prompt showed
  memory: str = ""  # window modes: the environment's memory text for the turns left out

  @property
  def reward(self) -> float:
    return self.env_reward + self.penalty + self.shaping

  @property
  def valid(self) -> bool:
    return not self.penalised and self.env_valid


@dataclasses.dataclass(frozen=True)
class TurnPrompt:
  """What a context layout (rollout.layouts) makes of an episode's next turn."""

  chunk: List[int]  # appended to the cache after the episode's cached system tokens
  context: List[int]  # what the turn records before its reply (Turn.context)
  seen: int  # tokens the reply is sampled after (what re-encoding them all would prefill)
  shown_from: int = 0  # window layouts: the first earlier turn shown (0-based)
  memory: str = ""  # window layouts: the memory text standing in for the turns left out


@dataclasses.dataclass
class Episode:
  """Host record of one episode: its conversation and its typed turns (`to_json()`: the JSON
  record written to files)."""

  seed: int  # the level seed (shared by the episode's group)
  messages: List[Dict[str, str]]
  action_names: Optional[Tuple[str, ...]]  # None: free-text answers
  actions_left: int
  max_actions_per_turn: int
  observation: str = ""  # the state text the next user turn shows
  turns: List[Turn] = dataclasses.field(default_factory=list)
  pending: str = ""  # the reward text that opens the next user message
  done: bool = False
  success: bool = False
  context_truncated: bool = False
  env_error: str = ""  # the environment's fault that ended the episode ("" if none)
  group_id: int = 0  # the episode's group (episodes sharing a start state)
  index_in_group: int = 0
  env: str = ""  # the environment tag, where episodes of several are pooled (validation)
  window: Optional[int] = None  # RolloutConfig.window: None, one sequence; k, a row per turn
  prefix: List[int] = dataclasses.field(default_factory=list)  # window modes: system tokens
  env_done: bool = False  # the environment ended the episode (not the turn or action budget)
  tools: Tuple[Any, ...] = ()  # the environment's ragen_jax.envs.tools.Tool records
  tool_result: bool = False  # `observation` is a tool call's result (shown as the template does)
  turn_frames: List[str] = dataclasses.field(default_factory=list)  # visual environments'
  # validation records: each turn's frame, a PNG data URI (rollout.images.record_frames)

  @property
  def tool_schemas(self) -> Optional[List[Dict[str, Any]]]:
    """The tools as the chat template takes them (None without tools)."""
    return [tool.schema() for tool in self.tools] if self.tools else None

  def tokens(self) -> List[int]:
    """The episode's one sequence (full context): every turn's context and reply."""
    return [t for turn in self.turns for t in turn.context + turn.reply]

  def seen(self, j: int) -> List[int]:
    """The tokens turn j's reply was sampled after: the sequence so far, or (window modes) the
    turn's own prompt."""
    if self.window is not None:
      return list(self.turns[j].context)
    return [t for turn in self.turns[:j] for t in turn.context + turn.reply] + self.turns[j].context

  @property
  def last_token(self) -> int:
    """The last token the cache holds for this episode (normally the last sampled one)."""
    for turn in reversed(self.turns):
      if turn.reply or turn.context:
        return (turn.context + turn.reply)[-1]
    raise ValueError("an episode without tokens has no last token")

  @property
  def env_return(self) -> float:
    return sum(t.env_reward for t in self.turns)

  @property
  def penalty(self) -> float:
    return sum(t.penalty for t in self.turns)

  @property
  def score(self) -> float:
    """The episode's training return: env rewards plus format and unchanged-turn penalties."""
    return self.env_return + self.penalty + sum(t.shaping for t in self.turns)

  def arrays(self, use_turn_scores: bool) -> Dict[str, list]:
    """Token-aligned training lists: tokens, loss mask (1 on sampled tokens), log-probs and
    rewards (each turn's on its last token, or the score on the episode's last token)."""
    tokens, loss, logprobs, rewards = [], [], [], []
    for turn in self.turns:
      tokens += turn.context + turn.reply
      loss += [0] * len(turn.context) + [1] * len(turn.reply)
      logprobs += [0.0] * len(turn.context) + list(turn.logprobs)
      rewards += [0.0] * (len(turn.context) + len(turn.reply))
      if use_turn_scores:
        rewards[-1] += turn.reward
    if not use_turn_scores and tokens:
      rewards[-1] += self.score
    return dict(tokens=tokens, loss=loss, logprobs=logprobs, rewards=rewards)

  def reply_starts(self) -> List[int]:
    """Index of each turn's first sampled token in `tokens()`."""
    starts, length = [], 0
    for turn in self.turns:
      starts.append(length + len(turn.context))
      length += len(turn.context) + len(turn.reply)
    return starts

  def to_json(self) -> Dict[str, Any]:
    """The episode's JSON record (a line of `eval/step_<s>.jsonl`; ragen_jax.viewer reads it)."""
    return dict(
        messages=self.messages,
        success=bool(self.success),
        reward=float(self.score),
        turns=len(self.turns),
        group_id=int(self.group_id),
        context_truncated=self.context_truncated,
        turn_rewards=[round(t.reward, 6) for t in self.turns],
        reply_starts=self.reply_starts(),
        **({"env_error": self.env_error} if self.env_error else {}),
        # Window modes: what each turn saw, its first earlier turn shown and its memory text.
        **(
            {"window": self.window, "turn_windows": [[t.shown_from, t.memory] for t in self.turns]}
            if self.window is not None
            else {}
        ),
        env=self.env,
        seed=int(self.seed),
        episode=int(self.index_in_group),
        **({"turn_frames": list(self.turn_frames)} if self.turn_frames else {}),
    )


@dataclasses.dataclass
class RolloutResult:
  batch: RolloutBatch
  metrics: Dict[str, np.ndarray]  # per episode, [B]
  summary: Dict[str, float]  # batch means, pass@group_size, cost counters, timings
  episodes: List[Episode]  # typed host records (Episode.to_json: what files hold)
  # Visual environments (rollout.images): the frame each episode was shown at each turn played,
  # uint8 [K, B, H, W, 3] on the device (episode i's turn t showed frames[t - 1, i]; turns past
  # an episode's own are never shown); else None.
  frames_KxBxHxWx3: Any = None


def to_result(
    eps: List[Episode],
    c: RolloutConfig,
    layout,
    pad_id: int,
    stats: Dict[str, int],
    frames_KxBxHxWx3=None,
):
  """The RolloutResult of a batch's episodes: the training batch in the rows of `layout`
  (rollout.layouts), each row with the frames of the turns it shows (`frames_KxBxHxWx3`: those
  of a visual environment's episodes, column i episode i's; None for text), and metrics."""
  group_ids = np.array([ep.group_id for ep in eps], np.int32)
  scores = np.array([ep.score for ep in eps], np.float32)
  failed = np.array([bool(ep.env_error) for ep in eps])
  # A failed episode trains nothing and moves no group statistic: its group's mean score.
  for g in np.unique(group_ids[failed]):
    healthy = (group_ids == g) & ~failed
    scores[(group_ids == g) & failed] = scores[healthy].mean() if healthy.any() else 0.0
  arrays, token_turns, row_episodes_R = layout.rows(
      eps, c.max_turns, pad_id, failed, c.use_turn_scores
  )
  turns = turn_batch(eps, c.max_turns, failed, token_turns)
  metrics = episode_metrics(eps)
  # A host (numpy) batch: the trainer joins the tags' batches and places the result once.
  batch = RolloutBatch(
      tokens_BxT=arrays["tokens"],
      attention_mask_BxT=arrays["mask"],
      loss_mask_BxT=arrays["loss"],
      logprobs_BxT=arrays["logprobs"],
      token_rewards_BxT=arrays["rewards"],
      group_ids_B=group_ids,
      scores_B=scores,
      turns=turns,
      row_episodes_R=row_episodes_R,
  )
  batch = layout.shown.attach(batch, frames_KxBxHxWx3, layout.row_turns(eps, c.max_turns))
  summary = {name: float(np.mean(v)) for name, v in metrics.items()}
  group_success = metrics["success"].reshape(c.env_groups, c.group_size).max(axis=1)
  summary[f"pass@{c.group_size}"] = float(np.mean(group_success))
  summary.update({k: float(v) for k, v in stats.items()})
  return RolloutResult(batch, metrics, summary, eps, frames_KxBxHxWx3)


def take_episodes(
    results: Sequence[RolloutResult], picks: Sequence[Tuple[int, int]]
) -> Tuple[List[Episode], Any]:
  """The episodes `picks` names ((result, episode) each, in order) and their frames: column j
  of uint8 [K, len(picks), H, W, 3] (on the device) is picked episode j's, K the most turns of
  any result; None when no result has frames. With the picked episodes, `to_result` rebuilds
  what one rollout of those episodes gives: the rows, and the rows' frames."""
  eps = [results[r].episodes[e] for r, e in picks]
  frames = [result.frames_KxBxHxWx3 for result in results]
  shown = [f for f in frames if f is not None]
  if not shown:
    return eps, None
  k, like = max(f.shape[0] for f in shown), shown[0]
  # Turns a result did not play (none at all: no frames) are blank; no row shows them.
  grown = [
      (
          jnp.zeros((k, len(r.episodes)) + like.shape[2:], like.dtype)
          if f is None
          else jnp.pad(f, [(0, k - f.shape[0])] + [(0, 0)] * (f.ndim - 1))
      )
      for f, r in zip(frames, results)
  ]
  starts = np.cumsum([0] + [len(r.episodes) for r in results])
  columns = np.array([starts[r] + e for r, e in picks], np.int32)
  return eps, jnp.concatenate(grown, axis=1)[:, columns]


def empty_rows(rows: int, width: int, pad_id: int) -> Dict[str, np.ndarray]:
  """The token arrays of a batch layout ({name: [rows, width]}), all padding."""
  return {
      "tokens": np.full((rows, width), pad_id, np.int32),
      "mask": np.zeros((rows, width), np.int32),
      "loss": np.zeros((rows, width), np.int32),
      "logprobs": np.zeros((rows, width), np.float32),
      "rewards": np.zeros((rows, width), np.float32),
  }


def turn_batch(eps: List[Episode], k: int, failed: np.ndarray, token_turns) -> TurnBatch:
  """The per-turn records (batch.TurnBatch) of episodes; a failed episode's turns are invalid.
  `token_turns` is the layout's token-to-turn map."""
  b = len(eps)
  rewards_BxK = np.zeros((b, k), np.float32)
  mask_BxK = np.zeros((b, k), np.int32)
  keys_BxK = np.zeros((b, k), np.int32)
  ids = state_keys.dense_ids([[t.state_key for t in ep.turns] for ep in eps])
  for i, ep in enumerate(eps):
    if failed[i]:
      continue
    n = len(ep.turns)
    rewards_BxK[i, :n] = [t.reward for t in ep.turns]
    mask_BxK[i, :n] = 1
    keys_BxK[i, :n] = [ids[t.state_key] for t in ep.turns]
  return TurnBatch(rewards_BxK, mask_BxK, keys_BxK, token_turns)


def episode_metrics(eps: List[Episode]) -> Dict[str, np.ndarray]:
  """Per-episode metrics, [B] each (RAGEN's names; their meaning: rollout.engine's doc)."""

  def per(fn, dtype=np.float32):
    return np.array([fn(ep) for ep in eps], dtype)

  return {
      "success": per(lambda ep: ep.success),
      "num_actions": per(lambda ep: sum(t.executed for t in ep.turns)),
      "action_is_valid": per(lambda ep: sum(t.valid for t in ep.turns) / max(len(ep.turns), 1)),
      "action_is_effective": per(
          lambda ep: sum(t.effective for t in ep.turns) / max(sum(t.executed for t in ep.turns), 1)
      ),
      "turn_unchanged": per(lambda ep: sum(t.unchanged for t in ep.turns) / max(len(ep.turns), 1)),
      "format_penalty": per(lambda ep: ep.penalty),
      "num_turns": per(lambda ep: len(ep.turns)),
      "response_length": per(lambda ep: sum(len(t.reply) for t in ep.turns)),
      "context_truncated": per(lambda ep: ep.context_truncated),
      # Ended by its turn or action budget: neither the environment, the context nor a fault.
      "turn_limit": per(lambda ep: not (ep.env_done or ep.context_truncated or ep.env_error)),
      "env_error": per(lambda ep: bool(ep.env_error)),
      "return": per(lambda ep: ep.score),
  }

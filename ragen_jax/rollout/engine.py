"""RAGEN's multi-turn rollout: env groups played by the LLM over a growing KV cache.

    from ragen_jax import rollout
    engine = rollout.Rollout(env, tokenizer, rollout.RolloutConfig(env_groups=8, group_size=16))
    result = engine.run(rollout.ModelPolicy(model), key, seed=10000)
    result.batch     # ragen_jax.batch.RolloutBatch, one sequence per episode
    result.metrics   # per-episode numpy arrays; result.summary: batch means, pass@k

The loop reads: reset the environments (rollout.env_batch), then per turn prompt (each active
episode's new tokens, as its context layout makes them: rollout.layouts), respond (the policy
the caller built, rollout.policies: the LLM appends them to its cache and decodes until every
row stops, `sampling.extend`; a scripted host policy; or an endpoint), parse the replies, step
the environments (a pure-JAX one in one jitted, vmapped call; text environments concurrently on
the host, rollout.env_batch), then build the batch from the episodes' typed turns.

Environment faults (a text environment that raises, hangs past its step timeout or returns a
non-string observation or a non-finite reward) end that episode only, with `env_error` 1: its
row stays in the batch (static shapes) with loss mask 0 and, so that it moves no group
statistic, its group's mean score. The first fault of each kind is logged with the episode's
seed and traceback.

The cache is never re-encoded: turn t appends only [last sampled token] + the turn-end and new
user text, so prefill cost per turn is the new text, not the whole history (counted in
`summary["prefill_tokens_append"]` vs `["prefill_tokens_reencode"]`), and what every first
prompt shares (the system prompt) is prefilled once for the batch (`policies.ModelTurns`; the
counters count it per row). Text is tokenised per segment (prompt, then each appended user
turn) and the sequence in `batch` is exactly what the cache saw. When a reply ends without
`<|im_end|>` (stopped on `</answer>` or the token cap), the engine appends `<|im_end|>` itself;
those appended tokens, like all user text, have loss mask 0. The trained tokens are exactly the
sampled tokens.

Context (rollout.layouts): when an episode's next turn would not fit `max_context` (history +
new user turn + `max_new_tokens`), or one user turn exceeds `max_turn_tokens`, the episode stops
before that turn (never mid-turn) and `context_truncated` is 1 for it. With a context window
(`RolloutConfig.context_window`, rollout.windows) each turn's prompt is the system message, the
last k turns and the current one instead, prefilled after the cached system slots into an
emptied cache, and the batch holds one row per turn.

Images (rollout.images): an environment that draws its states shows each turn's frame at the
start of the user message to a Qwen2.5-VL policy; the frames are drawn, preprocessed and run
through the vision tower on the device, and the batch carries each row's frames for the update.

Answers: with an action vocabulary, answer words are matched to it ignoring case and the
environment receives the canonical names; without one (free text) the answer, special tokens
stripped and trimmed, goes to `step` as written (split on the separator only when the
environment takes more than one answer per turn).

Tool calls: an environment that declares `tools` (ragen_jax.envs.tools) has them rendered into
its system message by the tokenizer's chat template (`apply_chat_template(..., tools=...)`),
generation also stops at `</tool_call>` (for the whole batch, when any of its episodes declares
tools), and a reply's first `<tool_call>` reaches `step` as a `ToolCall` (rollout.prompts). The
result of a call is the next turn's state, shown in the template's tool-result block
(`<tool_response>\n...\n</tool_response>`) inside the usual user turn; a malformed call costs
the format penalty, steps nothing, and the next user turn says what was wrong after the reward
("Invalid tool call: unknown tool 'x' (the tools are: ...)").

Differences from RAGEN: trained tokens are the raw samples (RAGEN re-tokenises a cleaned
reply); one format penalty per offending turn; an over-long context stops the episode rather
than dropping the oldest turns (which would invalidate the cached keys of every later turn).
Metrics: `action_is_valid` is the share of turns without a format penalty (and, for a text
environment, whose actions it accepted: info `action_is_valid`), `action_is_effective`
the share of executed actions that changed the state, `turn_unchanged` (ours, not RAGEN's) the
share of turns after which the state reads as before: a reply that moved nothing or undid itself,
which a near-greedy policy meeting the same state again tends to repeat until its turns run out.

Multi-process (ragen_jax.distributed): B is the global batch. Each process plays the episodes
in the rows of the mesh its devices hold (`Rollout.rows`; host lists index these local rows);
padded widths and the end of the turn loop are agreed across processes so every process makes
the same jitted calls; environment keys are slices of the global ones, so an episode's result
does not depend on the process count. At the end the episodes are gathered, and every process
returns the same RolloutResult as a single process would.

Dimension legend: G env groups, B = G x group_size episodes, A max actions per turn,
C appended chunk length (bucketed), N max new tokens per turn, S cache capacity, T sequence.
"""

import dataclasses
import time
from typing import Any, Callable, Dict, List

from absl import logging
import jax
import numpy as np

from ragen_jax import distributed
from ragen_jax import sampling
from ragen_jax.envs import tools as tools_lib
from ragen_jax.envs.host.records import EnvFault
from ragen_jax.rollout import env_batch
from ragen_jax.rollout import episodes as episodes_lib
from ragen_jax.rollout import images
from ragen_jax.rollout import layouts
from ragen_jax.rollout import prompts
from ragen_jax.rollout.episodes import Episode
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.rollout.episodes import RolloutResult
from ragen_jax.rollout.episodes import Turn
from ragen_jax.rollout.episodes import TurnPrompt
from ragen_jax.rollout.policies import ScriptedPolicy
from ragen_jax.rollout.policies import TurnInputs
from ragen_jax.tokenizers import base as tok_base

# The rollout's counters (`RolloutResult.summary`), summed over the batch's turns.
COUNTERS = (
    "prefill_tokens_append",
    "prefill_tokens_reencode",
    "prefill_slots",
    "decode_steps",
    "generated_tokens",
)


class Rollout:
  """Plays `env_groups x group_size` episodes of `env` with a policy; see the module doc.

  `env` is a pure-JAX environment (`envs.Env`) or a text environment (`envs.HostEnv`).
  """

  def __init__(self, env, tokenizer: tok_base.Tokenizer, config: RolloutConfig, sharder=None):
    self.env, self.tok, self.config = env, tokenizer, config
    c = config
    self.batch_size = c.env_groups * c.group_size
    # On a mesh (sharding.Sharder) the KV cache is split over episodes and kv heads.
    self.sharder = sharder
    self.rows = (0, self.batch_size)  # [lo, hi): the episodes this process plays
    if sharder is not None:
      sharder.check_batch(
          f"the rollout batch ({c.env_groups} groups x {c.group_size})", self.batch_size
      )
      if sharder.mesh is not None:
        self.rows = distributed.row_range(sharder.named(("batch",)), self.batch_size)
    self.capacity = c.cache_slots
    answer_end = tokenizer.encode("</answer>")
    self.options = sampling.SamplingOptions(
        max_new_tokens=c.max_new_tokens,
        temperature=c.temperature,
        top_p=c.top_p,
        top_k=c.top_k,
        stop_token_ids=(tokenizer.eos_id,),
        stop_sequences=(answer_end,),
        pad_id=tokenizer.pad_id,
    )
    # With tools declared, a reply also ends at its tool call.
    self.tool_options = dataclasses.replace(
        self.options,
        stop_sequences=(answer_end, tuple(tokenizer.encode(tools_lib.TOOL_CALL_CLOSE))),
    )
    self.envs = env_batch.make(env, c, self.batch_size, sharder)
    self.shown = images.make(env, tokenizer)  # what a turn shows beside text (an image?)
    self.layout = layouts.make(c, tokenizer, env, self.shown)  # full, or a window
    self._logged_faults = set()  # fault kinds already logged with a traceback

  def close(self) -> None:
    """Ends a text environment's pool (its threads and worker processes)."""
    self.envs.close()

  # ------------------------------------------------------------------ the loop

  def run(self, policy, key: jax.Array, seed: int) -> RolloutResult:
    """Plays one batch with `policy`; group g starts from the level of seed `seed + g`.

    `policy` is built by the caller: `policies.ModelPolicy(model)` (this process plays its rows
    of the batch), `policies.ScriptedPolicy(fn)` or `api_policy.ApiPolicy(client)` (every
    process plays the whole batch). Reset, then per turn prompt, respond, parse, step; then the
    batch (module doc). Host lists cover the episodes of the policy's rows only.
    """
    c, turns, t_start = self.config, policy.start(self), time.perf_counter()
    rows, timing, stats = turns.rows, {"decode_s": 0.0, "env_s": 0.0}, dict.fromkeys(COUNTERS, 0)
    tic = time.perf_counter()
    starts = self.envs.reset(seed, (rows.lo, rows.hi))
    timing["env_s"] += time.perf_counter() - tic
    eps = [self._open(seed, rows.lo + i, start) for i, start in enumerate(starts)]
    (uses_tools,) = rows.agree_max([int(any(ep.tools for ep in eps))])
    options = self.tool_options if uses_tools else self.options
    turn_steps = []  # decode steps of each turn on this process (the call runs to the max)
    frames_by_turn = []  # each turn's frames of every row (visual environments; on device)
    for turn in range(1, c.max_turns + 1):
      shown = {i: self._prompt(ep, turn) for i, ep in enumerate(eps) if not ep.done}
      shown = {i: p for i, p in shown.items() if p is not None}  # the rest overflowed
      # A process whose episodes have all ended still takes part, with no active row.
      playing, longest = rows.agree_max(
          [int(bool(shown)), max((len(p.chunk) for p in shown.values()), default=0)]
      )
      if not playing:
        break
      tic = time.perf_counter()
      key, sub = jax.random.split(key)
      inputs = self._inputs(turn, shown, longest, eps, stats, options, sub)
      inputs.frames = self.shown.frames(self.envs)  # pylint: disable=assignment-from-none
      frames_by_turn.append(inputs.frames)
      replies = turns.respond(inputs)
      timing["decode_s"] += time.perf_counter() - tic
      turn_steps.append(int(replies.lengths_B.max()))
      stats["generated_tokens"] += int(replies.lengths_B.sum())
      actions = {}
      for i, prompt in shown.items():
        if i in replies.faults:  # the policy could not answer: the episode fails
          self._fault(eps[i], replies.faults[i])
          eps[i].done = True
          continue
        n = int(replies.lengths_B[i])
        reply_N, logprobs_N = replies.tokens_BxN[i, :n], replies.logprobs_BxN[i, :n]
        actions[i] = self._reply(eps[i], prompt, reply_N, logprobs_N)
      tic = time.perf_counter()
      for i, state_key in self.envs.state_keys(list(actions)).items():
        eps[i].turns[-1].state_key = state_key  # the state the reply acts from (GiGPO)
      key, sub = jax.random.split(key)
      for i, outcome in self.envs.step(actions, sub).items():
        self._outcome(eps[i], outcome, turn)
      timing["env_s"] += time.perf_counter() - tic

    eps, stats, turn_steps = rows.gather(eps, stats, turn_steps)
    stats["decode_steps"] = sum(turn_steps)
    frames_KxBxHxWx3 = self.shown.stack(frames_by_turn)  # pylint: disable=assignment-from-none
    result = episodes_lib.to_result(eps, c, self.layout, self.tok.pad_id, stats, frames_KxBxHxWx3)
    total = time.perf_counter() - t_start
    host = total - timing["decode_s"] - timing["env_s"]
    result.summary.update(timing, total_s=total, host_s=host)
    return result

  def run_scripted(
      self, policy: Callable[[Any, Episode], str], key: jax.Array, seed: int
  ) -> RolloutResult:
    """`run(policies.ScriptedPolicy(policy), key, seed)`: a host-side
    `policy(state, episode) -> reply text` plays the batch.

    The reply is the text after the generation prefix (e.g. "...</think><answer>Up</answer>");
    it is tokenised and recorded exactly as sampled tokens would be (log-probs 0), so the
    batch is a supervised demonstration in the rollout's own format (see ragen_jax.warm_start.sft).
    `state` is the episode's unbatched host state; for a text environment, the `Plan` of its
    own `expert()` when it has one, else its last observation (rollout.env_batch).
    Every process plays the whole batch: a scripted policy draws from its own host random
    generator in episode order, so splitting the episodes would change the draws; no model
    runs, so the repeated work is cheap.
    """
    return self.run(ScriptedPolicy(policy), key, seed)

  # ------------------------------------------------------------------ the steps of a turn

  def _open(self, seed: int, index: int, start) -> Episode:
    """Episode `index` of the batch (its group plays the level of seed `seed + group`), with
    its system prompt (or ended by the reset's fault)."""
    c = self.config
    group, member = divmod(index, c.group_size)
    place = dict(group_id=group, index_in_group=member)
    if isinstance(start, EnvFault):
      ep = Episode(seed + group, [], None, c.max_actions_per_traj, 1, done=True, **place)
      self._fault(ep, start)
      return ep
    names = None if start.action_names is None else tuple(start.action_names)
    per_turn = start.max_actions_per_turn or (c.max_actions_per_turn if names else 1)
    system = prompts.system_prompt(
        c.instruction if c.instruction is not None else start.instruction,
        self.envs.legend,
        names,
        c.max_actions_per_traj,
        c.action_sep,
        c.enable_think,
        c.max_tokens_hint,
        c.prompt_style,
        bool(start.tools),
    )
    ep = Episode(
        seed + group,
        [{"role": "system", "content": system}],
        names,
        c.max_actions_per_traj,
        per_turn,
        observation=start.observation,
        window=self.layout.window,
        tools=start.tools,
        **place,
    )
    ep.prefix = self.layout.system_prefix(ep)
    return ep

  def _user_turn(self, ep: Episode, turn: int) -> str:
    c = self.config
    state = tok_base.tool_response(ep.observation) if ep.tool_result else ep.observation
    return prompts.turn_prompt(
        turn,
        state,
        ep.actions_left,
        c.enable_think,
        c.max_tokens_hint,
        c.prompt_style,
        bool(ep.tools),
    )

  def _prompt(self, ep: Episode, turn: int) -> TurnPrompt | None:
    """The episode's next turn as its context layout makes it (the reward text of the last turn
    opens the user message, then its image, if any); None: the turn cannot fit and the episode
    stops before it."""
    return self.layout.prompt(ep, turn, ep.pending + self.shown.mark(self._user_turn(ep, turn)))

  def _inputs(
      self, turn: int, shown: Dict[int, TurnPrompt], longest: int, eps, stats, options, key
  ):
    """The turn's request (TurnInputs): the appended chunks, left-padded to the bucket of
    `longest`, the longest chunk of any process."""
    b = len(eps)
    width = sampling.bucket(longest)
    ids_BxC = np.full((b, width), self.tok.pad_id, np.int32)
    mask_BxC = np.zeros((b, width), np.int32)
    active_B = np.zeros((b,), bool)
    for i, prompt in shown.items():
      chunk = prompt.chunk
      ids_BxC[i, width - len(chunk) :] = chunk
      mask_BxC[i, width - len(chunk) :] = 1
      active_B[i] = True
      stats["prefill_tokens_append"] += len(chunk)
      stats["prefill_tokens_reencode"] += prompt.seen  # what prefilling it all would cost
    stats["prefill_slots"] += self.batch_size * width
    return TurnInputs(turn, ids_BxC, mask_BxC, active_B, eps, self.envs.states, key, options)

  def _reply(self, ep: Episode, prompt: TurnPrompt, tokens_N, logprobs_N) -> List[str]:
    """Records the reply as a new turn; returns the actions it names (canonical names, or the
    free-text answers), within the episode's action budget."""
    c = self.config
    reply = prompts.generation_prefix(c.enable_think) + self.tok.decode(tokens_N)
    turn = Turn(
        list(prompt.context),
        tokens_N.tolist(),
        logprobs_N.tolist(),
        text=reply,
        shown_from=prompt.shown_from,
        memory=prompt.memory,
    )
    ep.turns.append(turn)
    ep.messages.append({"role": "assistant", "content": reply})
    tool = prompts.parse_tool_call(reply, ep.tools, c.enable_think) if ep.tools else None
    if tool is not None:  # one call a turn; a malformed one steps nothing
      turn.penalised, turn.tool_error = tool.call is None, tool.error
      turn.actions = (tool.call,) if tool.call is not None and ep.actions_left > 0 else ()
      return list(turn.actions)
    free = ep.action_names is None
    sep = "" if free and ep.max_actions_per_turn == 1 else c.action_sep
    parsed = prompts.parse_response(reply, c.enable_think, sep, ep.max_actions_per_turn)
    if free:
      actions, invalid = list(parsed.actions), 0
    else:
      indices, invalid = prompts.match_actions(parsed.actions, ep.action_names)
      actions = [ep.action_names[j] for j in indices]
    turn.penalised = prompts.turn_penalised(parsed, invalid)
    turn.actions = tuple(actions[: ep.actions_left])
    return list(turn.actions)

  def _outcome(self, ep: Episode, outcome, turn_number: int) -> None:
    """Records what the environment made of the turn's actions."""
    c, turn = self.config, ep.turns[-1]
    if isinstance(outcome, EnvFault):
      self._fault(ep, outcome)
      ep.done = True
      return
    turn.unchanged = outcome.observation == ep.observation
    turn.env_reward = outcome.reward
    turn.penalty = c.format_penalty if turn.penalised else 0.0
    turn.shaping = c.unchanged_penalty if turn.unchanged else 0.0
    turn.executed, turn.effective, turn.env_valid = (
        outcome.executed,
        outcome.effective,
        outcome.valid,
    )
    ep.actions_left -= outcome.executed
    ep.success |= outcome.success
    ep.env_done = bool(outcome.done)
    ep.done = outcome.done or ep.actions_left <= 0 or turn_number == c.max_turns
    # RAGEN shows the format penalty in the reward text when no valid action was made.
    shown = outcome.reward + (c.format_penalty if not turn.actions else 0.0)
    ep.pending = prompts.reward_prompt(shown)
    if turn.tool_error:
      ep.pending += prompts.tool_error_text(turn.tool_error)
    if not ep.done:
      ep.observation = outcome.observation
      if outcome.executed:
        ep.tool_result = any(isinstance(a, tools_lib.ToolCall) for a in turn.actions)

  def _fault(self, ep: Episode, fault) -> None:
    ep.env_error = f"{fault.kind}: {fault.message}"
    if fault.kind not in self._logged_faults:
      self._logged_faults.add(fault.kind)
      logging.warning(
          "environment %s: the episode of seed %d failed (%s; its episode ends, the run goes "
          "on; further faults of this kind are counted in env_error, not logged)\n%s",
          getattr(self.env, "name", self.env),
          ep.seed,
          ep.env_error,
          fault.traceback,
      )

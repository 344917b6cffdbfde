"""RAGEN's multi-turn rollout: env groups played by the LLM over a growing KV cache.

    from ragen_jax import rollout
    engine = rollout.Rollout(env, tokenizer, rollout.RolloutConfig(env_groups=8, group_size=16))
    result = engine.run(model, key, seed=10000)
    result.batch     # ragen_jax.batch.RolloutBatch, one sequence per episode
    result.metrics   # per-episode numpy arrays; result.summary: batch means, pass@k

Per turn: (host) build each active episode's new tokens, (device) compact the cache and append
them, then decode until every row stops (`sampling.extend`), (host) decode and parse the
replies, (device) step all episodes' actions in one jitted, vmapped call, (host) render.

The cache is never re-encoded: turn t appends only [last sampled token] + the turn-end and new
user text, so prefill cost per turn is the new text, not the whole history (counted in
`summary["prefill_tokens_append"]` vs `["prefill_tokens_reencode"]`). Text is tokenised per
segment (prompt, then each appended user turn) and the sequence in `batch` is exactly what the
cache saw. When a reply ends without `<|im_end|>` (stopped on `</answer>` or the token cap), the
engine appends `<|im_end|>` itself; those appended tokens, like all user text, have loss mask 0.
The trained tokens are exactly the sampled tokens.

Context: when an episode's next turn would not fit `max_context` (history + new user turn +
`max_new_tokens`), or one user turn exceeds `max_turn_tokens`, the episode stops before that
turn (never mid-turn) and `context_truncated` is 1 for it.

Differences from RAGEN: trained tokens are the raw samples (RAGEN re-tokenises a cleaned
reply); one format penalty per offending turn; an over-long context stops the episode rather
than dropping the oldest turns (which would invalidate the cached keys of every later turn).
Metrics: `action_is_valid` is the share of turns without a format penalty, `action_is_effective`
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

import time
from typing import Any, Callable, Dict, List

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import distributed
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax.batch import RolloutBatch
from ragen_jax.rollout import prompts
from ragen_jax.rollout.episodes import Episode
from ragen_jax.rollout.episodes import env_functions
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.rollout.episodes import RolloutResult
from ragen_jax.tokenizers import base as tok_base


def row(tree, i: int):
  """Episode i of a host pytree of batched arrays."""
  return jax.tree.map(lambda x: x[i], tree)


class Rollout:
  """Plays `env_groups x group_size` episodes of `env` with an LLM; see the module doc."""

  def __init__(self, env, tokenizer: tok_base.Tokenizer, config: RolloutConfig, sharder=None):
    self.env, self.tok, self.config = env, tokenizer, config
    c = config
    self.batch_size = c.env_groups * c.group_size
    # On a mesh (sharding.Sharder) the KV cache is split over episodes and kv heads. The
    # environments are host-sized work: they stay on this process's first device, and their
    # keys are copied there (jit refuses arguments committed to different device sets).
    self.sharder = sharder
    self.rows = (0, self.batch_size)  # [lo, hi): the episodes this process plays
    if sharder is not None:
      sharder.check_batch(
          f"the rollout batch ({c.env_groups} groups x {c.group_size})", self.batch_size
      )
      if sharder.mesh is not None:
        self.rows = distributed.row_range(sharder.named(("batch",)), self.batch_size)
    # Processes share the batch (each its rows); otherwise every process plays every episode.
    self._split = self.rows != (0, self.batch_size)
    # History + new tokens of a row never exceed max_context; the shared write offset adds at
    # most one bucketed user turn (and a bucketed first prompt stays within 255 of its size).
    self.capacity = -(-c.max_context // 256) * 256 + max(sampling.bucket(c.max_turn_tokens), 256)
    answer_end = tokenizer.encode("</answer>")
    self.options = sampling.sampling_options(
        max_new_tokens=c.max_new_tokens,
        temperature=c.temperature,
        top_p=c.top_p,
        top_k=c.top_k,
        stop_token_ids=(tokenizer.eos_id,),
        stop_sequences=(answer_end,),
        pad_id=tokenizer.pad_id,
    )
    self._reset, self._step = env_functions(env)
    self.instruction = (
        prompts.env_instruction(env, c.render_format) if c.instruction is None else c.instruction
    )
    self._legend = env.grid_vocab if c.render_format != "coord" else {}

  # ------------------------------------------------------------------ host helpers

  def _render(self, host_states, b: int) -> str:
    return self.env.render(row(host_states, b), self.config.render_format)

  def _user_turn(self, ep: Episode, turn: int, state_text: str) -> str:
    return prompts.turn_prompt(
        turn, state_text, ep.actions_left, self.config.enable_think, self.config.max_tokens_hint
    )

  def _chunk(self, ep: Episode, reward_text: str, user_text: str) -> List[int]:
    """Tokens appended before turn t > 1: close the reply, the user turn, the new header."""
    closed = ep.tokens[ep.last_reply_end] == self.tok.eos_id
    text = ("" if closed else tok_base.IM_END) + f"\n{tok_base.IM_START}user\n" + reward_text
    text += (
        user_text
        + f"{tok_base.IM_END}\n{tok_base.IM_START}assistant\n"
        + prompts.generation_prefix(self.config.enable_think)
    )
    return self.tok.encode(text)

  # ------------------------------------------------------------------ the loop

  def run(self, model: models.Qwen2, key: jax.Array, seed: int) -> RolloutResult:
    """Plays one batch with `model`; group g starts from the level of seed `seed + g`."""
    c, b = self.config, self.batch_size
    graphdef, params = nnx.split(model)
    cache = models.init_cache(model.config, b, self.capacity)
    if self.sharder is not None:
      cache = jax.device_put(cache, self.sharder.cache(cache))

    def respond(turn, ids_BxC, mask_BxC, active_B, host, eps, key):
      del host, eps
      nonlocal cache
      # This process's rows -> the global batch (unchanged on a single process).
      ids_BxC, mask_BxC, active_B = (self._global(x) for x in (ids_BxC, mask_BxC, active_B))
      if turn > 1:
        cache = sampling.compact(cache, jnp.asarray(active_B))
      # The context check guarantees the fit; extend() raises loudly otherwise.
      window = sampling.window_for(
          int(cache.end_index) + ids_BxC.shape[1] + c.max_new_tokens, self.capacity
      )
      out, cache = sampling.extend(
          graphdef,
          params,
          cache,
          ids_BxC,
          mask_BxC,
          jnp.asarray(active_B),
          key,
          window=window,
          **self.options,
      )
      return distributed.local_rows(out, *self.rows)

    return self._play(respond, key, seed, self.rows)

  def run_scripted(
      self, policy: Callable[[Any, Episode], str], key: jax.Array, seed: int
  ) -> RolloutResult:
    """Plays one batch with a host-side `policy(state, episode) -> reply text`.

    The reply is the text after the generation prefix (e.g. "...</think><answer>Up</answer>");
    it is tokenised and recorded exactly as sampled tokens would be (log-probs 0), so the
    batch is a supervised demonstration in the rollout's own format (see ragen_jax.train.sft).
    `state` is the episode's unbatched host state. Every process plays the whole batch: a
    scripted policy draws from its own host random generator in episode order, so splitting the
    episodes would change the draws; no model runs, so the repeated work is cheap.
    """
    c, tok = self.config, self.tok

    def respond(turn, ids_BxC, mask_BxC, active_B, host, eps, key):
      del turn, ids_BxC, mask_BxC, key
      replies = {i: tok.encode(policy(row(host, i), eps[i])) for i in np.flatnonzero(active_B)}
      width = max(max((len(r) for r in replies.values()), default=1), 1)
      if width > c.max_new_tokens:
        raise ValueError(
            f"a scripted reply has {width} tokens, more than max_new_tokens=" f"{c.max_new_tokens}"
        )
      tokens_BxN = np.full((len(active_B), width), tok.pad_id, np.int32)
      lengths_B = np.zeros((len(active_B),), np.int32)
      for i, reply in replies.items():
        tokens_BxN[i, : len(reply)] = reply
        lengths_B[i] = len(reply)
      return tokens_BxN, np.zeros(tokens_BxN.shape, np.float32), lengths_B

    return self._play(respond, key, seed, (0, self.batch_size))

  def _global(self, x_local):
    """A [local rows, ...] host array as the global [B, ...] batch array (split runs only)."""
    if not self._split:
      return x_local
    axes = ("batch",) + (None,) * (np.ndim(x_local) - 1)
    return distributed.global_rows(x_local, self.sharder.named(axes), self.batch_size)

  def _play(self, respond, key: jax.Array, seed: int, rows: tuple) -> RolloutResult:
    """The agent loop; `respond(turn, ids_BxC, mask_BxC, active_B, host_states, episodes, key)`
    returns the replies as numpy (tokens_BxN, logprobs_BxN, lengths_B).

    Host-side arrays and lists cover the episodes `rows` = [lo, hi) only (b of them): this
    process's share of a split batch, or the whole batch.
    """
    c, tok = self.config, self.tok
    lo, hi = rows
    b = hi - lo
    split = b != self.batch_size
    t_start = time.perf_counter()
    timing = {"decode_s": 0.0, "env_s": 0.0}

    tic = time.perf_counter()
    group_keys = jax.vmap(jax.random.key)(seed + jnp.arange(c.env_groups))
    to_env = (lambda k: k) if self.sharder is None else distributed.local_copy
    reset_keys = jnp.repeat(group_keys, c.group_size, axis=0)
    states = self._reset(reset_keys[lo:hi])
    host = jax.device_get(states)
    texts = [self._render(host, i) for i in range(b)]
    names = [tuple(self.env.action_names_for(row(host, i))) for i in range(b)]
    timing["env_s"] += time.perf_counter() - tic

    eps: List[Episode] = []
    chunks: List[List[int]] = []
    for i in range(b):
      system = prompts.system_prompt(
          self.instruction, self._legend, names[i], c.max_actions_per_traj, c.action_sep
      )
      ep = Episode(
          [], [], [], [], [{"role": "system", "content": system}], names[i], c.max_actions_per_traj
      )
      user = self._user_turn(ep, 1, texts[i])
      ep.messages.append({"role": "user", "content": user})
      prompt = tok.apply_chat_template(ep.messages, add_generation_prompt=True)
      chunks.append(tok.encode(prompt + prompts.generation_prefix(c.enable_think)))
      if len(chunks[-1]) + c.max_new_tokens > c.max_context:
        raise ValueError(
            f"the first prompt ({len(chunks[-1])} tokens) plus max_new_tokens "
            f"exceeds max_context={c.max_context}"
        )
      eps.append(ep)
    stats = dict(
        prefill_tokens_append=0,
        prefill_tokens_reencode=0,
        prefill_slots=0,
        decode_steps=0,
        generated_tokens=0,
    )
    turn_steps = []  # decode steps of each turn on this process (the call runs to the max)
    pending = [""] * b  # the reward text that opens the next user message
    for turn in range(1, c.max_turns + 1):
      active = [i for i in range(b) if not eps[i].done]
      if turn > 1:
        for i in active:  # build the appended tokens; stop episodes that would overflow
          ep = eps[i]
          user = self._user_turn(ep, turn, texts[i])
          chunk = self._chunk(ep, pending[i], user)
          if (
              len(chunk) > c.max_turn_tokens
              or len(ep.tokens) + len(chunk) + c.max_new_tokens > c.max_context
          ):
            ep.done, ep.context_truncated = True, True
            continue
          ep.messages.append({"role": "user", "content": pending[i] + user})
          chunks[i] = [ep.tokens[ep.last_reply_end]] + chunk
        active = [i for i in range(b) if not eps[i].done]
      # Every process must agree on whether to go on and on the padded width (same calls, same
      # shapes); a process whose episodes have all ended still takes part, with no active row.
      playing, longest = (int(bool(active)), max((len(chunks[i]) for i in active), default=0))
      if split:
        playing, longest = distributed.agree_max([playing, longest])
      if not playing:
        break
      width = sampling.bucket(longest)
      ids_BxC = np.full((b, width), tok.pad_id, np.int32)
      mask_BxC = np.zeros((b, width), np.int32)
      active_B = np.zeros((b,), bool)
      for i in active:
        ids_BxC[i, width - len(chunks[i]) :] = chunks[i]
        mask_BxC[i, width - len(chunks[i]) :] = 1
        active_B[i] = True
        stats["prefill_tokens_append"] += len(chunks[i])
        stats["prefill_tokens_reencode"] += len(eps[i].tokens) + len(chunks[i]) - (turn > 1)
      stats["prefill_slots"] += self.batch_size * width

      tic = time.perf_counter()
      key, sub = jax.random.split(key)
      tokens_BxN, logprobs_BxN, lengths_B = respond(
          turn, ids_BxC, mask_BxC, active_B, host, eps, sub
      )
      timing["decode_s"] += time.perf_counter() - tic
      turn_steps.append(int(lengths_B.max()))
      stats["generated_tokens"] += int(lengths_B.sum())

      actions_BxA = np.full((b, c.max_actions_per_turn), -1, np.int32)
      penalised, no_valid = {}, {}
      for i in active:
        ep, n = eps[i], int(lengths_B[i])
        new = chunks[i][1:] if turn > 1 else chunks[i]
        ep.reply_starts.append(len(ep.tokens) + len(new))
        ep.tokens += new + tokens_BxN[i, :n].tolist()
        ep.loss += [0] * len(new) + [1] * n
        ep.logprobs += [0.0] * len(new) + logprobs_BxN[i, :n].tolist()
        ep.rewards += [0.0] * (len(new) + n)
        ep.last_reply_end = len(ep.tokens) - 1
        reply = prompts.generation_prefix(c.enable_think) + tok.decode(tokens_BxN[i, :n])
        ep.messages.append({"role": "assistant", "content": reply})
        parsed = prompts.parse_response(reply, c.enable_think, c.action_sep, c.max_actions_per_turn)
        indices, invalid = prompts.match_actions(parsed.actions, ep.action_names)
        penalised[i] = prompts.turn_penalised(parsed, invalid)
        no_valid[i] = not indices
        run = indices[: ep.actions_left]
        actions_BxA[i, : len(run)] = run

      tic = time.perf_counter()
      key, sub = jax.random.split(key)
      states, reward_B, n_exec_B, n_eff_B, success_B = self._step(
          states, actions_BxA, to_env(sub), offset=lo, total=self.batch_size
      )
      host, reward_B, n_exec_B, n_eff_B, success_B = jax.device_get(
          (states, reward_B, n_exec_B, n_eff_B, success_B)
      )
      env_done = np.asarray(host.done)
      for i in active:
        ep = eps[i]
        after = self._render(host, i)
        unchanged = after == texts[i]
        ep.unchanged_turns += unchanged
        penalty = c.format_penalty if penalised[i] else 0.0
        shaping = c.unchanged_penalty if unchanged else 0.0
        ep.turns += 1
        ep.env_return += float(reward_B[i])
        ep.penalty += penalty
        ep.shaping += shaping
        turn_reward = float(reward_B[i]) + penalty + shaping
        ep.turn_rewards.append(round(turn_reward, 6))
        ep.num_actions += int(n_exec_B[i])
        ep.num_effective += int(n_eff_B[i])
        ep.valid_turns += not penalised[i]
        ep.actions_left -= int(n_exec_B[i])
        ep.success |= bool(success_B[i])
        if c.use_turn_scores:
          ep.rewards[-1] += turn_reward
        ep.done = bool(env_done[i]) or ep.actions_left <= 0 or turn == c.max_turns
        # RAGEN shows the format penalty in the reward text when no valid action was made.
        shown = float(reward_B[i]) + (c.format_penalty if no_valid[i] else 0.0)
        pending[i] = prompts.reward_prompt(shown)
        if not ep.done:
          texts[i] = after
      timing["env_s"] += time.perf_counter() - tic

    if split:
      eps, stats, turn_steps = self._gather(rows, eps, stats, turn_steps)
    stats["decode_steps"] = sum(turn_steps)
    result = self._finish(eps, stats)
    total = time.perf_counter() - t_start
    result.summary.update(timing)
    result.summary["total_s"] = total
    result.summary["host_s"] = total - timing["decode_s"] - timing["env_s"]
    return result

  # ------------------------------------------------------------------ outputs

  def _gather(self, rows: tuple, eps: List[Episode], stats: Dict[str, int], turn_steps: List[int]):
    """Every process's episodes in batch order, with the counters of the whole batch."""
    parts = distributed.allgather((rows, eps, stats, turn_steps))
    by_rows = {}
    for part_rows, part_eps, part_stats, part_steps in parts:
      by_rows.setdefault(tuple(part_rows), (part_eps, part_stats, part_steps))  # replicas agree
    eps, steps, stats = [], [], dict(stats)
    for name in ("prefill_tokens_append", "prefill_tokens_reencode", "generated_tokens"):
      stats[name] = sum(p[1][name] for p in by_rows.values())
    for (lo, hi), (part_eps, _, part_steps) in sorted(by_rows.items()):
      if lo != len(eps):
        raise RuntimeError(
            f"gathered episodes do not tile the batch: rows {lo}..{hi} after " f"{len(eps)}"
        )
      eps += part_eps
      steps.append(part_steps)
    if len(eps) != self.batch_size:
      raise RuntimeError(f"gathered {len(eps)} episodes of {self.batch_size}")
    # Every process ran the same number of turns; a turn's decode ran to the longest reply.
    return eps, stats, [max(s) for s in zip(*steps)]

  def _finish(self, eps: List[Episode], stats: Dict[str, int]) -> RolloutResult:
    c, b = self.config, self.batch_size
    for ep in eps:
      if not c.use_turn_scores:
        ep.rewards[ep.last_reply_end] += ep.score
    width = sampling.bucket(max(len(ep.tokens) for ep in eps))
    arrays = {
        name: np.zeros((b, width), dtype)
        for name, dtype in (
            ("tokens", np.int32),
            ("mask", np.int32),
            ("loss", np.int32),
            ("logprobs", np.float32),
            ("rewards", np.float32),
        )
    }
    arrays["tokens"][:] = self.tok.pad_id
    for i, ep in enumerate(eps):
      n = len(ep.tokens)
      for name, values in (
          ("tokens", ep.tokens),
          ("loss", ep.loss),
          ("logprobs", ep.logprobs),
          ("rewards", ep.rewards),
      ):
        arrays[name][i, width - n :] = values
      arrays["mask"][i, width - n :] = 1
    group_ids = np.repeat(np.arange(c.env_groups, dtype=np.int32), c.group_size)
    metrics = {
        "success": np.array([ep.success for ep in eps], np.float32),
        "num_actions": np.array([ep.num_actions for ep in eps], np.float32),
        "action_is_valid": np.array([ep.valid_turns / max(ep.turns, 1) for ep in eps], np.float32),
        "action_is_effective": np.array(
            [ep.num_effective / max(ep.num_actions, 1) for ep in eps], np.float32
        ),
        "turn_unchanged": np.array(
            [ep.unchanged_turns / max(ep.turns, 1) for ep in eps], np.float32
        ),
        "format_penalty": np.array([ep.penalty for ep in eps], np.float32),
        "num_turns": np.array([ep.turns for ep in eps], np.float32),
        "response_length": np.array([sum(ep.loss) for ep in eps], np.float32),
        "context_truncated": np.array([ep.context_truncated for ep in eps], np.float32),
        "return": np.array([ep.score for ep in eps], np.float32),
    }
    # A host (numpy) batch: the trainer joins the tags' batches and places the result once.
    batch = RolloutBatch(
        tokens_BxT=arrays["tokens"],
        attention_mask_BxT=arrays["mask"],
        loss_mask_BxT=arrays["loss"],
        logprobs_BxT=arrays["logprobs"],
        token_rewards_BxT=arrays["rewards"],
        group_ids_B=group_ids,
        scores_B=metrics["return"].copy(),
    )
    summary = {name: float(np.mean(v)) for name, v in metrics.items()}
    group_success = metrics["success"].reshape(c.env_groups, c.group_size).max(axis=1)
    summary[f"pass@{c.group_size}"] = float(np.mean(group_success))
    summary.update({k: float(v) for k, v in stats.items()})
    episodes = [
        dict(
            messages=ep.messages,
            success=bool(ep.success),
            reward=float(ep.score),
            turns=ep.turns,
            group_id=int(group_ids[i]),
            context_truncated=ep.context_truncated,
            turn_rewards=ep.turn_rewards,
            reply_starts=ep.reply_starts,
        )
        for i, ep in enumerate(eps)
    ]
    return RolloutResult(batch, metrics, summary, episodes)

"""The rollout batch: what the rollout engine produces and the StarPO update consumes.

Dimensions:
  B: rows of the token arrays: episodes (env_groups x group_size), one sequence each; with a
     context window (`rollout.context_window`), R = episodes x K rows, one per turn
     (`row_episodes_R`), while the episode arrays (`group_ids_B`, `scores_B`, `turns`) keep one
     entry per episode.
  T: tokens of a row (the whole conversation, or one turn's prompt and reply), left-padded.
  K: turns of an episode (rollout.max_turns), played turns first.

Token conventions (shared by rollout, advantages and losses):
  * `logprobs_BxT[b, t]` is log p(tokens[b, t] | tokens[b, :t]): the value sits at the position of
    the token it scores, so it is predicted by the logits at position t - 1.
  * `loss_mask_BxT` is 1 exactly on sampled assistant tokens (the trained tokens); prompts,
    environment observations inserted between turns and padding are 0.
  * `token_rewards_BxT` is zero except where the rollout placed rewards: the episode return on the
    last assistant token (optionally each turn's reward on that turn's last token).
"""

from flax import struct
import jax


@struct.dataclass
class TurnBatch:
  """Per-turn records of each episode, for turn-level credit (GiGPO). Indexed by turn, not by
  token, so a layout with one training row per turn reads the same arrays."""

  rewards_BxK: jax.Array  # float32, each turn's reward (environment + penalties); sums to score
  mask_BxK: jax.Array  # int32, 1 on the played turns of episodes without an environment fault
  state_keys_BxK: jax.Array  # int32, the state before the turn's action: equal keys in one
  # env group <=> identical states (of JAX states or text observations; 0 on invalid turns)
  token_turns_BxT: jax.Array  # int32 (rows x T), the turn of each sampled token (K indices);
  # -1 elsewhere


@struct.dataclass
class RolloutBatch:
  """One sequence per episode. The rollout engine returns it with numpy arrays (a host batch);
  the trainer joins the tags' batches and places the result on the devices once."""

  tokens_BxT: jax.Array  # int32 token ids, left-padded
  attention_mask_BxT: jax.Array  # int32, 0 on left padding
  loss_mask_BxT: jax.Array  # int32, 1 on sampled assistant tokens
  logprobs_BxT: jax.Array  # float32, behaviour-policy log-prob of each sampled token
  token_rewards_BxT: jax.Array  # float32, rewards placed on tokens
  group_ids_B: jax.Array  # int32, episodes of one env group share a start state
  scores_B: jax.Array  # float32, episode return (the outcome score for GRPO / filtering)
  turns: TurnBatch | None = None  # per-turn records (the rollout always fills them)
  row_episodes_R: jax.Array | None = None  # int32, the episode of each row (window modes);
  # None: row b is episode b
  # Qwen2.5-VL (an environment seen as images, rollout.images): uint8 [B, N, H, W, 3], each
  # row's frames in the order its image tokens show them; frames past a row's images are unused.
  frames_BxNxHxWx3: jax.Array | None = None

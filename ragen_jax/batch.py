"""The rollout batch: what the rollout engine produces and the StarPO update consumes.

Dimensions:
  B: episodes (env_groups x group_size), one sequence each.
  T: tokens of the whole conversation (system, user turns, assistant turns), left-padded.

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

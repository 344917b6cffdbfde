"""RL moves a policy the way the reward asks, for every advantage estimator.

A two-turn toy task whose right answer is known: the first reply is token A or token B, an
observation follows, the second reply is C or D and does not matter; the reward (1 for A, 0 for
B) arrives only on the episode's last token, so the credit has to reach the first turn. Actions
are sampled from the policy's own two-way preference; a few train steps must raise P(A | A or
B) clearly. Equivalence tests cannot catch a flipped sign or a shifted mask; this one does.

Dimensions: B episodes, T tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.batch import RolloutBatch
from ragen_jax.batch import TurnBatch
import tiny  # pylint: disable=g-bad-import-order

MODEL = tiny.model_config(vocab_size=16, num_layers=1)
A, B_, C, D, PROMPT, OBS = 3, 4, 5, 6, 7, 8
GROUPS, GROUP_SIZE = 4, 4
EPISODES = GROUPS * GROUP_SIZE
# [prompt x3, first reply, observation x2, second reply]
FIRST, SECOND, T = 3, 6, 7


def _two_way(actor, tokens_BxT, position, pair):
  """P(pair[0]) / (P(pair[0]) + P(pair[1])) of the token at `position`, per episode."""
  logits = actor(tokens_BxT, jnp.ones_like(tokens_BxT))
  two = logits[:, position - 1, jnp.asarray(pair)]
  return jax.nn.softmax(two, axis=-1)[:, 0]


def _batch(actor, key) -> RolloutBatch:
  tokens = np.array([PROMPT] * 3 + [A] + [OBS] * 2 + [C], np.int32)
  tokens_BxT = jnp.asarray(np.tile(tokens, (EPISODES, 1)))
  k1, k2 = jax.random.split(key)
  p_a = _two_way(actor, tokens_BxT, FIRST, (A, B_))
  first = jnp.where(jax.random.uniform(k1, (EPISODES,)) < p_a, A, B_)
  second = jnp.where(jax.random.uniform(k2, (EPISODES,)) < 0.5, C, D)
  tokens_BxT = tokens_BxT.at[:, FIRST].set(first).at[:, SECOND].set(second)
  loss_BxT = np.zeros((EPISODES, T), np.int32)
  loss_BxT[:, [FIRST, SECOND]] = 1
  scores_B = (first == A).astype(jnp.float32)
  # Per-turn records (GiGPO): both first replies act from the prompt, the second ones from the
  # state the first reply made; the reward is the second turn's.
  token_turns = np.full((EPISODES, T), -1, np.int32)
  token_turns[:, FIRST], token_turns[:, SECOND] = 0, 1
  turns = TurnBatch(
      rewards_BxK=jnp.stack([jnp.zeros(EPISODES), scores_B], axis=1),
      mask_BxK=jnp.ones((EPISODES, 2), jnp.int32),
      state_keys_BxK=jnp.stack([jnp.zeros(EPISODES, jnp.int32), first], axis=1),
      token_turns_BxT=jnp.asarray(token_turns),
  )
  return RolloutBatch(
      tokens_BxT=tokens_BxT,
      attention_mask_BxT=jnp.ones((EPISODES, T), jnp.int32),
      loss_mask_BxT=jnp.asarray(loss_BxT),
      logprobs_BxT=jnp.zeros((EPISODES, T)),
      token_rewards_BxT=jnp.zeros((EPISODES, T)).at[:, -1].set(scores_B),
      group_ids_B=jnp.repeat(jnp.arange(GROUPS, dtype=jnp.int32), GROUP_SIZE),
      scores_B=scores_B,
      turns=turns,
  )


@pytest.mark.parametrize("estimator", algos.config.ADV_ESTIMATORS)
def test_reward_raises_the_rewarded_first_turn_action(estimator):
  actor = models.create(MODEL, jax.random.key(0))
  cfg = algos.PPOConfig(
      adv_estimator=estimator,
      num_minibatches=1,
      actor_lr=1e-2,
      critic_lr=1e-2,
      filter_include_zero=False,
      vocab_chunk=16,
      entropy_coeff=0.0,
  )
  step = jax.jit(algos.make_train_step(actor, None, cfg, jit=False))
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  probe = _batch(actor, jax.random.key(2)).tokens_BxT[:1]
  before = float(_two_way(actor, probe, FIRST, (A, B_))[0])
  for i in range(8):
    policy = algos.actor_module(actor, state)
    state, _ = step(state, _batch(policy, jax.random.key(10 + i)), jax.random.key(i))
  after = float(_two_way(algos.actor_module(actor, state), probe, FIRST, (A, B_))[0])
  assert after > before + 0.2, (estimator, before, after)
  # The second reply earns nothing either way: its preference stays near where it was.
  c_before = float(_two_way(actor, probe, SECOND, (C, D))[0])
  c_after = float(_two_way(algos.actor_module(actor, state), probe, SECOND, (C, D))[0])
  assert abs(c_after - c_before) < abs(after - before), (estimator, c_before, c_after)

"""Bandit payoffs, arm naming and prompt text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs
from ragen_jax.envs.device import bandit

N = 20000


def _batch(env, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), N)
  states = jax.jit(jax.vmap(env.reset))(keys)
  return keys, states


def test_payoffs_and_success():
  env = envs.make("bandit")
  keys, states = _batch(env)
  step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, None)))
  for action in (0, 1):
    new, reward, done, info = jax.device_get(step(keys, states, action))
    hi = np.asarray(info["success"])
    # Action i is the i-th arm as rendered: arm 0 is the risky one exactly when hi_first.
    np.testing.assert_array_equal(hi, np.asarray(states.hi_first) == (action == 0))
    assert done.all()
    np.testing.assert_allclose(reward[~hi], 0.1, rtol=1e-6)
    hi_rewards = reward[hi]
    assert set(np.unique(hi_rewards).tolist()) == {0.0, 1.0}
    p = 0.25
    assert abs(hi_rewards.mean() - p) < 4 * np.sqrt(p * (1 - p) / hi.sum())
  assert 0.45 < np.asarray(states.hi_first).mean() < 0.55


def test_configurable_payoffs_and_a_pull_ends_the_episode():
  env = envs.make(
      "bandit", lo_arm_score=0.3, hi_arm_hiscore=2.0, hi_arm_loscore=-1.0, hi_arm_hiscore_prob=0.5
  )
  keys, states = _batch(env, seed=1)
  _, reward, _, info = jax.device_get(
      jax.jit(jax.vmap(env.step, in_axes=(0, 0, None)))(keys, states, 1)
  )
  hi = np.asarray(info["success"])
  np.testing.assert_allclose(reward[~hi], 0.3, rtol=1e-6)
  assert set(np.unique(reward[hi]).tolist()) == {-1.0, 2.0}
  assert abs(reward[hi].mean() - 0.5) < 0.05
  state = jax.tree.map(lambda x: x[0], states)
  state, r, d, _ = env.step(keys[0], state, 0)
  state2, r2, d2, info2 = env.step(keys[1], state, 1)
  assert float(r2) == 0.0 and bool(d2) and not bool(info2["success"])


def test_splits_names_and_render():
  for split, count in (("train", 12), ("test", 8)):
    env = envs.make("bandit", split=split)
    _, states = _batch(env)
    pairs = np.bincount(np.asarray(states.pair), minlength=count)
    assert len(pairs) == count and pairs.min() > N / count * 0.8
  train = {n for pair in bandit.ARM_NAMES["train"] for n in pair}
  test = {n for pair in bandit.ARM_NAMES["test"] for n in pair}
  assert not train & test and len(train) == 24 and len(test) == 16

  env = envs.make("bandit")
  state = bandit.BanditState(
      jnp.int32(0), jnp.bool_(True), jnp.int32(-1), jnp.float32(0), jnp.bool_(False)
  )
  assert env.action_names_for(state) == ("Trader", "Teacher")
  text = env.render(state)
  assert text.startswith(
      "You are playing a bandit game. Goal: Maximize your total reward by "
      "choosing which arm to pull. \nGame Rules: \n1. There are 2 arms, "
      "named Trader and Teacher\n"
  )
  assert text.endswith("output like <answer> Trader </answer> or <answer> Teacher </answer>.\n")
  back = env.from_text(text)
  assert int(back.pair) == 0 and bool(back.hi_first)
  state, *_ = env.step(jax.random.PRNGKey(0), state, 1)
  assert env.render(state) == "Teacher: 0.1 points"
  with pytest.raises(ValueError, match="not a pair"):
    envs.make("bandit", split="test").from_text(text)
  with pytest.raises(ValueError, match="split"):
    envs.make("bandit", split="val")

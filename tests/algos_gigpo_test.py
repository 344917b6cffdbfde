"""GiGPO (`advantages.gigpo`) against a plain loop reference and hand-worked batches; its token
layout, the state keys it groups by, its settings and the rollout's per-turn records.

Dimensions: B episodes, K turns, T token positions.
"""

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import train_step
from ragen_jax.algos.step_records import OldPass
from ragen_jax.batch import RolloutBatch
from ragen_jax.batch import TurnBatch
from ragen_jax.rollout import state_keys


def ref_gigpo(r, m, keys, groups, gamma, omega, norm, eps=1e-6):
  """Dictionaries of lists and explicit loops, in float64."""
  b, k = r.shape

  def normalise(value, members):
    if len(members) < 2:
      return 0.0
    mean = sum(members) / len(members)
    if norm == "mean":
      return value - mean
    std = (sum((x - mean) ** 2 for x in members) / (len(members) - 1)) ** 0.5
    return (value - mean) / (std + eps)

  valid = [any(m[i, t] for t in range(k)) for i in range(b)]
  score = [sum(float(r[i, t]) for t in range(k) if m[i, t]) for i in range(b)]
  by_group = {}
  for i in range(b):
    if valid[i]:
      by_group.setdefault(int(groups[i]), []).append(score[i])
  episode = np.zeros(b)
  for i in range(b):
    if valid[i]:
      episode[i] = normalise(score[i], by_group[int(groups[i])])

  ret = np.zeros((b, k))
  for i in range(b):
    for t in range(k):
      ret[i, t] = sum(gamma ** (j - t) * float(r[i, j]) for j in range(t, k) if m[i, j])
  by_state = {}
  for i in range(b):
    for t in range(k):
      if m[i, t]:
        by_state.setdefault((int(groups[i]), int(keys[i, t])), []).append(ret[i, t])
  step = np.zeros((b, k))
  for i in range(b):
    for t in range(k):
      if m[i, t]:
        step[i, t] = omega * normalise(ret[i, t], by_state[(int(groups[i]), int(keys[i, t]))])
  return episode, step


_gigpo_jit = jax.jit(adv_lib.gigpo, static_argnames=("norm",))


def _run(r, m, keys, groups, gamma, omega, norm):
  args = [jnp.asarray(x) for x in (r, m, keys, groups)]
  episode, step = _gigpo_jit(*args, gamma=gamma, omega=omega, norm=norm)
  return np.asarray(episode), np.asarray(step)


def test_hand_worked_mean():
  # One group of three episodes, two turns, γ = 0.5, ω = 1.
  #   rewards  e0 = [0, 1]   e1 = [0, 0]   e2 = [1, -] (one turn)
  #   keys     e0 = [0, 1]   e1 = [0, 1]   e2 = [0, -]
  # Scores 1, 0, 1; mean 2/3: A_E = 1/3, −2/3, 1/3.
  # Returns: e0 = [0 + 0.5·1, 1] = [0.5, 1]; e1 = [0, 0]; e2 = [1].
  # Step group key 0 = {0.5, 0, 1}, mean 0.5: A_S = 0, −0.5, 0.5.
  # Step group key 1 = {1, 0}, mean 0.5: A_S = 0.5, −0.5. e2's missing turn: 0.
  r = np.array([[0, 1], [0, 0], [1, 0]], np.float32)
  m = np.array([[1, 1], [1, 1], [1, 0]], np.int32)
  keys = np.array([[0, 1], [0, 1], [0, 0]], np.int32)
  episode, step = _run(r, m, keys, np.zeros(3, np.int32), 0.5, 1.0, "mean")
  np.testing.assert_allclose(episode, [1 / 3, -2 / 3, 1 / 3], atol=1e-6)
  np.testing.assert_allclose(step, [[0, 0.5], [-0.5, -0.5], [0.5, 0]], atol=1e-6)
  # ω scales the step level only.
  episode2, step2 = _run(r, m, keys, np.zeros(3, np.int32), 0.5, 2.0, "mean")
  np.testing.assert_allclose(episode2, episode, atol=1e-7)
  np.testing.assert_allclose(step2, 2 * step, atol=1e-6)


def test_hand_worked_mean_std_singletons_and_groups():
  # Group 0: e0, e1 (one turn each, same key 7); group 1: e2 alone; group 2: e3 with no valid
  # turn, e4 with one. γ = 1, ω = 1, mean_std.
  # Group 0 scores 2 and 0: mean 1, sample std √2 -> A_E = ±1/(√2 + 1e-6) = ±0.7071063;
  # their turns form a step group with the same numbers: A_S = ±0.7071063.
  # e2: a group of one episode -> A_E = 0, its lone turn -> A_S = 0 (verl-agent would keep 5).
  # e3 has no valid turn: it counts nowhere, so e4 is alone too: 0 and 0.
  # e0's key 7 also appears in group 1 (e2): keys never match across groups.
  r = np.array([[2, 0], [0, 0], [5, 0], [3, 0], [1, 0]], np.float32)
  m = np.array([[1, 0], [1, 0], [1, 0], [0, 0], [1, 0]], np.int32)
  keys = np.array([[7, 0], [7, 0], [7, 0], [7, 0], [7, 0]], np.int32)
  groups = np.array([0, 0, 1, 2, 2], np.int32)
  episode, step = _run(r, m, keys, groups, 1.0, 1.0, "mean_std")
  a = 1 / (np.sqrt(2) + 1e-6)
  np.testing.assert_allclose(episode, [a, -a, 0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(step[:, 0], [a, -a, 0, 0, 0], atol=1e-6)
  assert np.all(step[:, 1] == 0)


def test_different_states_are_singletons():
  # Two episodes of one group, rewards [1, 0] and [0, 0], keys all different: every step group
  # holds one turn, so A_S = 0 everywhere; A_E = ±0.5 (scores 1 and 0, mean 0.5).
  r = np.array([[1, 0], [0, 0]], np.float32)
  m = np.ones((2, 2), np.int32)
  keys = np.array([[0, 1], [2, 3]], np.int32)
  episode, step = _run(r, m, keys, np.zeros(2, np.int32), 0.95, 1.0, "mean")
  np.testing.assert_allclose(episode, [0.5, -0.5], atol=1e-7)
  assert np.all(step == 0)


def _batch(draw, dyadic):
  # One shape (one compilation); masks and group ids vary the episodes' and groups' sizes.
  b, k = 6, 4
  if dyadic:  # exact float32 sums: a zero spread stays exactly zero under mean_std
    value = st.integers(-8, 8).map(lambda x: x / 4)
  else:
    value = st.floats(-2, 2, width=32, allow_subnormal=False)
  r = draw(hnp.arrays(np.float32, (b, k), elements=value))
  m = draw(hnp.arrays(np.int32, (b, k), elements=st.integers(0, 1)))
  keys = draw(hnp.arrays(np.int32, (b, k), elements=st.integers(0, 2)))
  groups = draw(hnp.arrays(np.int32, (b,), elements=st.integers(0, 2)))
  return r, m, keys, groups


@st.composite
def _mean_cases(draw):
  gamma = draw(st.floats(0, 1, allow_subnormal=False))
  omega = draw(st.floats(0, 2, allow_subnormal=False))
  return _batch(draw, dyadic=False), gamma, omega


@st.composite
def _mean_std_cases(draw):
  return _batch(draw, dyadic=True), draw(st.sampled_from([0.0, 0.5, 1.0])), 1.0


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(_mean_cases())
def test_matches_loop_reference_mean(case):
  (r, m, keys, groups), gamma, omega = case
  episode, step = _run(r, m, keys, groups, gamma, omega, "mean")
  ref_episode, ref_step = ref_gigpo(r, m, keys, groups, gamma, omega, "mean")
  np.testing.assert_allclose(episode, ref_episode, atol=2e-5)
  np.testing.assert_allclose(step, ref_step, atol=2e-5)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(_mean_std_cases())
def test_matches_loop_reference_mean_std(case):
  (r, m, keys, groups), gamma, omega = case
  episode, step = _run(r, m, keys, groups, gamma, omega, "mean_std")
  ref_episode, ref_step = ref_gigpo(r, m, keys, groups, gamma, omega, "mean_std")
  np.testing.assert_allclose(episode, ref_episode, atol=1e-4)
  np.testing.assert_allclose(step, ref_step, atol=1e-4)


def test_jitted_once_for_every_value_of_the_same_shapes():
  traces = []

  def counted(*args, **kwargs):
    traces.append(1)
    return adv_lib.gigpo(*args, **kwargs)

  fn = jax.jit(counted, static_argnames=("norm",))
  rng = np.random.default_rng(0)
  for seed in range(3):
    r = rng.normal(size=(4, 3)).astype(np.float32)
    m = (rng.random((4, 3)) < 0.8).astype(np.int32)
    keys = rng.integers(0, 2, (4, 3)).astype(np.int32)
    fn(r, m, keys, np.array([0, 0, 1, 1], np.int32), gamma=0.9 - 0.1 * seed, omega=1.0, norm="mean")
  assert len(traces) == 1  # γ and ω are traced values, not static arguments


def test_token_advantages_follow_each_turn_and_report_the_share():
  # The first hand-worked batch, laid out as tokens: e0 = [obs, a, a, obs, b], e1 the same,
  # e2 = [pad, pad, obs, a, a]. A token of turn k carries A_E + A_S(k).
  r = jnp.array([[0, 1], [0, 0], [1, 0]], jnp.float32)
  m = jnp.array([[1, 1], [1, 1], [1, 0]], jnp.int32)
  keys = jnp.array([[0, 1], [0, 1], [0, 0]], jnp.int32)
  turns = jnp.array([[-1, 0, 0, -1, 1], [-1, 0, 0, -1, 1], [-1, -1, -1, 0, 0]], jnp.int32)
  loss = (turns >= 0).astype(jnp.int32)
  adv, ret, share = adv_lib.gigpo_token_advantages(
      r, m, keys, turns, jnp.zeros(3, jnp.int32), loss, gamma=0.5, omega=1.0, norm="mean"
  )
  e0 = [0, 1 / 3, 1 / 3, 0, 1 / 3 + 0.5]
  e1 = [0, -2 / 3 - 0.5, -2 / 3 - 0.5, 0, -2 / 3 - 0.5]
  e2 = [0, 0, 0, 1 / 3 + 0.5, 1 / 3 + 0.5]
  np.testing.assert_allclose(adv, [e0, e1, e2], atol=1e-6)
  np.testing.assert_allclose(ret, adv)
  # All five valid turns sit in groups of two or three.
  np.testing.assert_allclose(share, 1.0, atol=1e-6)
  _, _, share = adv_lib.gigpo_token_advantages(
      r, m, jnp.array([[0, 1], [2, 3], [0, 5]]), turns, jnp.zeros(3, jnp.int32), loss,
      gamma=0.5, omega=1.0, norm="mean",
  )  # fmt: skip
  np.testing.assert_allclose(share, 2 / 5, atol=1e-6)  # e0's and e2's first turns share key 0


def test_state_keys_are_exact_bits_and_refuse_what_they_cannot_hash():
  states = {"grid": jnp.array([[1, 2, 3], [1, 2, 3], [1, 2, 4]], jnp.int8),
            "pos": jnp.array([0.5, 0.5, 0.5], jnp.float32), "done": jnp.array([0, 0, 0], bool)}  # fmt: skip
  keys = state_keys.combine(state_keys.device_keys_jit(states))
  assert keys[0] == keys[1] != keys[2]
  moved = dict(states, done=jnp.array([0, 1, 0], bool))
  assert len(set(state_keys.combine(state_keys.device_keys_jit(moved)))) == 3
  assert state_keys.text_key("abc") == state_keys.text_key("abc") != state_keys.text_key("abd")
  assert state_keys.text_key("abc") == 0x5995D533D814BBD8  # blake2b: the same in every process
  with pytest.raises(TypeError, match=r"leaf \['z'\] of dtype complex64"):
    state_keys.device_keys({"z": jnp.zeros((2, 1), jnp.complex64)})
  with pytest.raises(TypeError, match="observation is a dict"):
    state_keys.text_key({"a": 1})


def test_settings_are_checked_and_ignored_critic_settings_named(caplog):
  with pytest.raises(ValueError, match="ppo.gigpo_norm must be one of"):
    algos.PPOConfig(adv_estimator="gigpo", gigpo_norm="std")
  with pytest.raises(ValueError, match="ppo.gigpo_gamma"):
    algos.PPOConfig(adv_estimator="gigpo", gigpo_gamma=-0.1)
  with pytest.raises(ValueError, match="ppo.gigpo_omega"):
    algos.PPOConfig(adv_estimator="gigpo", gigpo_omega=-1.0)
  with caplog.at_level("WARNING"):
    cfg = algos.PPOConfig(adv_estimator="gigpo", critic_lr=5e-4, lam=0.9)
  assert not cfg.uses_critic
  assert "ignored: ppo.lam, ppo.critic_lr" in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING"):
    algos.PPOConfig(adv_estimator="gae", critic_lr=5e-4)
    algos.PPOConfig(adv_estimator="gigpo")
  assert "ignored" not in caplog.text


def test_train_step_stage_uses_kept_groups_and_each_tokens_turn():
  """The train step's advantage stage: the filter drops group 1 (no reward spread), so its
  episodes get 0 and group 0's numbers are those of group 0 alone; each trained token carries
  its turn's A_E + ω·A_S."""
  rng = np.random.default_rng(1)
  b, k, t = 8, 3, 12
  r = np.zeros((b, k), np.float32)
  r[:4] = rng.integers(-4, 5, (4, k)) / 4  # group 0: spread; group 1: all zero
  m = np.ones((b, k), np.int32)
  m[2, 2] = 0  # one episode ended after two turns
  # Group 0: key 0 four times, key 1 three times, the rest alone; group 1: one key throughout.
  keys = np.zeros((b, k), np.int32)
  keys[:4] = [[0, 1, 2], [0, 1, 3], [0, 4, 5], [0, 1, 6]]
  groups = np.repeat([0, 1], 4).astype(np.int32)
  token_turns = np.full((b, t), -1, np.int32)
  for j in range(k):
    token_turns[:, 4 * j + 1 : 4 * j + 3] = j  # [obs, reply x2, obs] per turn
  token_turns[2, 9:] = -1
  loss = (token_turns >= 0).astype(np.int32)
  batch = RolloutBatch(
      tokens_BxT=jnp.ones((b, t), jnp.int32),
      attention_mask_BxT=jnp.ones((b, t), jnp.int32),
      loss_mask_BxT=jnp.asarray(loss),
      logprobs_BxT=jnp.zeros((b, t)),
      token_rewards_BxT=jnp.zeros((b, t)),
      group_ids_B=jnp.asarray(groups),
      scores_B=jnp.asarray((r * m).sum(1)),
      turns=TurnBatch(*(jnp.asarray(x) for x in (r, m, keys, token_turns))),
  )
  cfg = algos.PPOConfig(
      adv_estimator="gigpo", gigpo_gamma=0.9, gigpo_omega=0.5, filter_include_zero=False
  )
  sel = train_step.order_and_filter(cfg, batch)
  adv = train_step.advantages(cfg, sel, OldPass(None, None, None, None))
  # Group 0 is kept and already first, so the stage's kept-first order is the batch's own.
  np.testing.assert_array_equal(np.asarray(sel.keep_B), [True] * 4 + [False] * 4)
  episode, step = ref_gigpo(r[:4], m[:4], keys[:4], groups[:4], 0.9, 0.5, "mean")
  got = np.asarray(adv.adv_BxT)
  for i in range(b):
    want = np.zeros(t)
    if i < 4:
      on = token_turns[i] >= 0
      want[on] = episode[i] + step[i, token_turns[i, on]]
    np.testing.assert_allclose(got[i], want, atol=1e-5)
  # The share counts the kept episodes' turns alone.
  sizes = {}
  for i in range(4):
    for j in range(k):
      if m[i, j]:
        sizes[keys[i, j]] = sizes.get(keys[i, j], 0) + 1
  share = sum(n for n in sizes.values() if n > 1) / sum(sizes.values())
  assert share == 7 / 11  # 19 / 23 with group 1's turns counted
  np.testing.assert_allclose(float(adv.step_group_share), share, atol=1e-6)

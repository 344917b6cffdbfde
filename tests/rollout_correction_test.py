"""Rollout correction (`ppo.rollout_correction`): weights and metrics against a NumPy reference,
the config's checks, and its effect inside the compiled train step.

Dimensions: B sequences, T token positions.
"""

import functools

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.algos import losses
from ragen_jax.batch import RolloutBatch
import tiny  # pylint: disable=g-bad-import-order

MODES = ("none", "tis", "icepop", "seq_mask")


# ---------------------------------------------------------------- NumPy reference


def ref_weights(old, sampler, mask, mode, cap):
  """Loop reference in float64: r = exp(clamp(old − sampler, ±20)) on loss tokens."""
  b, t_len = old.shape
  log_r = np.clip(old.astype(np.float64) - sampler, -20.0, 20.0)
  w = np.zeros((b, t_len))
  for i in range(b):
    on = [t for t in range(t_len) if mask[i, t]]
    if not on:
      continue
    geo = np.exp(sum(log_r[i, t] for t in on) / len(on))
    for t in on:
      r = np.exp(log_r[i, t])
      if mode == "none":
        w[i, t] = 1.0
      elif mode == "tis":
        w[i, t] = min(r, cap)
      elif mode == "icepop":
        w[i, t] = float(1.0 / cap <= r <= cap)
      else:
        w[i, t] = float(1.0 / cap <= geo <= cap)
  return w


def ratios_from(r_rows, base=-2.0):
  """(old, sampler) log-probs whose ratio exp(old − sampler) is `r_rows`."""
  r = np.asarray(r_rows, np.float64)
  old = np.full(r.shape, base)
  return old.astype(np.float32), (old - np.log(r)).astype(np.float32)


# Hand-worked: five rows of four tokens, C = 2.
R_BxT = [
    [1.0, 3.0, 0.25, 1.5],  # geometric mean 1.125^(1/4) = 1.03: kept whole
    [3.0, 3.0, 1e-6, 5.0],  # off-mask tokens count nowhere: geometric mean 3 > 2
    [0.6, 0.4, 0.9, 1.0],  # geometric mean 0.216^(1/3) = 0.6 >= 0.5: kept
    [9.0, 9.0, 9.0, 9.0],  # no loss token
    [0.3, 0.3, 0.3, 0.3],  # geometric mean 0.3 < 0.5
]
MASK_BxT = np.asarray(
    [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.int32
)
HAND = {
    "none": [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
    "tis": [[1, 2, 0.25, 1.5], [2, 2, 0, 0], [0.6, 0.4, 0.9, 0], [0, 0, 0, 0], [0.3] * 4],
    "icepop": [[1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    "seq_mask": [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
}


@pytest.mark.parametrize("mode", MODES)
def test_hand_worked_weights(mode):
  old, sampler = ratios_from(R_BxT)
  w = losses.rollout_correction_weights(old, sampler, MASK_BxT, mode=mode, cap=2.0)
  np.testing.assert_allclose(np.asarray(w), np.asarray(HAND[mode], np.float64), rtol=1e-5)
  np.testing.assert_allclose(ref_weights(old, sampler, MASK_BxT, mode, 2.0), HAND[mode], rtol=1e-5)


def test_hand_worked_metrics():
  """13 loss tokens; r sums to 14.85, lies in [0.25, 3]; 3 exceed C = 2; icepop masks 9 and
  seq_mask 6 (rows 1 and 4)."""
  old, sampler = ratios_from(R_BxT)
  got = {}
  for mode in ("tis", "icepop", "seq_mask"):
    metrics = losses.rollout_correction_metrics(old, sampler, MASK_BxT, mode=mode, cap=2.0)
    got[mode] = {k.split("/")[1]: float(v) for k, v in metrics.items()}
  ratios = {"ratio_mean": 14.85 / 13, "ratio_min": 0.25, "ratio_max": 3.0}
  want = {
      "tis": {**ratios, "truncated_share": 3 / 13},
      "icepop": {**ratios, "masked_share": 9 / 13},
      "seq_mask": {**ratios, "masked_share": 6 / 13},
  }
  assert got.keys() == want.keys()
  for mode, values in want.items():
    assert got[mode].keys() == values.keys(), mode
    for name, value in values.items():
      np.testing.assert_allclose(got[mode][name], value, rtol=1e-5, err_msg=f"{mode} {name}")


def test_no_loss_tokens_gives_zero_weights_and_metrics():
  old, sampler = ratios_from([[3.0, 0.1]])
  mask = np.zeros((1, 2), np.int32)
  for mode in MODES:
    w = losses.rollout_correction_weights(old, sampler, mask, mode=mode, cap=2.0)
    assert not np.any(np.asarray(w))
  metrics = losses.rollout_correction_metrics(old, sampler, mask, mode="icepop", cap=2.0)
  assert all(float(v) == 0.0 for v in metrics.values()), metrics


def test_weights_carry_no_gradient():
  old, sampler = ratios_from(R_BxT)
  for mode in MODES:
    grads = jax.grad(
        lambda o, s, m=mode: jnp.sum(
            losses.rollout_correction_weights(o, s, MASK_BxT, mode=m, cap=2.0)
        ),
        argnums=(0, 1),
    )(jnp.asarray(old), jnp.asarray(sampler))
    assert not any(np.any(np.asarray(g)) for g in grads), mode


def test_an_unknown_mode_is_named():
  old, sampler = ratios_from(R_BxT)
  with pytest.raises(ValueError, match="'geo'"):
    losses.rollout_correction_weights(old, sampler, MASK_BxT, mode="geo", cap=2.0)


def test_policy_loss_weights_apply_after_clipping():
  """A = 1 and ρ = 2: PPO clips to 1.28, then the weight 0.5 gives −0.64 (weighting ρ first
  would give −1); A = −1, ρ = 5: the dual clip gives 3, weighted 1.5; the normaliser of
  token-mean stays 2 tokens, a zero weight included."""
  logp = jnp.log(jnp.asarray([[2.0, 5.0, 1.0]]))
  old = jnp.zeros((1, 3))
  adv = jnp.asarray([[1.0, -1.0, 4.0]])
  mask = jnp.asarray([[1.0, 1.0, 0.0]])
  clips = dict(clip_low=0.2, clip_high=0.28, clip_c=3.0)
  for w, want in (([0.5, 0.5, 7.0], (-0.64 + 1.5) / 2), ([0.0, 1.0, 0.0], 3.0 / 2)):
    loss, metrics = losses.policy_loss(logp, old, adv, mask, weights_BxT=jnp.asarray([w]), **clips)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg_clipfrac"], 0.5, rtol=1e-5)  # unweighted


def _far_from_band(old, sampler, mask, cap, margin=1e-3):
  """Tokens (and, for seq_mask, rows) whose log r is not within `margin` of ±log C: there
  float32 and float64 may round to opposite sides of the band."""
  log_r = np.clip(old.astype(np.float64) - sampler, -20.0, 20.0)
  n_B = np.maximum(mask.sum(-1), 1)
  geo_B = (log_r * mask).sum(-1) / n_B
  edge = lambda x: np.min(np.abs(np.abs(x)[..., None] - np.log(cap)), axis=-1) < margin
  return ~edge(log_r), ~edge(geo_B)


# One shape (rows of every length come from the mask), so each mode compiles once.
HYPO_SHAPE = (5, 7)
jit_weights = jax.jit(losses.rollout_correction_weights, static_argnames=("mode",))
jit_metrics = jax.jit(losses.rollout_correction_metrics, static_argnames=("mode",))


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    mode=st.sampled_from(MODES),
    cap=st.floats(1.0, 8.0),
    spread=st.sampled_from([0.05, 1.0, 30.0]),
    old=hnp.arrays(np.float32, HYPO_SHAPE, elements=st.floats(-30.0, 0.0, width=32)),
    noise=hnp.arrays(np.float32, HYPO_SHAPE, elements=st.floats(-1.0, 1.0, width=32)),
    mask=hnp.arrays(np.int32, HYPO_SHAPE, elements=st.integers(0, 1)),
)
def test_random_inputs_match_the_reference(mode, cap, spread, old, noise, mask):
  # The sampler near the old policy on some draws (so the band is exercised), far on others.
  sampler = (old + spread * noise).astype(np.float32)
  got = np.asarray(jit_weights(old, sampler, mask, mode=mode, cap=cap))
  want = ref_weights(old, sampler, mask, mode, cap)
  token_ok, row_ok = _far_from_band(old, sampler, mask, cap)
  check = {"none": True, "tis": True, "icepop": token_ok, "seq_mask": row_ok[:, None]}[mode]
  check = np.broadcast_to(check, HYPO_SHAPE)  # tis and none have no threshold to round across
  np.testing.assert_allclose(got[check], want[check], rtol=1e-4, atol=1e-6)
  assert np.all(got[mask == 0] == 0.0)
  metrics = jit_metrics(old, sampler, mask, mode=mode, cap=cap)
  r = np.exp(np.clip(old.astype(np.float64) - sampler, -20.0, 20.0))[mask > 0]
  if r.size:
    np.testing.assert_allclose(metrics["rollout_correction/ratio_mean"], r.mean(), rtol=1e-4)
    np.testing.assert_allclose(metrics["rollout_correction/ratio_max"], r.max(), rtol=1e-4)
    np.testing.assert_allclose(metrics["rollout_correction/ratio_min"], r.min(), rtol=1e-4)
    if mode in ("icepop", "seq_mask") and np.all(check[mask > 0]):
      np.testing.assert_allclose(
          metrics["rollout_correction/masked_share"], np.mean(want[mask > 0] == 0), atol=1e-6
      )


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(rollout_correction_cap=0.5),
            "ppo.rollout_correction_cap must be a finite number >= 1",
        ),
        (dict(rollout_correction_cap=float("nan")), "ppo.rollout_correction_cap"),
        (dict(rollout_correction="geo_mask"), "ppo.rollout_correction must be one of"),
        (
            dict(rollout_correction="tis", recompute_old_logprobs=False),
            "needs ppo.recompute_old_logprobs=True",
        ),
    ],
)
def test_bad_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    algos.PPOConfig(**kwargs)


def test_defaults():
  cfg = algos.PPOConfig()
  assert cfg.rollout_correction == "none" and cfg.rollout_correction_cap == 2.0
  algos.PPOConfig(rollout_correction="none", recompute_old_logprobs=False)  # nothing to correct


# ---------------------------------------------------------------- in the train step

MODEL = tiny.model_config(num_layers=1)
B, T = 8, 12
FAR = -40.0  # a sampler log-prob that makes r = e^20 (clamped): far outside any band


def make_batch(loss_BxT=None, sampler_BxT=None):
  """Two groups of 4, two assistant turns per episode; the sampler at −log V by default (a
  fresh tiny model is near uniform, so r stays within [0.1, 10])."""
  rng = np.random.RandomState(0)
  tokens = rng.randint(1, MODEL.vocab_size, (B, T)).astype(np.int32)
  attn = np.ones((B, T), np.int32)
  attn[::2, :2] = 0
  tokens[attn == 0] = 0
  if loss_BxT is None:
    loss_BxT = np.zeros((B, T), np.int32)
    loss_BxT[:, 4:7] = 1
    loss_BxT[:, 9:12] = 1
  if sampler_BxT is None:
    sampler_BxT = np.full((B, T), -np.log(MODEL.vocab_size), np.float32)
  scores = np.asarray([1.0, 0.0, 1.0, 0.0, 2.0, 0.5, 3.0, 2.0], np.float32)
  rewards = np.zeros((B, T), np.float32)
  rewards[:, T - 1] = scores  # GAE's: the score on the last token
  return RolloutBatch(
      tokens_BxT=jnp.asarray(tokens),
      attention_mask_BxT=jnp.asarray(attn),
      loss_mask_BxT=jnp.asarray(loss_BxT),
      logprobs_BxT=jnp.asarray(sampler_BxT),
      token_rewards_BxT=jnp.asarray(rewards),
      group_ids_B=jnp.asarray(np.repeat([3, 8], 4).astype(np.int32)),
      scores_B=jnp.asarray(scores),
  )


def run_step(cfg, batch, tx=None):
  """One jitted step from a fixed actor; (actor parameters after, metrics) as NumPy."""
  actor = models.create(MODEL, jax.random.key(0))
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1), actor_tx=tx)
  step = algos.make_train_step(actor, None, cfg, actor_tx=tx)
  state, metrics = step(state, batch, jax.random.key(2))
  return jax.tree.map(np.asarray, state.actor_params), {
      k: np.asarray(v) for k, v in metrics.items()
  }


def grpo_cfg(**kwargs):
  """GRPO with one optimizer step, no entropy bonus, and a fixed loss divisor: masking a token's
  loss and zeroing its weight then give the same objective (token-mean's normaliser would
  count the zero-weight tokens)."""
  return algos.PPOConfig(
      **{
          "adv_estimator": "grpo",
          "num_minibatches": 1,
          "shuffle": False,
          "entropy_coeff": 0.0,
          "agg_mode": "seq-mean-token-sum-norm",
          "vocab_chunk": 24,
          **kwargs,
      }
  )


def test_none_is_the_weights_path_at_one(monkeypatch):
  """The default (none) step equals, bit for bit, a step whose correction weights are forced
  to 1 on every loss token: "none" adds nothing to the update."""
  cfg = algos.PPOConfig(num_minibatches=2, micro_batches=2, vocab_chunk=24)
  batch = make_batch()
  params_none, metrics_none = run_step(cfg, batch)
  assert not any(k.startswith("rollout_correction/") for k in metrics_none)
  monkeypatch.setattr(
      losses,
      "rollout_correction_weights",
      lambda old, sampler, mask, **_: jnp.where(mask > 0, 1.0, 0.0),
  )
  forced = algos.PPOConfig(
      num_minibatches=2, micro_batches=2, vocab_chunk=24, rollout_correction="tis"
  )
  params_ones, metrics_ones = run_step(forced, batch)
  for a, b in zip(jax.tree.leaves(params_none), jax.tree.leaves(params_ones)):
    np.testing.assert_array_equal(a, b)
  for k, v in metrics_none.items():
    np.testing.assert_array_equal(v, metrics_ones[k], err_msg=k)
  assert float(metrics_none["actor/pg_loss"]) != 0.0


@functools.cache
def uncorrected_sgd_step():
  """Actor parameters after one uncorrected SGD step on the whole default batch (uncorrected,
  the sampler's log-probs do not enter the update)."""
  return run_step(grpo_cfg(), make_batch(), optax.sgd(1.0))[0]


@pytest.mark.parametrize(
    "mode, far_tokens, masked_instead",
    [
        # Two tokens far off: icepop drops them and nothing else.
        ("icepop", [(1, 5), (6, 10)], [(1, 5), (6, 10)]),
        # One token far off pulls row 2's geometric mean out of the band: the whole row goes.
        ("seq_mask", [(2, 5)], [(2, t) for t in (4, 5, 6, 9, 10, 11)]),
    ],
)
def test_masking_modes_equal_a_loss_mask(mode, far_tokens, masked_instead):
  """A step whose sampler disagrees hugely on some tokens equals, under icepop or seq_mask, the
  uncorrected step on a batch whose loss mask drops exactly what the correction drops."""
  sgd = optax.sgd(1.0)  # parameter change = −gradient
  sampler = np.full((B, T), -np.log(MODEL.vocab_size), np.float32)
  for i, t in far_tokens:
    sampler[i, t] = FAR
  params_fix, metrics = run_step(
      grpo_cfg(rollout_correction=mode, rollout_correction_cap=10.0),
      make_batch(sampler_BxT=sampler),
      sgd,
  )
  loss = np.asarray(make_batch().loss_mask_BxT).copy()
  np.testing.assert_allclose(
      metrics["rollout_correction/masked_share"], len(masked_instead) / loss.sum(), rtol=1e-6
  )  # only what was meant: every other token's r lies in [0.1, 10]
  for i, t in masked_instead:
    loss[i, t] = 0
  params_mask, _ = run_step(grpo_cfg(), make_batch(loss_BxT=loss, sampler_BxT=sampler), sgd)
  params_all = uncorrected_sgd_step()
  moved = 0.0
  for fix, masked, full in zip(*map(jax.tree.leaves, (params_fix, params_mask, params_all))):
    np.testing.assert_allclose(fix, masked, rtol=1e-5, atol=1e-7)
    moved = max(moved, float(np.max(np.abs(masked - full))))
  assert moved > 1e-5  # the dropped tokens did carry gradient


def test_tis_weights_the_policy_loss_by_the_truncated_ratio():
  """At the first optimizer step the PPO ratio is 1, so the reported policy loss is
  Σ −A·min(r, C)·m / T: checked with the old log-probs from a plain forward pass, the GRPO
  advantages and the NumPy weights; the entropy term stays unweighted; the logged ratio
  statistics come from the same r."""
  cap = 1.5
  rng = np.random.RandomState(7)
  batch = make_batch()
  actor = models.create(MODEL, jax.random.key(0))
  logits = actor(batch.tokens_BxT, batch.attention_mask_BxT)
  lsm = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  old = jnp.take_along_axis(lsm, batch.tokens_BxT[:, 1:, None], -1)[..., 0]
  old = np.pad(np.asarray(old, np.float32), ((0, 0), (1, 0)))
  entropy = np.pad(np.asarray(-jnp.sum(jnp.exp(lsm) * lsm, -1)), ((0, 0), (1, 0)))
  sampler = (old + rng.uniform(-1.0, 1.0, old.shape)).astype(np.float32)
  m = np.asarray(batch.loss_mask_BxT)
  _, metrics = run_step(
      grpo_cfg(rollout_correction="tis", rollout_correction_cap=cap, entropy_coeff=0.01),
      batch.replace(logprobs_BxT=jnp.asarray(sampler)),
  )
  w = ref_weights(old, sampler, m, "tis", cap)
  adv_B = np.asarray(algos.grpo_advantages(batch.scores_B, batch.group_ids_B, True))
  want = np.sum(-adv_B[:, None] * w * m) / T
  np.testing.assert_allclose(metrics["actor/pg_loss"], want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["actor/entropy_loss"], np.sum(entropy * m) / T, rtol=1e-4)
  r = np.exp(old - sampler)[m > 0]
  np.testing.assert_allclose(metrics["rollout_correction/ratio_mean"], r.mean(), rtol=1e-4)
  np.testing.assert_allclose(metrics["rollout_correction/ratio_max"], r.max(), rtol=1e-4)
  share = np.mean(r > cap)
  assert 0 < share < 1
  np.testing.assert_allclose(metrics["rollout_correction/truncated_share"], share, atol=1e-6)

"""The policy-loss modes (`ppo.policy_loss`): GSPO and CISPO values, gradients and metrics against
NumPy loops with the hand-derived gradients, PPO unchanged, the modes' defaults, and the compiled
step under each (with rollout-correction weights, LoRA adapters and an 8-device mesh).

Dimensions: B rows (sequences), T token positions.
"""

import json
import os
import subprocess
import sys

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
import optax
import pytest

from ragen_jax import algos
from ragen_jax import models
from ragen_jax.algos import losses
from ragen_jax.config import schema
from ragen_jax.models import lora
from tiny import make_batch
from tiny import MODEL
from xla_devices import cpu_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The papers' and recipes' clip ranges, written out here rather than read from the library.
GSPO_CLIPS = (3e-4, 4e-4)
CISPO_CLIPS = (1.0, 0.2)

# ---------------------------------------------------------------- NumPy references


def agg_weights(m, agg):
  """d agg_loss / d L_it: token-mean 1/Σm; seq-mean-token-mean 1/(|y_i|·B), B the rows with a
  loss token."""
  if agg == "token-mean":
    return m / (m.sum() + 1e-8)
  n = m.sum(axis=1, keepdims=True)
  valid = (n > 0).astype(np.float64)
  return m / (n + 1e-8) * valid / (valid.sum() + 1e-8)


def masked(x, m):
  return float((x * m).sum() / (m.sum() + 1e-8))


def ref_gspo(logp, old, adv, m, agg, w=None, lo=GSPO_CLIPS[0], hi=GSPO_CLIPS[1]):
  """(loss, d loss/d logp, metrics) of GSPO-token, token by token.

  s_i = exp(Σ_t m (logp − old) / |y_i|); L = max(−A s_i, −A clip(s_i, 1 − lo, 1 + hi))·w, and by
  hand d L_it / d logp_it = −A_it s_i w_it on the unclipped branch, 0 where the clip binds.
  """
  b, t_len = logp.shape
  w = np.ones_like(logp) if w is None else w
  loss, dloss, clipped = np.zeros((b, t_len)), np.zeros((b, t_len)), np.zeros((b, t_len))
  s = np.ones(b)
  for i in range(b):
    n = m[i].sum()
    log_s = sum(logp[i, t] - old[i, t] for t in range(t_len) if m[i, t]) / max(n, 1)
    s[i] = np.exp(min(max(log_s, -20.0), 20.0))
    for t in range(t_len):
      a = adv[i, t]
      l1, l2 = -a * s[i], -a * min(max(s[i], 1 - lo), 1 + hi)
      clipped[i, t] = l2 > l1
      loss[i, t] = max(l1, l2) * w[i, t]
      dloss[i, t] = 0.0 if l2 > l1 else -a * s[i] * w[i, t]
  k = agg_weights(m, agg)
  rows = m.sum(axis=1) > 0
  metrics = {
      "pg_clipfrac": masked(clipped, m),
      "ppo_kl": masked(-(logp - old), m),
      "seq_ratio_mean": s[rows].mean(),
      "seq_ratio_min": s[rows].min(),
      "seq_ratio_max": s[rows].max(),
  }
  return (loss * k).sum(), dloss * k, metrics


def ref_cispo(logp, old, adv, m, w=None, lo=CISPO_CLIPS[0], hi=CISPO_CLIPS[1]):
  """(loss, d loss/d logp, metrics) of CISPO with token-mean: L = −ŵ A logp·w with the detached
  ŵ = clip(r, 1 − lo, 1 + hi), so d loss/d logp_it = −ŵ_it A_it w_it / Σm."""
  w = np.ones_like(logp) if w is None else w
  r = np.exp(np.clip(logp - old, -20.0, 20.0))
  what = np.clip(r, 1 - lo, 1 + hi)
  k = agg_weights(m, "token-mean")
  metrics = {
      "pg_clipfrac": masked((r < 1 - lo) | (r > 1 + hi), m),
      "ppo_kl": masked(-(logp - old), m),
      "is_weight_mean": masked(what, m),
  }
  return (-what * adv * logp * w * k).sum(), -what * adv * w * k, metrics


def ref_grpo(scores, groups):
  """GRPO's per-episode advantage: (s − group mean) / (unbiased group std + 1e-6)."""
  out = np.zeros(len(scores))
  for g in np.unique(groups):
    idx = groups == g
    out[idx] = (scores[idx] - scores[idx].mean()) / (scores[idx].std(ddof=1) + 1e-6)
  return out


# ---------------------------------------------------------------- data


def gspo_data(seed=0):
  """Rows whose sequence log-ratios are set (inside GSPO's clip range, above, below), per-token
  noise of zero row mean (token ratios far from 1), per-token advantages, an empty row."""
  rng = np.random.RandomState(seed)
  b, t_len = 7, 9
  m = (rng.rand(b, t_len) > 0.3).astype(np.float64)
  m[:, 0] = 1.0
  m[5] = 0.0
  row_log_s = np.array([0.0, 1e-4, -2e-4, 0.05, -0.05, 0.0, 0.3])
  noise = rng.normal(0.0, 0.5, (b, t_len))
  noise -= (noise * m).sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1) * m
  logp = -rng.uniform(0.1, 3.0, (b, t_len))
  old = logp - (row_log_s[:, None] + noise) * m
  adv = rng.normal(0.0, 1.0, (b, t_len))
  w = rng.uniform(0.0, 2.0, (b, t_len))
  return [x.astype(np.float32).astype(np.float64) for x in (logp, old, adv, m, w)]


def cispo_data(seed=1):
  """Token log-ratios from −6 (a ratio near 0: no lower bound to hit) to +1 (above 1 + ε_high)."""
  rng = np.random.RandomState(seed)
  b, t_len = 5, 8
  m = (rng.rand(b, t_len) > 0.25).astype(np.float64)
  logp = -rng.uniform(0.1, 3.0, (b, t_len))
  old = logp - rng.uniform(-6.0, 1.0, (b, t_len))
  adv = rng.normal(0.0, 1.0, (b, t_len))
  w = rng.uniform(0.0, 2.0, (b, t_len))
  return [x.astype(np.float32).astype(np.float64) for x in (logp, old, adv, m, w)]


def loss_and_grad(logp, old, adv, m, w, **kwargs):
  f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
  fn = lambda lp: losses.policy_loss(lp, f32(old), f32(adv), f32(m), weights_BxT=f32(w), **kwargs)
  (value, metrics), grad = jax.value_and_grad(fn, has_aux=True)(f32(logp))
  return float(value), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


# ---------------------------------------------------------------- the losses


@pytest.mark.parametrize("agg", [None, "token-mean"])  # None: GSPO's own seq-mean-token-mean
@pytest.mark.parametrize("weighted", [False, True])
def test_gspo_matches_the_reference_in_value_gradient_and_metrics(agg, weighted):
  logp, old, adv, m, w = gspo_data()
  w = w if weighted else None
  value, grad, metrics = loss_and_grad(logp, old, adv, m, w, mode="gspo", agg_mode=agg)
  want, want_grad, want_metrics = ref_gspo(logp, old, adv, m, agg or "seq-mean-token-mean", w)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)
  for key, expected in want_metrics.items():
    np.testing.assert_allclose(metrics[key], expected, rtol=1e-5, atol=1e-7, err_msg=key)
  assert metrics["pg_loss"] == value
  # The data reach both branches: clipped tokens (no gradient) and unclipped ones.
  on = (m > 0) & (adv != 0)
  assert (grad[on] == 0).any() and (grad[on] != 0).any()


def test_gspo_gradient_is_the_rows_ratio_over_its_length_and_the_row_count():
  """Unclipped and unweighted: d loss/d logp_it = −A_it s_i / (|y_i| B), whatever the token's
  own ratio (rows 0-2 lie inside the clip range; their token ratios do not)."""
  logp, old, adv, m, _ = gspo_data()
  _, grad, _ = loss_and_grad(logp, old, adv, m, None, mode="gspo")
  n_B, rows = m.sum(1), (m.sum(1) > 0).sum()
  for i in range(3):
    s_i = np.exp(np.sum((logp[i] - old[i]) * m[i]) / n_B[i])
    np.testing.assert_allclose(grad[i], -adv[i] * s_i / (n_B[i] * rows) * m[i], rtol=1e-4)
  assert np.ptp(np.exp(logp - old)[:3][m[:3] > 0]) > 1.0


@pytest.mark.parametrize("weighted", [False, True])
def test_cispo_matches_the_reference_in_value_gradient_and_metrics(weighted):
  logp, old, adv, m, w = cispo_data()
  w = w if weighted else None
  value, grad, metrics = loss_and_grad(logp, old, adv, m, w, mode="cispo")
  want, want_grad, want_metrics = ref_cispo(logp, old, adv, m, w)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-8)
  for key, expected in want_metrics.items():
    np.testing.assert_allclose(metrics[key], expected, rtol=1e-5, atol=1e-7, err_msg=key)
  # Every loss token keeps a gradient, those whose weight was clipped at 1 + ε_high included,
  # and no weight is raised to a lower bound (ε_low = 1: the bound is 0).
  ratio = np.exp(logp - old)
  assert (ratio[m > 0] > 1.2).any() and (ratio[m > 0] < 0.01).any()
  assert np.all(grad[(m > 0) & (adv != 0)] != 0)


def test_cispo_equals_ppo_on_policy_and_leaves_a_gradient_where_ppo_has_none():
  logp, old, adv, m, _ = cispo_data()
  _, ppo_grad, _ = loss_and_grad(logp, logp, adv, m, None, mode="ppo")
  _, cispo_grad, _ = loss_and_grad(logp, logp, adv, m, None, mode="cispo")
  np.testing.assert_allclose(cispo_grad, ppo_grad, rtol=1e-6, atol=1e-9)
  # Off policy, PPO zeroes the tokens whose clip binds; CISPO trains them with the capped weight.
  _, ppo_grad, ppo_metrics = loss_and_grad(logp, old, adv, m, None, mode="ppo")
  _, cispo_grad, _ = loss_and_grad(logp, old, adv, m, None, mode="cispo")
  zeroed = (m > 0) & (adv != 0) & (ppo_grad == 0)
  assert ppo_metrics["pg_clipfrac"] > 0 and zeroed.any()
  assert np.all(cispo_grad[zeroed] != 0)


def test_ppo_mode_is_the_default_bit_for_bit():
  logp, old, adv, m, w = gspo_data()
  args = [jnp.asarray(x, jnp.float32) for x in (old, adv, m)]
  clips = dict(clip_low=0.2, clip_high=0.28, clip_c=3.0)

  def run(**kwargs):
    fn = lambda lp: losses.policy_loss(lp, *args, weights_BxT=jnp.asarray(w, jnp.float32), **kwargs)
    (value, metrics), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(
        jnp.asarray(logp, jnp.float32)
    )
    return jax.tree.map(np.asarray, (value, metrics, grad))

  base = run(**clips)
  for other in (run(**clips, mode="ppo"), run(clip_c=3.0), run(clip_c=3.0, agg_mode="token-mean")):
    jax.tree.map(np.testing.assert_array_equal, other, base)
  assert set(base[1]) == {"pg_loss", "ppo_kl", "pg_clipfrac", "pg_clipfrac_lower"}


# ---------------------------------------------------------------- the settings


def test_each_mode_fills_what_is_left_unset_and_keeps_what_is_set():
  policy = lambda **kw: algos.PPOConfig(**kw).policy
  assert policy() == ("ppo", 0.2, 0.28, 3.0, "token-mean")
  assert policy(policy_loss="gspo") == ("gspo", *GSPO_CLIPS, 3.0, "seq-mean-token-mean")
  assert policy(policy_loss="cispo") == ("cispo", *CISPO_CLIPS, 3.0, "token-mean")
  assert policy(policy_loss="gspo", clip_high=1e-3, agg_mode="token-mean") == (
      "gspo",
      GSPO_CLIPS[0],
      1e-3,
      3.0,
      "token-mean",
  )
  assert policy(policy_loss="cispo", clip_low=10.0).clip_low == 10.0  # verl's example's "none"
  # The unset knobs stay None: changing the mode afterwards takes the new mode's defaults.
  cfg = algos.PPOConfig()
  assert (cfg.clip_low, cfg.clip_high, cfg.agg_mode) == (None, None, None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(policy_loss="grpo"), r"^ppo\.policy_loss must be one of \('ppo', 'gspo', 'cispo'\)"),
        (dict(clip_low=1.0), r"^ppo\.clip_low must be a finite number in \(0, 1\), got 1\.0$"),
        (dict(policy_loss="gspo", clip_low=1.5), r"^ppo\.clip_low must be .* in \(0, 1\)"),
        (dict(policy_loss="cispo", clip_low=0.0), r"^ppo\.clip_low must be a finite number > 0"),
        (dict(clip_high=float("nan")), r"^ppo\.clip_high must be a finite number > 0, got nan$"),
        (dict(agg_mode="mean"), r"^ppo\.agg_mode must be one of \('token-mean'"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    algos.PPOConfig(**kwargs)


def test_the_command_line_picks_the_mode_and_overrides_its_clip(monkeypatch):
  argv = [
      "launch.py",
      f"--config={ROOT}/configs/sokoban_ppo.py:smoke",
      "--config.ppo.policy_loss=gspo",
      "--config.ppo.clip_high=0.001",
  ]
  monkeypatch.setattr(sys, "argv", argv)  # the config flag reads its overrides from sys.argv
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
  values(argv)
  ppo = schema.from_config(values.config).ppo
  assert ppo.policy == ("gspo", GSPO_CLIPS[0], 0.001, 3.0, "seq-mean-token-mean")


# ---------------------------------------------------------------- the compiled step


def logp_of(actor, params, batch):
  """Each position's log-prob of its token under `params` (full logits; position 0 gets 0)."""
  graphdef, _, rest = nnx.split(actor, nnx.Param, ...)
  logits = nnx.merge(graphdef, params, rest)(batch.tokens_BxT, batch.attention_mask_BxT)
  lsm = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  logp = jnp.take_along_axis(lsm, batch.tokens_BxT[:, 1:, None], -1)[..., 0]
  return jnp.pad(logp, ((0, 0), (1, 0)))


def flat(tree):
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {jax.tree_util.keystr(p): np.asarray(x, np.float64) for p, x in leaves}


LR = 10.0  # plain SGD: the parameters move by −LR·gradient, large against float32 rounding


@pytest.mark.parametrize(
    "mode, adapters, rollout_correction",
    [
        ("gspo", False, "tis"),  # on policy (s = 1), rollout-correction weights
        ("cispo", False, "none"),  # off policy: the sampler's log-probs as the old ones
        ("gspo", True, "none"),  # off policy, rows inside and outside the clip, LoRA
    ],
)
def test_one_step_moves_the_weights_along_the_hand_derived_gradient(
    mode, adapters, rollout_correction
):
  """One SGD step of the jitted train step against −LR·∇θ Σ_it g_it·logp_it(θ), g the NumPy
  reference's d loss/d logp at the step's start: the mode, its defaults, the rows' sequence
  ratios, the weights and the aggregation all reach the update."""
  actor = models.create(MODEL, jax.random.key(0))
  if adapters:
    actor = lora.add(actor, models.LoraConfig(rank=4, alpha=8.0), jax.random.key(3))
  cfg = algos.PPOConfig(
      adv_estimator="grpo",
      policy_loss=mode,
      num_minibatches=1,
      entropy_coeff=0.0,
      vocab_chunk=32,
      recompute_old_logprobs=rollout_correction != "none",
      rollout_correction=rollout_correction,
  )
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  batch = make_batch()
  logp = np.asarray(logp_of(actor, state.actor_params, batch), np.float64)
  m = np.asarray(batch.loss_mask_BxT, np.float64)
  rng = np.random.RandomState(4)
  # The sampler's log-probs: per-row offsets (GSPO rows inside, above and below its clip range)
  # plus per-token noise of zero row mean.
  row_offset = np.array([0.0, 1e-4, 0.05, -0.05, 0.0, 2e-4, 0.5, -0.3])[:, None]
  noise = rng.normal(0.0, 0.3, logp.shape) * m
  noise -= noise.sum(1, keepdims=True) / m.sum(1, keepdims=True) * m
  sampler = (logp - row_offset - noise) * m
  batch = batch.replace(logprobs_BxT=jnp.asarray(sampler, jnp.float32))
  scores, groups = np.asarray(batch.scores_B), np.asarray(batch.group_ids_B)
  adv = ref_grpo(scores, groups)[:, None] * m
  if rollout_correction == "tis":  # old = the recomputed log-probs; weights min(r, 2)
    old, w = logp, np.minimum(np.exp(logp - sampler), 2.0) * m
  else:
    old, w = sampler, None
  if mode == "gspo":
    _, g, want = ref_gspo(logp, old, adv, m, "seq-mean-token-mean", w)
  else:
    _, g, want = ref_cispo(logp, old, adv, m, w)
  surrogate = lambda p: jnp.sum(jnp.asarray(g, jnp.float32) * logp_of(actor, p, batch))
  ref_grads = flat(jax.jit(jax.grad(surrogate))(state.actor_params))

  step = algos.make_train_step(actor, None, cfg, actor_tx=optax.sgd(LR))
  before = flat(state.actor_params)
  state, metrics = step(state, batch, jax.random.key(2))  # the state is donated
  after = flat(state.actor_params)
  trained = [k for k in after if not adapters or "_lora_" in k]
  scale = max(np.abs(ref_grads[k]).max() for k in trained)
  for key in after:
    if key in trained:
      np.testing.assert_allclose(
          after[key] - before[key], -LR * ref_grads[key], atol=1e-4 * LR * scale, err_msg=key
      )
    else:
      np.testing.assert_array_equal(after[key], before[key], err_msg=key)  # the frozen base
  assert scale > 1e-3  # a real update
  for key, value in want.items():
    np.testing.assert_allclose(float(metrics[f"actor/{key}"]), value, rtol=1e-3, atol=1e-5)
  if mode == "gspo" and rollout_correction == "none":
    assert 0 < want["pg_clipfrac"] < 1  # both branches in the step


_MESH_SCRIPT = """
import json, sys
import jax, numpy as np, optax
from ragen_jax import algos, models, sharding
from tiny import MODEL, make_batch

actor = models.create(MODEL, jax.random.key(0))
cfg = algos.PPOConfig(adv_estimator="grpo", policy_loss="gspo", num_minibatches=2, vocab_chunk=32)
out = {}
for shape in [(1, 1, 1), (4, 2, 1)]:
  sharder = sharding.Sharder(
      sharding.MeshSpec(*shape), devices=jax.devices()[: int(np.prod(shape))]
  )
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  state_sharding = sharder.tree(state)
  state = jax.device_put(state, state_sharding)
  batch = make_batch()
  batch = jax.device_put(batch, sharder.batch_tree(batch))
  step = algos.make_train_step(
      actor, None, cfg, actor_tx=optax.sgd(1.0),
      out_shardings=(state_sharding, sharder.replicated),
  )
  state, metrics = step(state, batch, jax.random.key(2))
  leaves = jax.tree.leaves(jax.device_get(state.actor_params))
  out[str(shape)] = {
      "devices": len(jax.tree.leaves(state.actor_params)[0].sharding.device_set),
      "metrics": {k: float(v) for k, v in jax.device_get(metrics).items()},
      "params": [np.asarray(x, np.float64).ravel()[:64].tolist() for x in leaves],
  }
print("RESULT " + json.dumps(out))
"""


def test_the_gspo_step_on_an_8_device_mesh_equals_one_device():
  env = cpu_devices(8)
  env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])
  proc = subprocess.run(
      [sys.executable, "-c", _MESH_SCRIPT],
      env=env,
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  one, mesh = json.loads(lines[0][len("RESULT ") :]).values()
  assert (one["devices"], mesh["devices"]) == (1, 8)
  assert mesh["metrics"]["train/num_updates"] == 2.0
  for key, value in one["metrics"].items():
    np.testing.assert_allclose(mesh["metrics"][key], value, rtol=1e-4, atol=1e-6, err_msg=key)
  for a, b in zip(one["params"], mesh["params"]):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  # The second minibatch is off policy: its rows' sequence ratios moved away from 1.
  assert one["metrics"]["actor/seq_ratio_max"] > 1.0

"""Checkpoints: exact round trip of a real TrainState, last-k retention, refusals and mismatches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import checkpoints
from ragen_jax import models
import tiny  # pylint: disable=g-bad-import-order


@pytest.fixture(scope="module")
def train_state():
  config = tiny.model_config(
      hidden_size=16,
      intermediate_size=32,
      num_layers=1,
      head_dim=8,
      rms_norm_eps=1e-6,
      max_position_embeddings=64,
  )
  actor = models.create(config, jax.random.PRNGKey(0))
  cfg = algos.PPOConfig(adv_estimator="gae")
  return config, algos.init_train_state(actor, None, cfg, jax.random.PRNGKey(1))


def _assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)


def test_round_trip_keeps_last_k_and_metadata(tmp_path, train_state):
  _, state = train_state
  ckpt = checkpoints.Checkpointer(tmp_path / "ckpt", keep=2)
  assert ckpt.latest_step() is None
  for step in (1, 2, 3):
    bumped = state.replace(step=jnp.int32(step))
    ckpt.save(step, {"train": bumped, "rng": jax.random.key(step)}, meta={"seed_counter": step})
  assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
  like = {"train": state, "rng": jax.random.key(0)}
  restored, meta = ckpt.restore(like)
  assert meta == {"seed_counter": 3}
  assert type(restored["train"]) is type(state) and int(restored["train"].step) == 3
  _assert_same(restored["train"].actor_params, state.actor_params)
  _assert_same(restored["train"].critic_opt, state.critic_opt)
  np.testing.assert_array_equal(
      jax.random.key_data(restored["rng"]), jax.random.key_data(jax.random.key(3))
  )
  older, _ = ckpt.restore(like, step=2)
  assert int(older["train"].step) == 2
  with pytest.raises(FileNotFoundError, match="step 1"):
    ckpt.restore(like, step=1)
  # A new Checkpointer on the same directory (as in a new process) restores what is on disk,
  # into an abstract state (jax.eval_shape) too, and reads the metadata alone.
  fresh = checkpoints.Checkpointer(tmp_path / "ckpt")
  assert fresh.latest_step() == 3 and fresh.meta() == {"seed_counter": 3}
  abstract = jax.eval_shape(lambda: like)
  again, _ = fresh.restore(abstract)
  _assert_same(again["train"].actor_params, restored["train"].actor_params)
  np.testing.assert_array_equal(
      jax.random.key_data(again["rng"]), jax.random.key_data(jax.random.key(3))
  )
  fresh.close()


def test_refuses_non_finite_state(tmp_path, train_state):
  _, state = train_state
  ckpt = checkpoints.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, state)
  params = jax.tree.map(lambda x: x, state.actor_params)
  leaf_path, leaf = jax.tree_util.tree_flatten_with_path(params)[0][0]
  bad = jax.tree_util.tree_map_with_path(
      lambda p, x: x.at[(0,) * x.ndim].set(jnp.nan) if p == leaf_path else x, params
  )
  with pytest.raises(checkpoints.NonFiniteError, match="NaN or inf"):
    ckpt.save(2, state.replace(actor_params=bad))
  assert ckpt.all_steps() == [1]  # The good checkpoint is untouched.


def test_mismatched_checkpoint_names_the_entry(tmp_path, train_state):
  config, state = train_state
  ckpt = checkpoints.Checkpointer(tmp_path / "ckpt")
  ckpt.save(5, state)
  wider = models.create(config.replace(hidden_size=32, head_dim=16), jax.random.PRNGKey(0))
  other = algos.init_train_state(
      wider, None, algos.PPOConfig(adv_estimator="gae"), jax.random.PRNGKey(1)
  )
  with pytest.raises(
      ValueError,
      match=r"does not fit this run: .*\['embedding'\] is "
      r"float32\[64, 16\] there but float32\[64, 32\] here",
  ):
    ckpt.restore(other)
  no_critic = algos.init_train_state(
      models.create(config, jax.random.PRNGKey(0)),
      None,
      algos.PPOConfig(adv_estimator="grpo"),
      jax.random.PRNGKey(1),
  )
  with pytest.raises(ValueError, match="unexpected entry .*critic"):
    ckpt.restore(no_critic)


@pytest.mark.parametrize("moment_dtype", ["float32", "bfloat16"])
def test_bfloat16_parameters_round_trip_exactly_and_other_dtypes_are_refused(
    tmp_path, train_state, moment_dtype
):
  config, f32_state = train_state
  actor = models.create(config, jax.random.PRNGKey(0), param_dtype=jnp.bfloat16)
  cfg = algos.PPOConfig(adv_estimator="gae", moment_dtype=moment_dtype)
  fresh = algos.init_train_state(actor, None, cfg, jax.random.PRNGKey(1))
  # Random bits in every floating leaf (moments included), each in its own dtype.
  leaves, treedef = jax.tree.flatten(fresh)
  keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
  state = jax.tree.unflatten(
      treedef,
      [
          jax.random.normal(k, x.shape).astype(x.dtype)
          if jnp.issubdtype(x.dtype, jnp.floating)
          else x
          for k, x in zip(keys, leaves)
      ],
  )
  assert state.actor_params["decoder"]["embedding"].dtype == jnp.bfloat16
  assert state.actor_opt[1][0].nu["decoder"]["embedding"].dtype == jnp.dtype(moment_dtype)
  ckpt = checkpoints.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, state)
  restored, _ = ckpt.restore(jax.eval_shape(lambda: fresh))
  _assert_same(restored, state)  # bit for bit
  assert jax.tree.map(lambda x: x.dtype, restored) == jax.tree.map(lambda x: x.dtype, state)
  # Restoring into a float32 run (another param_dtype, which config.drift refuses first) names
  # the first entry whose dtype differs instead of converting.
  with pytest.raises(ValueError, match=r"does not fit this run: .* is bfloat16\[.*\] there but "):
    ckpt.restore(f32_state)

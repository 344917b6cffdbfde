"""The contract shared by every environment: make(), determinism, jit/vmap equivalence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import envs

SMALL = {"sokoban": {}, "frozenlake": {}, "bandit": {}, "2048": {}}


def test_make_errors_name_the_problem():
  with pytest.raises(
      ValueError,
      match=(
          r"valid names: \['2048', 'bandit', 'code', 'countdown', 'frozenlake', 'math', "
          r"'search', 'sokoban', 'sudoku', 'visual_frozenlake', 'visual_sokoban'\]"
      ),
  ):
    envs.make("sokobann")
  with pytest.raises(ValueError, match="'dimroom'.*valid options"):
    envs.make("sokoban", dimroom=(6, 6))
  with pytest.raises(ValueError, match="num_boxes"):
    envs.make("sokoban", dim_room=(4, 4), num_boxes=3)
  with pytest.raises(ValueError, match="success_rate"):
    envs.make("frozenlake", success_rate=1.5)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_key_same_start_and_vmap_matches_unbatched(name):
  env = envs.make(name, **SMALL[name])
  keys = jax.random.split(jax.random.PRNGKey(11), 6)
  reset = jax.jit(jax.vmap(env.reset))
  batch = reset(keys)
  again = reset(keys)
  jax.tree.map(np.testing.assert_array_equal, batch, again)
  # reset_batch is the same function of the keys (Sokoban's own batched generator included).
  jax.tree.map(np.testing.assert_array_equal, batch, jax.jit(env.reset_batch)(keys))
  texts = [env.render(jax.tree.map(lambda x, i=i: x[i], batch)) for i in range(6)]
  assert len(set(texts)) > 1  # Different keys, different starts.
  # A group shares its start state by sharing the reset key (batch of 6: no second compile).
  group = reset(jnp.stack([keys[2]] * 6))
  assert {env.render(jax.tree.map(lambda x, i=i: x[i], group)) for i in range(6)} == {texts[2]}

  step_keys = jax.random.split(jax.random.PRNGKey(5), 6)
  actions = jnp.array([0, 1, 2, 3, 1, 0]) % env.num_actions
  vs, vr, vd, vi = jax.jit(jax.vmap(env.step))(step_keys, batch, actions)
  for i in range(6):
    s, r, d, info = env.step(step_keys[i], jax.tree.map(lambda x, i=i: x[i], batch), actions[i])
    assert env.render(s) == env.render(jax.tree.map(lambda x, i=i: x[i], vs))
    assert float(r) == pytest.approx(float(vr[i])) and bool(d) == bool(vd[i])
    for k in ("success", "action_is_effective", "action_is_valid"):
      assert bool(info[k]) == bool(vi[k][i])
    assert vr.dtype == jnp.float32 and vd.dtype == jnp.bool_

"""The train step with LoRA adapters: only adapters are differentiated, updated and given
optimizer moments; the KL reference is the frozen base.

Dimensions: B episodes, T tokens.
"""

import jax
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax import sharding
from ragen_jax.models import lora
from tiny import make_batch
from tiny import MODEL


def flat(tree):
  return {
      jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)
  }


def test_one_step_trains_only_the_adapters_against_the_frozen_base():
  actor = lora.add(
      models.create(MODEL, jax.random.key(0)),
      models.LoraConfig(rank=4, alpha=8.0),
      jax.random.key(3),
  )
  cfg = algos.PPOConfig(
      num_minibatches=1,
      micro_batches=2,
      ppo_epochs=1,
      actor_lr=1e-2,
      vocab_chunk=32,
      filter_include_zero=False,
      use_kl_loss=True,
      kl_coef=0.5,
  )
  state = algos.init_train_state(actor, None, cfg, jax.random.key(1))
  assert state.ref_params is None  # no second copy of the base weights
  adapters, base = lora.partition(state.actor_params)
  adapter_shapes = {x.shape for x in jax.tree.leaves(adapters)}
  assert len(jax.tree.leaves(adapters)) == 14 and base
  # AdamW's moments exist for the adapters only.
  opt_shapes = {x.shape for x in jax.tree.leaves(state.actor_opt) if np.ndim(x)}
  assert opt_shapes == adapter_shapes
  before = flat(state.actor_params)
  step = algos.make_train_step(actor, None, cfg)
  state, metrics = step(state, make_batch(), jax.random.key(0))
  after = flat(state.actor_params)
  assert before.keys() == after.keys()
  for key, value in after.items():
    if "_lora_" in key:
      continue
    np.testing.assert_array_equal(value, before[key], err_msg=key)  # base: bitwise frozen
  changed = [k for k in after if k.endswith("_lora_b']") and np.abs(after[k] - before[k]).max() > 0]
  assert len(changed) == 7
  # The one update is computed with B = 0: the policy is the reference, the KL exactly 0.
  assert float(metrics["actor/kl_loss"]) == 0.0
  assert float(metrics["train/num_updates"]) == 1.0
  assert {x.shape for x in jax.tree.leaves(state.actor_opt) if np.ndim(x)} == adapter_shapes


def test_adapters_and_their_moments_get_logical_axes_on_a_mesh():
  table = sharding.param_axes()
  assert table[("decoder", "layers", "q_lora_a")] == ("layers", "embed", None)
  assert table[("decoder", "layers", "q_lora_b")] == ("layers", None, "heads", "head_dim")
  assert table[("decoder", "layers", "o_lora_a")] == ("layers", "heads", "head_dim", None)
  assert table[("decoder", "layers", "down_lora_b")] == ("layers", None, "embed")

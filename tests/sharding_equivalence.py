"""Runs one rollout and one train step of the `:smoke` config on several meshes; prints JSON.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_equivalence.py \
      1,1,1 8,1,1 2,2,2

Run by tests/sharding_test.py in a subprocess (the device count is fixed when JAX starts). For
each mesh (data, fsdp, tensor) over the first data x fsdp x tensor devices: the shipped warm start
is loaded straight into its shardings, plays one rollout (2 groups x 4 episodes) with the same
key, and takes one StarPO step on the *first mesh's* rollout batch, so the update is compared on
identical inputs. Prints {mesh: {tokens, rollout metrics, train metrics, the updates of actor
and critic (`update_summary`)}}.
"""

import json
import sys

import jax
import numpy as np

from ragen_jax import algos
from ragen_jax import rollout as rollout_lib
from ragen_jax import sharding
from ragen_jax.config import schema
from ragen_jax.train import batching
from ragen_jax.config import cli
from ragen_jax.train import policy as policy_lib


def update_summary(before, after):
  """Per parameter leaf: the update's norm, its projections on 4 fixed random directions (seeded
  by the leaf's index, so the same on every mesh) and the start's projection on the first.

  A projection of the whole update changes with any element of it, by the element's change times
  its random weight, where per-leaf sums of absolute values (which one Adam step moves by only a
  few parts in a million) hardly notice a wrong or missing update.
  """
  out = []
  for k, (x0, x1) in enumerate(zip(jax.tree.leaves(before), jax.tree.leaves(after))):
    x0 = np.asarray(x0, np.float64).ravel()
    delta = np.asarray(x1, np.float64).ravel() - x0  # exact: float32 values
    r_4xN = np.random.default_rng(k).standard_normal((4, x0.size))
    out.append(
        {
            "norm": float(np.linalg.norm(delta)),
            "proj": (r_4xN @ delta).tolist(),
            "start": float(r_4xN[0] @ x0),
        }
    )
  return out


def run(mesh_shape, reference_batch=None):
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  with config.unlocked():
    config.rollout.group_size = 4  # 2 groups x 4 = 8 episodes: divides every mesh
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
  exp = schema.from_config(config)
  n = int(np.prod(mesh_shape))
  sharder = sharding.Sharder(exp.mesh, devices=jax.devices()[:n])
  model, tok = policy_lib.build(exp, sharder)
  kernel = model.decoder.layers.q_kernel[...]
  spec = exp.envs[0]
  engine = rollout_lib.Rollout(spec.make(), tok, spec.rollout_config(exp.rollout, False), sharder)
  # Levels 10007-10008: one group mixes solved and failed episodes, so the advantages are not all
  # zero and the update compared below is a real one, not float noise around zero.
  result = engine.run(rollout_lib.ModelPolicy(model), jax.random.key(7), seed=10007)
  if np.ptp(result.metrics["return"]) < 1.0:
    raise SystemExit(
        "the rollout's returns barely differ: the update would be noise; pick other levels"
    )
  batch = batching.join_batches([result.batch], exp.trainer.pad_multiple, tok.pad_id)
  if reference_batch is None:
    reference_batch = batch
  like = jax.eval_shape(lambda: algos.init_train_state(model, None, exp.ppo, jax.random.key(1)))
  state_sharding = sharder.tree(like)
  state = jax.device_put(
      algos.init_train_state(model, None, exp.ppo, jax.random.key(1)), state_sharding
  )
  step = algos.make_train_step(
      model, None, exp.ppo, out_shardings=(state_sharding, sharder.replicated)
  )
  ref = jax.device_put(reference_batch, sharder.batch_tree(reference_batch))
  before = jax.device_get((state.actor_params, state.critic_params))  # host copies: donated
  state, metrics = step(state, ref, jax.random.key(3))
  after = jax.device_get((state.actor_params, state.critic_params))
  return reference_batch, {
      "param_sharding": str(kernel.sharding.spec),
      "devices": len(kernel.sharding.device_set),
      "tokens": np.asarray(batch.tokens_BxT).tolist(),
      "rollout": {k: float(np.mean(v)) for k, v in result.metrics.items()},
      "train": {k: float(v) for k, v in jax.device_get(metrics).items()},
      "actor": update_summary(before[0], after[0]),
      "critic": update_summary(before[1], after[1]),
  }


def main(argv):
  out, reference = {}, None
  for arg in argv:
    shape = tuple(int(x) for x in arg.split(","))
    reference, out[arg] = run(shape, reference)
  print("RESULT " + json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1:])

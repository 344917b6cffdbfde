"""A tiny Qwen2.5-VL's train state placed on a data x fsdp x tensor mesh as the trainer places it;
prints JSON: the logits with images against one device's, and each tower parameter's split.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_vision.py

Run by tests/sharding_test.py in a subprocess (the device count is fixed when JAX starts). The
parameters are created on one device, then the TrainState is placed with `Sharder.tree` (the
trainer's shardings, from `sharding.param_axes`), so a tower parameter the table lacks stays
whole on every device, AdamW's moments with it. Four rows of two 84x84 frames each, the rows
over data x fsdp.

Dimension legend: B rows, N frames a row, T tokens, V vocab.
"""

import json

import jax
import numpy as np

from ragen_jax import algos
from ragen_jax import models
from ragen_jax import sharding
from ragen_jax.algos.step_records import ModelGraph


def forward(graph, params, ids_BxT, mask_BxT, frames_BxNxHxWx3):
  model = graph.merge(params)
  hidden_BxTxD, _ = model.frames_backbone(ids_BxT, mask_BxT, frames_BxNxHxWx3, False)
  return model.logits(hidden_BxTxD)


def split(array) -> dict:
  return {
      "spec": [None if p is None else str(p) for p in array.sharding.spec],
      "shape": list(array.shape),
      "shard": list(array.addressable_shards[0].data.shape),
  }


def main():
  config = models.get_config("tiny-vl")
  v = config.vision
  block = [v.vision_start_token_id] + [v.image_token_id] * 9 + [v.vision_end_token_id]
  ids_BxT = np.tile(np.asarray([5] + block + [7, 8] + block + [9], np.int32), (4, 1))
  mask_BxT = np.ones_like(ids_BxT)
  frames_BxNxHxWx3 = np.random.default_rng(0).integers(0, 256, (4, 2, 84, 84, 3), np.uint8)
  model = models.create("tiny-vl", jax.random.key(0))
  state = algos.init_train_state(
      model, None, algos.PPOConfig(adv_estimator="grpo"), jax.random.key(1)
  )
  graph = ModelGraph.of(model)
  step = jax.jit(lambda params, *inputs: forward(graph, params, *inputs))
  logits_BxTxV = np.asarray(step(state.actor_params, ids_BxT, mask_BxT, frames_BxNxHxWx3))

  sharder = sharding.Sharder(sharding.MeshSpec(data=2, fsdp=2, tensor=2))
  sharder.check_model(config)
  placed = jax.device_put(state, sharder.tree(state))
  batch = [jax.device_put(x, sharder.batch_tree(x)) for x in (ids_BxT, mask_BxT)]
  frames = jax.device_put(frames_BxNxHxWx3, sharder.batch_tree(frames_BxNxHxWx3))
  sharded_BxTxV = np.asarray(step(placed.actor_params, *batch, frames))
  tower = {name: split(a) for name, a in placed.actor_params["visual"].items()}
  # AdamW's first moment of each tower parameter (the optimizer's tree holds the frozen tower).
  moments = {}
  for path, a in jax.tree_util.tree_leaves_with_path(placed.actor_opt):
    keys = [getattr(k, "key", None) for k in path]
    if "visual" in keys and "mu" in [getattr(k, "name", None) for k in path]:
      moments[keys[-1]] = split(a)
  result = {
      "devices": len(jax.devices()),
      "max_abs_diff": float(np.max(np.abs(sharded_BxTxV - logits_BxTxV))),
      "max_abs_logit": float(np.max(np.abs(logits_BxTxV))),
      "tower": tower,
      "moments": moments,
  }
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()

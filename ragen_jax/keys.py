"""Every random stream and level seed of a run, named, from the config's seeds (`seed.*`).

A run's randomness is a function of (seed.init, step): a resumed run replays exactly what the
uninterrupted run would have done. Streams are separated by folding a fixed salt into a key;
the salts are arbitrary constants, kept as they are so that runs stay reproducible.

    base = keys.base(exp.seed)                  # stored in every checkpoint (RunState.key)
    k = keys.step(base, step)                   # everything sampled during one training step
    keys.rollout(k, tag_index); keys.update(k)  # a tag's episodes; the update's shuffling
    keys.level_seeds_of_step(exp, step)         # {tag: first level seed of its groups}
    keys.sampling_round(k, r); keys.level_seeds_of_round(exp, step, r)  # dynamic sampling
"""

from typing import Dict

import jax
import numpy as np

# Salts of the named streams.
_STATE_INIT = 1  # the TrainState's initialisation (a separate critic's weights)
_UPDATE = 1000003  # minibatch shuffling inside the train step
_COLLAPSE = 0x4D49  # ("MI") the pairs RAGEN-2's mutual-information family samples
_VALIDATION = 7919  # validation sampling (the same at every validation)
_SAMPLING_ROUND = 0x5246  # ("RF") the refill rounds of dynamic sampling
# Dynamic sampling's refill levels start this far above `seed.train`: apart from the levels the
# training counter reaches (2^28 / groups-per-step steps) and inside int32 (jax.random.key).
_REFILL_LEVELS = 1 << 28


def base(seed) -> jax.Array:
  """The run's base key (`seed.init`)."""
  return jax.random.key(seed.init)


def state_init(base_key: jax.Array) -> jax.Array:
  return jax.random.fold_in(base_key, _STATE_INIT)


def step(base_key: jax.Array, step_index: int) -> jax.Array:
  """The key of training step `step_index` (1-based), from which its streams fold."""
  return jax.random.fold_in(base_key, step_index)


def rollout(step_key: jax.Array, tag_index: int) -> jax.Array:
  """Sampling of the episodes of the `tag_index`-th environment tag."""
  return jax.random.fold_in(step_key, tag_index)


def sampling_round(step_key: jax.Array, round_index: int) -> jax.Array:
  """The key of sampling round `round_index` of a step (dynamic sampling): round 0 is the step's
  own key, so that a step without refills samples as it would without dynamic sampling."""
  if round_index == 0:
    return step_key
  return jax.random.fold_in(step_key, _SAMPLING_ROUND + round_index)


def update(step_key: jax.Array) -> jax.Array:
  return jax.random.fold_in(step_key, _UPDATE)


def collapse_rng(seed, step_index: int) -> np.random.Generator:
  """Host generator drawing the (prompt, reasoning) pairs of the collapse diagnostics."""
  return np.random.default_rng([seed.init, step_index, _COLLAPSE])


def validation(seed) -> jax.Array:
  """Validation sampling; batch b of a tag folds in its first group."""
  return jax.random.fold_in(jax.random.key(seed.init), _VALIDATION)


def level_seeds_of_step(exp, step_index: int) -> Dict[str, int]:
  """{tag: level seed of its first group} at training step `step_index` (1-based): every step
  plays the next `sum(train_groups)` levels from `seed.train` (RAGEN's counter), tags in order."""
  seeds, seed = {}, next_train_seed(exp, step_index - 1)
  for spec in exp.envs:
    seeds[spec.tag] = seed
    seed += spec.train_groups
  return seeds


def level_seeds_of_round(exp, step_index: int, round_index: int) -> Dict[str, int]:
  """{tag: level seed of its first group} in sampling round `round_index` of training step
  `step_index` (dynamic sampling): round 0 plays the step's own levels (`level_seeds_of_step`),
  refill round r >= 1 the next `sum(train_groups)` levels of a second counter, indexed by
  (step, round) and apart from the training counter's levels, so that a resumed run plays the
  refills the uninterrupted run played."""
  if round_index == 0:
    return level_seeds_of_step(exp, step_index)
  groups = sum(e.train_groups for e in exp.envs)
  refills = exp.rollout.max_sampling_rounds - 1  # refill rounds per step at most
  seed = exp.seed.train + _REFILL_LEVELS + ((step_index - 1) * refills + round_index - 1) * groups
  seeds = {}
  for spec in exp.envs:
    seeds[spec.tag] = seed
    seed += spec.train_groups
  return seeds


def next_train_seed(exp, steps_done: int) -> int:
  """The first level seed after `steps_done` training steps."""
  return exp.seed.train + steps_done * sum(e.train_groups for e in exp.envs)


def validation_level_seed(exp, group: int) -> int:
  """Validation group `group` of every tag plays the level of this seed."""
  return exp.seed.val + group


def demo_level_seed(sft_seed: int, round_index: int, groups: int) -> int:
  """First level seed of round `round_index` of a tag's demonstrations (apart from train/val)."""
  return sft_seed + round_index * groups

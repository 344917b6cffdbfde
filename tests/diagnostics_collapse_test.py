"""The MI family on real rollouts of the shipped warm start: input-specific reasoning scores high,
the same reasoning copied under every prompt (template collapse) scores zero."""

import jax
import numpy as np
import pytest

from ragen_jax import diagnostics
from ragen_jax import rollout as rollout_lib
from ragen_jax.diagnostics import collapse
from ragen_jax.diagnostics import turns as turns_lib
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import policy as policy_lib


@pytest.fixture(scope="module")
def first_turns():
  config = cli.load_config_file("configs/sokoban_ppo.py:smoke")
  exp = schema.from_config(config)
  model, tok = policy_lib.build(exp)  # the warm start: it restates the coordinates it is shown
  spec = exp.envs[0]
  rc = spec.rollout_config(exp.rollout, validation=False)
  rc = rollout_lib.RolloutConfig(
      **{**rc.__dict__, "env_groups": 6, "group_size": 2, "max_turns": 1, "max_new_tokens": 48}
  )
  result = rollout_lib.Rollout(spec.make(), tok, rc).run(
      rollout_lib.ModelPolicy(model), jax.random.key(0), seed=500
  )
  turns = diagnostics.collect_turns({"sokoban": result}, tok)
  return model, tok, turns


def test_input_specific_reasoning_has_high_mi_and_retrieval(first_turns):
  model, tok, turns = first_turns
  sample = turns_lib.first_turn_sample(turns, 64, np.random.default_rng(0))
  assert sample.num_samples >= 8 and len(set(sample.column_ids.tolist())) >= 5
  m = collapse.family_metrics(
      model, sample, pad_id=tok.pad_id, micro_batch=16, temperature=1.0, std_ema=None
  )
  assert m["mi_estimate"] > 0.3 * m["mi_upper_bound"]
  assert m["retrieval_acc_top1"] > m["retrieval_chance_top1"] + 0.4
  assert m["conditional_entropy_est"] < m["marginal_entropy_est"]


def test_one_reasoning_under_every_prompt_has_no_mi(first_turns):
  model, tok, turns = first_turns
  sample = turns_lib.first_turn_sample(turns, 64, np.random.default_rng(0))
  template = sample.reasonings[0]
  collapsed = turns_lib.Sample(
      [template] * sample.num_samples, sample.prompts, sample.prompt_index, sample.column_ids
  )
  m = collapse.family_metrics(
      model, collapsed, pad_id=tok.pad_id, micro_batch=16, temperature=1.0, std_ema=None
  )
  # Every z is the same, so with balanced columns mean(matched) = mean_j l(z | x_j) and
  # marginal = log mean_j exp l(z | x_j) >= it (Jensen): the estimate is <= 0, never informative.
  assert m["mi_estimate"] < 0.05
  assert m["retrieval_acc_top1"] <= m["retrieval_chance_top1"] + 0.2


def test_compute_runs_both_families_and_carries_the_ema(first_turns):
  model, tok, turns = first_turns
  cfg = collapse.CollapseConfig(num_samples=8, multi_turn_samples=6, micro_batch=16)
  m1, ema1 = collapse.compute(model, turns, cfg, np.random.default_rng(1), {}, pad_id=tok.pad_id)
  assert set(ema1) == {"first_turn", "multi_turn"}
  assert m1["collapse/multi_turn/num_columns"] == 6 and m1["collapse/first_turn/num_samples"] == 8
  m2, ema2 = collapse.compute(model, turns, cfg, np.random.default_rng(2), ema1, pad_id=tok.pad_id)
  # EMA = 0.9 * previous + 0.1 * this step's std; this step's std is recoverable from mi_zscore.
  mi, z = m2["collapse/first_turn/mi_estimate"], m2["collapse/first_turn/mi_zscore"]
  std = mi / z - 1e-3
  assert ema2["first_turn"] == pytest.approx(0.9 * ema1["first_turn"] + 0.1 * std, rel=1e-3)
  empty = [t for t in turns if not t.reasoning]
  m3, ema3 = collapse.compute(model, empty, cfg, np.random.default_rng(3), ema2, pad_id=tok.pad_id)
  assert m3 == {"collapse/first_turn/num_samples": 0.0, "collapse/multi_turn/num_samples": 0.0}
  assert ema3 == ema2

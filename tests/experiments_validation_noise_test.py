"""experiments/validation_noise.py: which levels and keys it evaluates, and its statistics."""

import pytest

from experiments import validation_noise
from ragen_jax.config import cli


def test_keys_and_level_sets_are_the_ones_named_and_the_statistics_hand_worked(monkeypatch):
  config = cli.load_config_file("configs/sokoban_ppo.py")  # 64 levels from seed.val
  init, val = config.seed.init, config.seed.val
  calls = []
  # Success by (sampling key, first level seed): the default levels vary with the key; the
  # other level sets do not (only the default key is used on them).
  table = {
      (init, val): 0.5,
      (init + 1, val): 0.25,
      (init + 2, val): 0.75,
      (init, val + 64): 0.25,
      (init, val + 128): 0.75,
  }

  def fake_evaluate(cfg, model=None, tokenizer=None):
    calls.append((cfg.seed.init, cfg.seed.val))
    return {"val/success": table[cfg.seed.init, cfg.seed.val]}

  monkeypatch.setattr(validation_noise.evaluate, "evaluate", fake_evaluate)
  m = validation_noise.measure(config, model=None, tok=None, keys=3, level_sets=2)
  assert calls == [
      (init, val),
      (init + 1, val),
      (init + 2, val),
      (init, val + 64),
      (init, val + 128),
  ]
  assert (config.seed.init, config.seed.val) == (init, val)  # the caller's config unchanged
  assert m["default"] == 0.5 and m["keys_mean"] == 0.5
  assert m["keys_std"] == pytest.approx(0.25)  # sqrt((0.0625 + 0.0625) / 2)
  assert (m["keys_min"], m["keys_max"]) == (0.25, 0.75)
  assert m["other_levels"] == 0.5
  assert m["other_levels_se"] == pytest.approx((0.25 / 128) ** 0.5)  # p(1-p) over 128 levels
  assert m["other_sets_std"] == pytest.approx(0.125**0.5)  # deviations ±0.25, n - 1 = 1

"""RAGEN-2's collapse diagnostics for one training step: sample (x, z) pairs, score, summarise.

    cfg = collapse.CollapseConfig(compute_freq=5, num_samples=64)
    turns = diagnostics.collect_turns(results, tokenizer)      # every step: cheap, host side
    metrics = diagnostics.step_metrics(turns)                  # valid-thinking rate, lengths
    if trainer.due(step, cfg.compute_freq, first=True):    # ragen_jax.train.trainer
      mi, ema = collapse.compute(model, turns, cfg, rng, ema, pad_id=..., temperature=...,
                                 frames=prompt_images.of_results(results))

In a visual environment each prompt is scored with its own frames (diagnostics.prompt_images),
as the policy saw them when it sampled; `frames` defaults to text alone.

Metric names: `collapse/<family>/<mi_metrics name>` for family first_turn and multi_turn, plus
`collapse/<family>/num_samples` and `num_columns`, and `timing_s/collapse_<family>`. The per-family
EMA of the marginal std (for `mi_zscore_ema`) is returned for the caller to carry (and checkpoint).
"""

import dataclasses
import time
from typing import Dict, Optional, Sequence, Tuple

import jax
import numpy as np

from ragen_jax.config_checks import check_fields, NonNegativeInt, PositiveInt
from ragen_jax.diagnostics import mutual_info
from ragen_jax.diagnostics import prompt_images
from ragen_jax.diagnostics import scoring
from ragen_jax.diagnostics import turns as turns_lib

FAMILIES = ("first_turn", "multi_turn")
# One program per sample shape: run eagerly, mi_metrics' few dozen small array operations each
# compiled a program of their own in every new process.
_MI_METRICS = jax.jit(mutual_info.mi_metrics, static_argnames="top_k")
_SAMPLERS = {"first_turn": turns_lib.first_turn_sample, "multi_turn": turns_lib.multi_turn_sample}


@dataclasses.dataclass(frozen=True)
class CollapseConfig:
  """When and how much of RAGEN-2's MI family to compute (defaults: RAGEN-2's)."""

  compute_freq: NonNegativeInt = 5  # every N steps and at step 1; 0 turns the MI family off
  num_samples: PositiveInt = 64  # first-turn pairs, drawn without replacement
  multi_turn_samples: PositiveInt = 64  # multi-turn draws; each is a column, so cost grows as N^2
  micro_batch: PositiveInt = 64  # (x, z) pairs per jitted scoring call

  def __post_init__(self):
    check_fields(self, "diagnostics")


def family_metrics(
    model,
    sample: turns_lib.Sample,
    *,
    pad_id: int,
    micro_batch: int,
    temperature: float,
    std_ema: Optional[float],
    frames: prompt_images.NoFrames | prompt_images.StepFrames = prompt_images.NoFrames(),
) -> Dict[str, float]:
  """mi_metrics of one sampled family under `model` (floats), each prompt with its frames."""
  images = frames.for_columns(sample.column_frames)
  logp_sum, num_tokens = scoring.cross_logprobs(
      model,
      sample.reasonings,
      sample.prompts,
      pad_id=pad_id,
      micro_batch=micro_batch,
      temperature=temperature,
      images=images,
  )
  m = _MI_METRICS(
      logp_sum,
      num_tokens,
      sample.prompt_index,
      column_ids_P=images.column_ids(sample.column_ids),
      std_ema=None if std_ema is None else np.float32(std_ema),
  )
  out = {k: float(v) for k, v in jax.device_get(m).items()}
  out["num_samples"] = float(sample.num_samples)
  out["num_columns"] = float(len(sample.prompts))
  return out


def compute(
    model,
    turns: Sequence[turns_lib.ReasoningTurn],
    cfg: CollapseConfig,
    rng: np.random.Generator,
    std_ema: Dict[str, float],
    *,
    pad_id: int,
    temperature: float = 1.0,
    frames: prompt_images.NoFrames | prompt_images.StepFrames = prompt_images.NoFrames(),
) -> Tuple[Dict[str, float], Dict[str, float]]:
  """Both families on one step's turns: (metrics, updated per-family EMA of the marginal std).
  `frames`: the step's frames (`prompt_images.of_results`), for a visual environment.

  A family with no valid reasoning is skipped (its EMA is kept); `collapse/<family>/num_samples`
  is then logged as 0 so an empty family is visible rather than silently absent.
  """
  metrics, new_ema = {}, dict(std_ema)
  sizes = {"first_turn": cfg.num_samples, "multi_turn": cfg.multi_turn_samples}
  for family in FAMILIES:
    tic = time.perf_counter()
    sample = _SAMPLERS[family](turns, sizes[family], rng)
    if sample is None:
      metrics[f"collapse/{family}/num_samples"] = 0.0
      continue
    m = family_metrics(
        model,
        sample,
        pad_id=pad_id,
        micro_batch=cfg.micro_batch,
        temperature=temperature,
        std_ema=std_ema.get(family),
        frames=frames,
    )
    new_ema[family] = m["marginal_std_ema"]
    metrics.update({f"collapse/{family}/{k}": v for k, v in m.items()})
    metrics[f"timing_s/collapse_{family}"] = time.perf_counter() - tic
  return metrics, new_ema

"""Collapse diagnostics (RAGEN-2): the mutual-information family of proxies and what feeds it.

from ragen_jax import diagnostics
m = diagnostics.mi_metrics(logp_sum_SxP, num_tokens_S, prompt_index_S)   # pure, jit-able
turns = diagnostics.collect_turns(results, tokenizer)                    # (x, z) per turn
step = diagnostics.step_metrics(turns)                                   # every step
frames = diagnostics.step_frames(results)                                # visual envs' frames
mi, ema = diagnostics.compute(model, turns, cfg, rng, ema, pad_id=..., frames=frames)
"""

from ragen_jax.diagnostics.collapse import CollapseConfig
from ragen_jax.diagnostics.collapse import compute
from ragen_jax.diagnostics.mutual_info import column_ids_from_prompts
from ragen_jax.diagnostics.mutual_info import mi_metrics
from ragen_jax.diagnostics.prompt_images import of_results as step_frames
from ragen_jax.diagnostics.scoring import cross_logprobs
from ragen_jax.diagnostics.turns import collect_turns
from ragen_jax.diagnostics.turns import step_metrics

"""Collapse diagnostics (RAGEN-2): the mutual-information family of proxies.

  from ragen_jax import diagnostics
  m = diagnostics.mi_metrics(logp_sum_SxP, num_tokens_S, prompt_index_S)
"""
from ragen_jax.diagnostics.mutual_info import column_ids_from_prompts
from ragen_jax.diagnostics.mutual_info import mi_metrics

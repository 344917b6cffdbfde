"""StarPO update stage: advantages, losses, rollout filtering and the compiled train step.

Pure jnp functions (jit-able, each documented with its formula) plus the donated train step.
Shapes follow `ragen_jax.batch`: B episodes, T tokens.
"""

from ragen_jax.algos.advantages import brpo_advantages
from ragen_jax.algos.advantages import compute_bi_level_gae
from ragen_jax.algos.advantages import compute_gae
from ragen_jax.algos.advantages import explained_variance
from ragen_jax.algos.advantages import group_mean_std
from ragen_jax.algos.advantages import grpo_advantages
from ragen_jax.algos.advantages import masked_mean
from ragen_jax.algos.advantages import masked_sum
from ragen_jax.algos.advantages import masked_var
from ragen_jax.algos.advantages import masked_whiten
from ragen_jax.algos.advantages import outcome_advantages
from ragen_jax.algos.config import PPOConfig
from ragen_jax.algos.filtering import episode_keep_mask
from ragen_jax.algos.filtering import filter_groups
from ragen_jax.algos.filtering import first_of_group_B
from ragen_jax.algos.filtering import group_metric_B
from ragen_jax.algos.logprobs import chunked_logprobs_entropy
from ragen_jax.algos.logprobs import response_width
from ragen_jax.algos.logprobs import sequence_logprobs
from ragen_jax.algos.losses import agg_loss
from ragen_jax.algos.losses import kl_penalty
from ragen_jax.algos.losses import policy_loss
from ragen_jax.algos.losses import rollout_correction_metrics
from ragen_jax.algos.losses import rollout_correction_weights
from ragen_jax.algos.losses import value_loss
from ragen_jax.algos.train_state import actor_module
from ragen_jax.algos.train_state import init_train_state
from ragen_jax.algos.train_state import TrainState
from ragen_jax.algos.train_step import make_train_step

"""Multi-turn rollout (RAGEN's agent loop) over a KV cache that grows turn by turn.

    from ragen_jax import rollout
    engine = rollout.Rollout(env, tokenizer, rollout.RolloutConfig(env_groups=8, group_size=16))
    result = engine.run(rollout.ModelPolicy(model), key, seed=10000)   # .batch: a RolloutBatch

The policy is built by the caller: `ModelPolicy(model)`, `ScriptedPolicy(fn)` or
`api_policy.ApiPolicy(client)` (rollout.policies).

Dimension legend: B episodes, T sequence tokens (see ragen_jax.batch).
"""

from ragen_jax.rollout import api_policy
from ragen_jax.rollout import prompts
from ragen_jax.rollout.engine import Rollout
from ragen_jax.rollout.episodes import Episode
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.rollout.episodes import RolloutResult
from ragen_jax.rollout.episodes import Turn
from ragen_jax.rollout.policies import ModelPolicy
from ragen_jax.rollout.policies import ScriptedPolicy

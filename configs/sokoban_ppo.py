r"""Sokoban with PPO (GAE + a separate critic), RAGEN's `_2_sokoban` at CPU scale: the default run.

  python launch.py --config=configs/sokoban_ppo.py                 # ~18 min on 2 CPU cores
  python launch.py --config=configs/sokoban_ppo.py:smoke           # < 2 min, for tests
  python launch.py --config=configs/sokoban_ppo.py:qwen2.5-0.5b \
      --config.model.checkpoint=/path/to/Qwen2.5-0.5B-Instruct     # RAGEN's sizes

The default starts from the tiny (1.1M parameter) model's shipped warm start (supervised
fine-tuning on expert demonstrations with 25% random actions: configs/warm_start_sft.py; 45% of
the validation levels solved), then runs StarPO with StarPO-S's rollout filtering. RAGEN's
values (shared/reference/ragen.md §3.4) are kept except where marked "CPU:".
"""
from ragen_jax import config_sections as cs
import ml_collections


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.envs = ml_collections.ConfigDict()
  # CPU: 8 groups x 8 episodes sampled per step (RAGEN: 8 x 16); 64 validation levels (RAGEN: 512).
  config.envs.sokoban = cs.sokoban_env(train_groups=8, val_groups=64)
  config.model = cs.model_section()
  config.rollout = cs.cpu_rollout_section()
  # CPU: learning rates for a 1M-parameter model (RAGEN's 1e-6 / 1e-5 are for 0.5B-7B).
  # StarPO-S filtering: only the 4 groups of largest in-group reward spread are trained. Without
  # it, all-fail groups (every reply pushed down: the critic's explained variance stays ~0, so
  # the baseline is the batch mean) drift the policy to one action per turn at lr 1e-4; see
  # BENCHMARKS.md. 4 minibatches of 16: the 32 kept episodes give 2 optimizer steps per step.
  config.ppo = cs.ppo_section(adv_estimator="gae", actor_lr=1e-4, critic_lr=5e-4,
                              num_minibatches=4, filter_strategy="top_k", filter_value=0.5)
  config.sft = cs.sft_section()          # steps=0: the shipped warm start is the SFT
  # CPU: 25 steps (RAGEN 200), ~33 s each on 2 cores (about 18 min in all);
  # validation at 0, 5, ..., 25.
  config.trainer = cs.trainer_section(total_steps=25, eval_every=5, save_every=5)
  config.diagnostics = cs.diagnostics_section()
  config.early_stop = cs.early_stop_section()
  config.mesh = cs.mesh_section()
  config.seed = cs.seed_section()
  return cs.apply_variant(config, arg)

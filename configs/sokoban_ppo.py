r"""Sokoban with PPO (GAE + a separate critic), RAGEN's `_2_sokoban` at CPU scale: the default run.

  python launch.py --config=configs/sokoban_ppo.py                 # see README "Results"
  python launch.py --config=configs/sokoban_ppo.py:smoke           # < 2 min, for tests
  python launch.py --config=configs/sokoban_ppo.py:qwen2.5-0.5b \
      --config.model.checkpoint=/path/to/Qwen2.5-0.5B-Instruct     # RAGEN's sizes

The default starts from the tiny (1.1M parameter) model's shipped warm start (supervised
fine-tuning on expert demonstrations with 25% random actions: configs/warm_start_sft.py; its
success is in the README's "Results"), then runs StarPO with StarPO-S's rollout filtering. RAGEN's
values (shared/reference/ragen.md §3.4) are kept except where marked "CPU:".
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: 8 groups x 8 episodes sampled per step (RAGEN: 8 x 16); 64 validation levels
      # (RAGEN: 512).
      envs=dict(sokoban=cs.env("sokoban", train_groups=8, val_groups=64)),
      # CPU: learning rates for a 1M-parameter model (RAGEN's 1e-6 / 1e-5 are for 0.5B-7B).
      # StarPO-S filtering: only the 4 groups of largest in-group reward spread are trained.
      # Without it, all-fail groups (every reply pushed down: the critic's explained variance
      # stays ~0, so the baseline is the batch mean) drift the policy to one action per turn at
      # lr 1e-4 (experiments/README.md). 4 minibatches of 16: the 32 kept episodes give 2
      # optimizer steps per step.
      ppo=dict(
          adv_estimator="gae",
          actor_lr=1e-4,
          critic_lr=5e-4,
          num_minibatches=4,
          filter_strategy="top_k",
          filter_value=0.5,
      ),
      # CPU: 25 steps (RAGEN 200; wall time in BENCHMARKS.md); validation at 0, 5, ..., 25.
      # sft.steps stays 0: the shipped warm start is the fine-tuning.
      trainer=dict(total_steps=25, eval_every=5, save_every=5),
  )

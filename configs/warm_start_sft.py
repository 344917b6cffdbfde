"""The shipped warm start: supervised fine-tuning of the tiny model on expert demonstrations of
all three environments (Sokoban breadth-first solver, FrozenLake shortest paths, the Bandit's
high-risk arm), 25% of the demonstrated actions replaced by random ones. Each round of the mix
has 4 Sokoban, 2 FrozenLake and 2 Bandit batches: Sokoban needs the most steps to rise above
chance (experiments/README.md, "The warm start decides").

  python launch.py --config=configs/warm_start_sft.py --workdir=runs/warm_start
  python -m ragen_jax.export --checkpoint=runs/warm_start --out=ragen_jax/assets/tiny_warm_start

This is how `ragen_jax/assets/tiny_warm_start` (the starting point of every tiny RL config) was
made; experiments/README.md records the run. Step 0's validation is the fine-tuned policy's success.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # SFT plays train_groups x group_size levels per demonstration batch, one episode each.
      envs=dict(
          sokoban=cs.env("sokoban", train_groups=4, val_groups=64, sft_batches=4),
          frozenlake=cs.env("frozenlake", train_groups=4, val_groups=64, sft_batches=2),
          bandit=cs.env("bandit", train_groups=4, val_groups=64, sft_batches=2),
      ),
      model=dict(warm_start=False),  # from scratch: this run makes the warm start
      ppo=dict(adv_estimator="grpo", num_minibatches=2),  # unused: no RL steps
      # 1200 steps: 600 Sokoban, 300 FrozenLake, 300 Bandit batches (54 min on 2 CPU cores).
      sft=dict(steps=1200, batch_size=16, lr=2e-3, warmup_steps=30),
      trainer=dict(total_steps=0),
  )

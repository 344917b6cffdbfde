"""Only the fine-tuning, for Sokoban alone: supervised fine-tuning of the tiny model from scratch
on breadth-first-solver demonstrations (25% random actions), then one validation (step 0) and a
checkpoint. (configs/warm_start_sft.py does the same on all three environments; its result is
the shipped warm start the RL configs begin from.)

  python launch.py --config=configs/sokoban_sft.py [--config.sft.steps=200]
  python -m ragen_jax.export --checkpoint=runs/sokoban_sft --out=/tmp/sokoban_sft_hf
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(sokoban=cs.env("sokoban", train_groups=4, val_groups=64)),
      model=dict(warm_start=False),  # from scratch
      ppo=dict(adv_estimator="grpo", num_minibatches=2),  # unused: no RL steps
      sft=dict(steps=300, lr=2e-3, warmup_steps=30),
      trainer=dict(total_steps=0),
  )

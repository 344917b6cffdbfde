"""Visual Sokoban (6x6, one box, drawn as 84x84 images: 9 image tokens a turn) with GRPO, a tiny
Qwen2.5-VL (`tiny-vl`) trained from scratch on the CPU.

  python launch.py --config=configs/visual_sokoban_ppo.py[:smoke]

Each turn's prompt carries that turn's frame (rollout.images); the update splices the same
frames (the tower frozen: ppo.train_vision_tower). RL starts from a supervised warm start on
expert demonstrations that carry their frames (`sft`, the tower frozen as in the update): from
random weights no reply would parse (docs/experiments/visual_agents.md). The board is shown as
the frame and as grid text; `--config.envs.visual_sokoban.render_format=image` shows it in the
frame only.

Qwen2.5-VL-3B-Instruct on one H100 (its weights are not reachable from this project's machines,
so not run here; its variants start from the instruct model, without SFT):

  python launch.py --config=configs/visual_sokoban_ppo.py:qwen2.5-vl-3b-h100-bf16 \
      --config.model.checkpoint=DIR       (or -h100-lora; docs/scaling.md, Accelerators)

Values marked "CPU:" differ from RAGEN's for a tiny model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: RAGEN 8 / 512 groups
      envs=dict(visual_sokoban=cs.env("visual_sokoban", train_groups=4, val_groups=64)),
      model=dict(preset="tiny-vl", warm_start=False),  # from scratch: no text warm start
      ppo=dict(adv_estimator="grpo", actor_lr=1e-4, num_minibatches=2),  # CPU: RAGEN 1e-6
      # CPU: a supervised warm start on expert demonstrations with their frames (the tower frozen
      # as in the update), so that RL starts from replies in the format.
      sft=dict(steps=250, batch_size=16, lr=3e-3, warmup_steps=20),
      trainer=dict(total_steps=10, eval_every=5, save_every=10),
  )

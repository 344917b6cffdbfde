"""Math with retries (RAGEN's `_5_metamathqa`: a wrong answer gets "Incorrect. Please think
again." and another turn; a right one after k wrong ones pays 1/2^k) with PPO.

  python launch.py --config=configs/math_ppo.py[:smoke]
  python launch.py --config=configs/math_ppo.py --config.envs.math.options.path=gsm8k.jsonl

Questions: the shipped, procedurally generated arithmetic set (ragen_jax/assets/math), or any
local JSONL file of `question` / `answer` lines (MetaMathQA's `query` / `response` and GSM8K's
`#### answer` read as they are). The tiny model starts from the shipped warm start, then
fine-tunes on the environment's expert (the reference answer) before RL. Values marked "CPU:"
differ from RAGEN's for a 1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(math=cs.env("math", train_groups=8, val_groups=64)),  # CPU: RAGEN 8 / 256
      rollout=dict(max_turns=3, max_actions_per_turn=1, max_new_tokens=48),  # three attempts
      ppo=dict(actor_lr=1e-4, critic_lr=1e-4, num_minibatches=2),  # CPU: RAGEN 1e-6 / 1e-5
      sft=dict(steps=200, batch_size=16, lr=1e-3, warmup_steps=20),  # CPU: the expert's answers
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )

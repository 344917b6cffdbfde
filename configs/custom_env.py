"""Your own environment: the example text environment (examples/guess_number.py) as tag `custom`.

  python launch.py --config=configs/custom_env.py[:smoke]
  python launch.py --config=configs/custom_env.py --config.envs.custom.entry=my_pkg.my_env:MyEnv
  python launch.py --config=configs/custom_env.py --config.envs.custom.entry=http://127.0.0.1:8000

The entry names any text environment (envs.TextEnv: reset(seed) -> str, step(str) -> obs,
reward, done, info): an import path, or the URL of one served by `python -m ragen_jax.envs.serve`.
Answers are free text (the environment has no action vocabulary), one guess per turn; each
episode gets its own instance, stepped in a thread pool (`envs.custom.pool=process` for
CPU-bound environments). Values marked "CPU:" differ from RAGEN's for a 1M-parameter model on 2
cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      envs=dict(
          custom=cs.env(
              entry="examples.guess_number:GuessNumber",
              train_groups=8,
              val_groups=32,  # CPU: RAGEN 256
              max_actions_per_traj=5,  # five guesses
              step_timeout_s=10.0,
          )
      ),
      rollout=dict(max_turns=5, max_actions_per_turn=1, max_new_tokens=32),
      ppo=dict(actor_lr=1e-4, critic_lr=1e-4),  # CPU: RAGEN 1e-6 / 1e-5
      trainer=dict(total_steps=30, eval_every=5, save_every=10, pad_multiple=512),
  )

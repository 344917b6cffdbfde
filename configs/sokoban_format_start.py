r"""Sokoban with RL from a start that knows RAGEN's reply format but not the task: the lever study
of experiments/README.md (finding 12, "From the format alone, the new levers do not teach
Sokoban").

  python launch.py --config=configs/sokoban_format_start.py            # the study's base run
  python launch.py --config=configs/sokoban_format_start.py:smoke      # < 2 min, for tests

Unlike the default run (configs/sokoban_ppo.py), which starts from the shipped warm start that
imitates a solver, this run starts from random weights fine-tuned for 150 steps on format-correct
replies whose actions are uniformly random: like RAGEN's instruct model, it answers in the format
and knows nothing of Sokoban, so RL has the whole task to learn. Its other levers:
  - cheaper episodes: RAGEN's grid observation without the coordinate block, no-think replies and
    the compact prompt (the format rule once in the system message): ~320 tokens an episode;
  - turn-level credit: bi-level GAE over per-turn rewards (a box pushed onto a target pays on
    its turn, and the critic learns a value per turn);
  - easier training levels: reverse walks of 6 steps (57% of the levels solvable in two moves,
    against 29% for RAGEN's 40); validation plays the standard levels.
Values marked "CPU:" differ from RAGEN's for a 1M-parameter model on 2 cores.
"""

from ragen_jax.config import sections as cs


def get_config(arg=None):
  return cs.experiment(
      arg,
      # CPU: 8 groups x 8 episodes per step, 64 validation levels (RAGEN 8 x 16, 512).
      envs=dict(
          sokoban=cs.env(
              "sokoban",
              train_groups=8,
              val_groups=64,
              render_format="grid",  # RAGEN's grid text without the coordinate block
              options=dict(search_depth=6),  # CPU: easier training levels
              val_options=dict(search_depth=40),  # RAGEN's levels for validation
          )
      ),
      model=dict(warm_start=False),  # random weights, then the format-only fine-tuning below
      sft=dict(steps=150, lr=2e-3, random_prob=1.0),  # uniformly random actions: format only
      # CPU: no-think replies (a RAGEN switch) and the compact prompt (not RAGEN's).
      rollout=dict(
          enable_think=False, prompt_style="compact", max_new_tokens=24, use_turn_scores=True
      ),
      # CPU: learning rates for a 1M-parameter model (RAGEN's 1e-6 / 1e-5 are for 0.5B-7B); no
      # filtering: a near-random policy leaves spread in every group.
      ppo=dict(
          adv_estimator="bi_level_gae",
          actor_lr=3e-4,
          critic_lr=5e-4,
          num_minibatches=4,
          filter_value=1.0,
      ),
      trainer=dict(total_steps=40, eval_every=10, save_every=10, pad_multiple=128),
  )

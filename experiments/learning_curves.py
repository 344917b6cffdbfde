r"""Kept for older commands: the same as `python -m ragen_jax.plot` (curves and a results table).

python experiments/learning_curves.py runs/sokoban_ppo runs/bandit_grpo --out=curves.png
"""

import sys

from ragen_jax import plot

if __name__ == "__main__":
  sys.exit(plot.main())

"""ragen_jax: multi-turn RL for LLM agents (RAGEN's StarPO) in JAX/Flax."""

from ragen_jax import moved as _moved

__version__ = "0.1.0"
_moved.install()

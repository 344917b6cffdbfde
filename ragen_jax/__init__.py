"""ragen_jax: multi-turn RL for LLM agents (RAGEN's StarPO) in JAX/Flax."""

__version__ = "0.1.0"

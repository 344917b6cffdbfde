"""The pure-JAX environments: pure reset and step functions that jit and vmap on the device.

base: the `Env` contract shared by all of them; sokoban (levels from sokoban_generator),
frozenlake, bandit and game2048: RAGEN's; visual: Sokoban and FrozenLake drawn as images too.
Made by name with `ragen_jax.envs.make`.
"""

"""Other packages' environments as text environments (`ragen_jax.envs.text.TextEnv`).

gymnasium: discrete-action gymnasium environments (`ragen_jax.envs.from_gymnasium`);
reasoning_gym: reasoning-gym's procedural tasks (`ReasoningGymEnv`). Each imports its package
only when used.
"""

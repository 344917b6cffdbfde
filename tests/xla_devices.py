"""The environment of a subprocess that sees several CPU devices (sharding, several processes).

XLA_FLAGS is one variable: a test setting the device count keeps the flags the test session set
(tests/conftest.py) instead of replacing them.
"""

import os


def cpu_devices(n: int, env=None) -> dict:
  """`env` (os.environ by default) with `n` CPU devices and JAX on the CPU."""
  env = dict(os.environ if env is None else env)
  flags = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}"
  return dict(env, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")

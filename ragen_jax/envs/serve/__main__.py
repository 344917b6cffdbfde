"""`python -m ragen_jax.envs.serve`: the command line of ragen_jax.envs.serve.server."""

import sys

from ragen_jax.envs.serve import server

if __name__ == "__main__":  # imported, e.g. by the docs' API walk, it starts nothing
  sys.exit(server.main())

"""`python -m ragen_jax.envs.serve`: the command line of ragen_jax.envs.serve.server."""

import sys

from ragen_jax.envs.serve import server

sys.exit(server.main())

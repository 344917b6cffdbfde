"""The environment server: `python -m ragen_jax.envs.serve` serves a text environment over HTTP,
HttpEnv plays it.

server: the episodes (`EnvServer`, `serve`, a declaration on ragen_jax.json_http) and the
command line; client: `HttpEnv`, a TextEnv whose episodes live on a server.
"""

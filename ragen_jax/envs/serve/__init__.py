"""Text environments over HTTP: `python -m ragen_jax.envs.serve` serves one, HttpEnv plays it.

server: the episodes (`EnvServer`, `serve`) and the command line; http: the request handler;
client: `HttpEnv`, a TextEnv whose episodes live on a server.
"""

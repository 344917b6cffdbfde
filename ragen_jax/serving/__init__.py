"""A policy behind an OpenAI-compatible chat endpoint (`python -m ragen_jax.serve_model`).

requests: the chat request's fields, checked; batcher: concurrent requests batched into
`sampling.generate` calls; server: the HTTP routes.
"""

from ragen_jax.serving.batcher import BatchConfig
from ragen_jax.serving.batcher import Batcher
from ragen_jax.serving.requests import ApiError
from ragen_jax.serving.requests import ChatRequest
from ragen_jax.serving.requests import Limits
from ragen_jax.serving.server import ChatServer

"""The model server: a policy behind an OpenAI-compatible chat endpoint
(`python -m ragen_jax.serve_model`).

requests: the chat request's fields, checked; batcher: concurrent requests batched into
`sampling.generate` calls; server: the routes (`ChatServer`, a declaration on
ragen_jax.json_http).
"""

from ragen_jax.model_server.batcher import BatchConfig
from ragen_jax.model_server.batcher import Batcher
from ragen_jax.model_server.requests import ApiError
from ragen_jax.model_server.requests import ChatRequest
from ragen_jax.model_server.requests import Limits
from ragen_jax.model_server.server import ChatServer

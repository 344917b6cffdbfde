"""The starting policy of a run (no downloads).

In order: `model.checkpoint` (a local Hugging Face directory, with its own tokenizer.json when
present, or a GGUF file with the tokenizer its metadata describes); the tiny preset's shipped
warm start (`model.warm_start`: the weights configs/warm_start_sft.py fine-tuned on expert
demonstrations, in ragen_jax/assets); or the preset initialised from `seed.init`. With
`model.lora.rank` > 0 the model then gets LoRA adapters (A from `seed.init`, B zero), so it
starts as the same function.
"""

import os

from absl import logging
import jax
import jax.numpy as jnp

from ragen_jax import models
from ragen_jax import tokenizers
from ragen_jax.models import gguf_checkpoint

WARM_START_DIR = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "assets", "tiny_warm_start"
)


def model_config(exp) -> models.ModelConfig:
  """The policy's architecture, known before any weight is read (for the mesh checks)."""
  checkpoint = exp.model.checkpoint
  if checkpoint is None and exp.model.warm_start:
    checkpoint = WARM_START_DIR
  if checkpoint is None:
    return models.get_config(exp.model.preset)
  return models.checkpoint.read_config(checkpoint)


def load_tokenizer(spec):
  """The tokenizer of `spec` (a `config.schema.ModelSpec`): its checkpoint's own (a directory's
  tokenizer.json, a GGUF file's metadata) when present, else `spec.tokenizer`."""
  checkpoint = spec.checkpoint
  if checkpoint is None and spec.warm_start:
    checkpoint = WARM_START_DIR
  if checkpoint is not None and (
      gguf_checkpoint.is_gguf(checkpoint)
      or os.path.exists(os.path.join(checkpoint, "tokenizer.json"))
  ):
    return tokenizers.load(checkpoint)
  if checkpoint is not None:
    logging.info("no tokenizer.json in %s; using %s", checkpoint, spec.tokenizer)
  return tokenizers.load(spec.tokenizer)


def build(exp, sharder=None):
  """(model, tokenizer) for `exp.model` (a `config.schema.ModelSpec` inside `exp`).

  With a `sharding.Sharder`, the model's sizes are checked against the mesh first and every
  parameter is created or loaded directly into its sharding. The weights are stored in
  `model.param_dtype`; the critic (a copy of the decoder) and the reference policy (a copy of
  the actor's weights) inherit it, the critic's value head staying float32.
  """
  spec = exp.model
  dtype, param_dtype = jnp.dtype(spec.dtype), jnp.dtype(spec.param_dtype)
  checkpoint = spec.checkpoint
  if checkpoint is None and spec.warm_start:
    checkpoint = WARM_START_DIR
  shard = None
  if sharder is not None:
    sharder.check_model(model_config(exp))
    shard = sharder.named
  if checkpoint is None:
    model = models.create(
        spec.preset,
        jax.random.key(exp.seed.init),
        dtype=dtype,
        param_dtype=param_dtype,
        sharding=shard,
        remat=spec.remat,
        attention=spec.attention,
        attention_block=spec.attention_block,
    )
    tok = tokenizers.load(spec.tokenizer)
  else:
    model = models.load(
        checkpoint,
        dtype=dtype,
        param_dtype=param_dtype,
        sharding=shard,
        remat=spec.remat,
        attention=spec.attention,
        attention_block=spec.attention_block,
    )
    tok = load_tokenizer(spec)
  lora_config = spec.lora.config()
  if lora_config is not None:
    lora_key = jax.random.fold_in(jax.random.key(exp.seed.init), 1)
    model = models.lora.add(model, lora_config, lora_key, sharding=shard)
  if tok.vocab_size > model.config.vocab_size:
    raise ValueError(
        f"the tokenizer has {tok.vocab_size} ids but the model only "
        f"{model.config.vocab_size} embedding rows"
    )
  return model, tok

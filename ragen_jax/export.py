r"""Exports a training run's actor, or a GGUF file's model, as a Hugging Face checkpoint that
`transformers` loads.

  python -m ragen_jax.export --checkpoint=runs/sokoban_ppo --out=/tmp/sokoban_hf
  python -m ragen_jax.export --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf --out=/tmp/smollm2_hf

`--checkpoint` is the run's workdir (latest step), its `checkpoints/` directory, one
`checkpoints/<step>` directory, or a GGUF file (its weights dequantised to float32). Writes
config.json, model.safetensors (sharded when large) and the tokenizer's files: a source
directory's own, a GGUF file's tokenizer.json and tokenizer_config.json (with the chat template),
or the shipped SentencePiece model; `AutoModelForCausalLM.from_pretrained
(out)` then gives the same logits as the trained actor (a LoRA actor is written with its
adapters merged into the kernels, a plain checkpoint). Over an earlier export, the weight files
of this one replace it whole (`models.save_hf`); a run that cannot be read is refused in one line.
"""

import os
import shutil

from absl import app
from absl import flags
from absl import logging

from ragen_jax import models
from ragen_jax import tokenizers
from ragen_jax.train import launch_utils
from ragen_jax.train import restore

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "generation_config.json",
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Training run directory or GGUF file.", required=True
)
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)


def export(checkpoint: str, out: str) -> int | None:
  """Writes the Hugging Face checkpoint; returns the exported step (None for a GGUF file)."""
  if restore.checkpoint_kind(checkpoint) == "gguf":
    models.save_hf(models.load_gguf(checkpoint), out)
    tokenizers.load(checkpoint).save(out)
    return None
  model, tok, config, step = restore.load_actor(checkpoint)
  models.save_hf(model, out)
  # The tokenizer travels with the weights: a source directory's own files as they are, else
  # the tokenizer's files written by itself (a GGUF file's, the shipped SentencePiece model).
  source = config.model.checkpoint
  if source and os.path.isdir(source):
    for name in _TOKENIZER_FILES:
      if os.path.isfile(os.path.join(source, name)):
        shutil.copy(os.path.join(source, name), os.path.join(out, name))
  else:
    tok.save(out)
  return step


def main(argv):
  del argv
  try:
    step = export(_CHECKPOINT.value, _OUT.value)
  except (FileNotFoundError, ValueError) as e:  # what the operator passed: one line, no trace
    launch_utils.exit_with_error(str(e))
  what = _CHECKPOINT.value if step is None else f"step {step}"
  logging.info("exported %s to %s", what, _OUT.value)
  print(f"exported {what} to {_OUT.value}")


if __name__ == "__main__":
  app.run(main)

r"""Exports a training run's actor as a Hugging Face checkpoint that `transformers` loads.

  python -m ragen_jax.export --checkpoint=runs/sokoban_ppo --out=/tmp/sokoban_hf

`--checkpoint` is the run's workdir (latest step), its `checkpoints/` directory or one
`checkpoints/<step>` directory. Writes config.json, model.safetensors (sharded when large) and,
for the shipped SentencePiece tokenizer, its model file; `AutoModelForCausalLM.from_pretrained
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
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training run directory.", required=True)
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)


def export(checkpoint: str, out: str) -> int:
  """Writes the Hugging Face checkpoint; returns the exported step."""
  model, tok, config, step = restore.load_actor(checkpoint)
  models.save_hf(model, out)
  # The tokenizer travels with the weights: the run's source checkpoint files, or the shipped
  # SentencePiece model (which `ragen_jax.tokenizers` reads; transformers has no class for it).
  source = config.model.checkpoint
  if source:
    for name in _TOKENIZER_FILES:
      if os.path.isfile(os.path.join(source, name)):
        shutil.copy(os.path.join(source, name), os.path.join(out, name))
  elif getattr(tok, "model_file", None):
    shutil.copy(tok.model_file, os.path.join(out, os.path.basename(tok.model_file)))
  return step


def main(argv):
  del argv
  try:
    step = export(_CHECKPOINT.value, _OUT.value)
  except (FileNotFoundError, ValueError) as e:  # what the operator passed: one line, no trace
    launch_utils.exit_with_error(str(e))
  logging.info("exported step %d to %s", step, _OUT.value)
  print(f"exported step {step} to {_OUT.value}")


if __name__ == "__main__":
  app.run(main)

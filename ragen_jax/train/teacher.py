"""The on-policy distillation teacher (`ppo.distill_teacher`): loaded, checked, placed.

    teacher_model, teacher_params = teacher.load(exp, student_tokenizer, sharder)

The teacher opens with the loaders the policy uses (`restore.checkpoint_kind`): a training run's
workdir (its latest step's actor, built from the run's own config), a Hugging Face directory or
a GGUF file (built as `model.checkpoint` would be, in the student's dtypes, without LoRA
adapters). It must share the student's tokenizer: it scores the student's token ids, so the
same id has to mean the same text to both (`check_tokenizer`). Its parameters are placed on the
training mesh and passed to every train step; they have no optimizer state and no gradient.
"""

import dataclasses

from absl import logging

from ragen_jax import distributed
from ragen_jax.algos.step_records import param_dict
from ragen_jax.config import schema
from ragen_jax.tokenizers import IM_END
from ragen_jax.tokenizers import IM_START
from ragen_jax.train import policy as policy_lib
from ragen_jax.train import restore

# Text each tokenizer encodes in the check: chat markers, words, digits, punctuation and a
# Sokoban grid, so two vocabularies that differ anywhere an episode reaches disagree here.
PROBE = (
    f"{IM_START}user\nYou are solving Sokoban. Grid:\n#####\n#_P_#\n#_X_#\n#_O_#\n#####\n"
    f"Actions: Up, Down, Left, Right. 0123456789 +-*/=()[]{{}} <answer>Left</answer>{IM_END}\n"
    f"{IM_START}assistant\nThe box is below; I push it down.{IM_END}"
)


class TokenizerMismatch(ValueError):
  """The teacher's tokenizer is not the student's."""


def check_tokenizer(student, teacher, where: str = "ppo.distill_teacher") -> None:
  """Raises TokenizerMismatch unless both tokenizers have the same size, special ids and
  encoding of `PROBE` (the id sequences and their decoded text)."""
  facts = lambda tok: {
      "vocabulary size": tok.vocab_size,
      "eos id": tok.eos_id,
      "pad id": tok.pad_id,
      "ids of a probe text": tuple(tok.encode(PROBE)),
  }
  mine, theirs = facts(student), facts(teacher)
  for name, value in mine.items():
    if theirs[name] != value:
      shown = lambda v: v if not isinstance(v, tuple) else f"{list(v[:12])}... ({len(v)} ids)"
      raise TokenizerMismatch(
          f"{where}: the teacher's tokenizer is not the student's ({name}: teacher "
          f"{shown(theirs[name])}, student {shown(value)}); distillation scores the student's "
          "token ids with the teacher, so both must share one tokenizer"
      )


def build(exp, sharder=None):
  """(teacher model, its tokenizer) of `exp.ppo.distill_teacher` (no check, no placement)."""
  path = exp.ppo.distill_teacher
  kind = restore.checkpoint_kind(path)
  if kind == "run":
    model, tok, _, step = restore.load_actor(path)
    logging.info("distillation teacher: step %d of the run in %s", step, path)
    return model, tok
  spec = dataclasses.replace(exp.model, checkpoint=path, warm_start=False, lora=schema.LoraSpec())
  model, tok = policy_lib.build(dataclasses.replace(exp, model=spec), sharder)
  logging.info("distillation teacher: the %s checkpoint %s", kind, path)
  return model, tok


def load(exp, student_tokenizer, sharder=None):
  """(teacher model, its parameters placed on the mesh of `sharder`); raises TokenizerMismatch
  before anything trains when the teacher reads token ids differently from the student."""
  model, tok = build(exp, sharder)
  check_tokenizer(student_tokenizer, tok)
  params = param_dict(model)
  if sharder is not None:
    params = distributed.put(params, sharder.tree(params))
  return model, params

"""On-policy distillation: the dense reverse-KL advantage, its gradient under every policy loss,
the teacher's loaders (a run's workdir, a Hugging Face directory, a GGUF file) and the tokenizer
rule.

Dimensions: B episodes, T tokens, V vocabulary.
"""

import json
import os
import types

from flax import nnx
from gguf import GGMLQuantizationType as Q
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tokenizers as hf_tokenizers

from ragen_jax import algos
from ragen_jax import checkpoints
from ragen_jax import models
from ragen_jax import sharding
from ragen_jax import tokenizers
from ragen_jax.algos import distill
from ragen_jax.algos import losses
from ragen_jax.algos.step_records import ModelGraph
from ragen_jax.algos.step_records import param_dict
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import memory
from ragen_jax.train import policy as policy_lib
from ragen_jax.train import run_state
from ragen_jax.train import teacher as teacher_lib
from ragen_jax.train import trainer
import gguf_files  # pylint: disable=g-bad-import-order
from tiny import B
from tiny import make_batch
from tiny import MODEL
from tiny import randomise

LR = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def full_logp(model, batch):
  """Full-logits reference: position t scores tokens[t] from the logits at t − 1."""
  tokens, attn = batch.tokens_BxT, batch.attention_mask_BxT
  lsm = jax.nn.log_softmax(model(tokens, attn)[:, :-1].astype(jnp.float32), axis=-1)
  logp = jnp.take_along_axis(lsm, tokens[:, 1:, None], -1)[..., 0]
  return np.asarray(jnp.pad(logp, ((0, 0), (1, 0))))


def tiny_model(seed):
  return randomise(models.Qwen2(MODEL, rngs=nnx.Rngs(seed)), seed)


# ---------------------------------------------------------------- the advantage


def test_distill_advantage_is_minus_coef_times_the_hand_computed_reverse_kl():
  student = np.array([[-1.0, -0.5, -2.0], [-0.1, -3.0, -0.7]], np.float32)
  teacher = np.array([[-1.5, -0.5, -0.2], [-0.4, -1.0, -9.0]], np.float32)
  mask = np.array([[0, 1, 1], [1, 1, 0]], np.float32)
  env_adv = np.array([[0.3, 0.3, 0.3], [-1.0, -1.0, -1.0]], np.float32)
  # k = student − teacher where trained: [[_, 0, −1.8], [0.3, −2.0, _]]
  k = np.array([[0.0, 0.0, -1.8], [0.3, -2.0, 0.0]], np.float32)
  adv, metrics = distill.add_distill_advantage(env_adv, student, teacher, mask, 0.5, False)
  np.testing.assert_allclose(adv, env_adv - 0.5 * k, rtol=1e-6)
  np.testing.assert_allclose(metrics["distill/reverse_kl"], (-1.8 + 0.3 - 2.0) / 4, rtol=1e-6)
  adv, _ = distill.add_distill_advantage(env_adv, student, teacher, mask, 0.5, True)
  assert not np.any(np.asarray(adv))  # a skipped step stays a no-op


# ---------------------------------------------------------------- the train step


def cfg_of(mode, coef=1.0):
  # GRPO on equal scores: the environment's advantage is 0, so only the teacher's term trains.
  return algos.PPOConfig(
      adv_estimator="grpo",
      policy_loss=mode,
      num_minibatches=1,
      entropy_coeff=0.0,
      distill_teacher="unused-in-a-unit-test",
      distill_coef=coef,
      grad_clip=1e9,
  )


def one_step(cfg, student, teacher):
  batch = make_batch(scores=(1.0,) * B)
  state = algos.init_train_state(student, None, cfg, jax.random.key(0), actor_tx=optax.sgd(LR))
  before = jax.tree.map(np.array, state.actor_params)
  step = algos.make_train_step(student, None, cfg, actor_tx=optax.sgd(LR), teacher_model=teacher)
  state, metrics = step(state, batch, jax.random.key(1), teacher_params=param_dict(teacher))
  delta = jax.tree.map(lambda a, b: np.asarray(a) - b, state.actor_params, before)
  return batch, delta, {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("mode", ["ppo", "gspo", "cispo"])
def test_the_step_descends_the_reverse_kl_advantage_under_every_policy_loss(mode):
  """On-policy (ratio 1) each loss's gradient is −∇ agg(A·log π) with A = −k (NumPy k from full
  logits); one SGD step moves the weights by −lr times it."""
  student, teacher = tiny_model(1), tiny_model(2)
  cfg = cfg_of(mode)
  batch, delta, metrics = one_step(cfg, student, teacher)
  mask = np.asarray(batch.loss_mask_BxT, np.float32)
  k = (full_logp(student, batch) - full_logp(teacher, batch)) * mask
  np.testing.assert_allclose(metrics["distill/reverse_kl"], k.sum() / mask.sum(), rtol=1e-4)
  assert metrics["critic/advantages/max"] == pytest.approx(-k[mask > 0].min(), rel=1e-4)

  params = param_dict(student)
  graph = ModelGraph.of(student)

  def surrogate(params):
    logp = full_logp_jnp(graph.merge(params), batch)
    return losses.agg_loss(k * logp, mask, cfg.policy.agg_mode)  # −A·logp with A = −k

  grads = jax.grad(surrogate)(params)
  want, got = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (grads, delta)]
  np.testing.assert_allclose(got, -LR * want, atol=1e-7, rtol=2e-3)


def full_logp_jnp(model, batch):
  tokens, attn = batch.tokens_BxT, batch.attention_mask_BxT
  lsm = jax.nn.log_softmax(model(tokens, attn)[:, :-1].astype(jnp.float32), axis=-1)
  return jnp.pad(jnp.take_along_axis(lsm, tokens[:, 1:, None], -1)[..., 0], ((0, 0), (1, 0)))


def test_a_teacher_equal_to_the_student_gives_zero_advantage_and_zero_reverse_kl():
  student = tiny_model(1)
  _, delta, metrics = one_step(cfg_of("ppo"), student, student)
  assert metrics["distill/reverse_kl"] == 0.0
  assert metrics["critic/advantages/max"] == 0.0 and metrics["critic/advantages/min"] == 0.0
  assert not any(np.any(d) for d in jax.tree.leaves(delta))  # SGD, zero advantage: no move


def test_a_step_made_with_a_teacher_needs_its_parameters():
  cfg = cfg_of("ppo")
  with pytest.raises(ValueError, match="needs the teacher model"):
    algos.make_train_step(tiny_model(1), None, cfg)


# ---------------------------------------------------------------- the teacher's loaders


def smoke_exp(**ppo):
  config = cli.load_config_file(os.path.join(ROOT, "configs", "sokoban_distill.py:smoke"))
  with config.unlocked():
    for key, value in ppo.items():
      setattr(config.ppo, key, value)
  return config, schema.from_config(config)


def assert_same_params(model, params):
  for a, b in zip(jax.tree.leaves(param_dict(model)), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_teacher_loads_from_a_hugging_face_directory(tmp_path):
  _, exp = smoke_exp()
  student, tok = policy_lib.build(exp)
  weights = randomise(models.create(exp.model.preset, jax.random.key(3)), 3)
  models.save_hf(weights, str(tmp_path))
  _, exp = smoke_exp(distill_teacher=str(tmp_path))
  teacher, params = teacher_lib.load(exp, tok)
  assert teacher.config.vocab_size == student.config.vocab_size
  assert_same_params(weights, params)


def test_a_teacher_loads_from_a_run_workdir(tmp_path):
  config, exp = smoke_exp(distill_teacher=None)
  model, tok = policy_lib.build(exp)
  model = randomise(model, 4)
  ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  try:
    state = run_state.new_state(model, exp.ppo, jax.random.key(0))
    ckpt.save(3, state, run_state.HostState.new(exp).meta(exp, 3, config.to_json_best_effort()))
  finally:
    ckpt.close()
  _, exp = smoke_exp(distill_teacher=str(tmp_path))
  _, params = teacher_lib.load(exp, tok)
  assert_same_params(model, params)


@pytest.fixture(scope="module", name="gguf_dir")
def gguf_dir_fixture(tmp_path_factory):
  """llama.gguf (a tiny Llama, F32), hf/ (the same weights and tokenizer as a Hugging Face
  directory) and digits.gguf (another Llama whose BPE splits digits first: the same vocabulary
  size and special ids, other merges)."""
  root = tmp_path_factory.mktemp("gguf_teacher")
  gguf_files.write_gguf(root / "llama.gguf", "llama", Q.F32)
  gguf_files.write_hf_directory(root / "hf", "llama")
  gguf_files.write_gguf(root / "digits.gguf", "llama", Q.F32, pre="smollm")
  return root


def teacher_logp(model, params, tok):
  """The teacher's log-probs of two chat texts (the second left-padded), from `params`, at the
  tokens that follow a real one."""
  rows = [tok.encode(teacher_lib.PROBE), tok.encode(f"{tokenizers.IM_START}user\nPush Left 2x")]
  width = max(map(len, rows))
  tokens_BxT = np.full((2, width), tok.pad_id, np.int32)
  attn_BxT = np.zeros((2, width), np.int32)
  for i, row in enumerate(rows):
    tokens_BxT[i, width - len(row) :], attn_BxT[i, width - len(row) :] = row, 1
  batch = types.SimpleNamespace(tokens_BxT=jnp.asarray(tokens_BxT), attention_mask_BxT=attn_BxT)
  scored_BxT = np.pad(attn_BxT[:, :-1] * attn_BxT[:, 1:], ((0, 0), (1, 0))) > 0
  return full_logp(ModelGraph.of(model).merge(params), batch)[scored_BxT]


def test_a_gguf_teacher_scores_as_its_weights_do_from_a_hugging_face_directory(gguf_dir):
  """The trainer's loader on a .gguf (llama.cpp's names, permuted q/k rows, its tokenizer
  metadata) against the same weights and tokenizer.json in a Hugging Face directory."""
  student_tok = tokenizers.load(str(gguf_dir / "hf"))
  loaded = []
  for name in ("llama.gguf", "hf"):
    _, exp = smoke_exp(distill_teacher=str(gguf_dir / name))
    loaded.append(teacher_lib.load(exp, student_tok))  # (model, params); the check passes
  (gguf_model, gguf_params), hf_model = loaded[0], loaded[1][0]
  assert gguf_model.config.model_type == "llama" and gguf_model.config.vocab_size == 600
  assert_same_params(hf_model, gguf_params)
  got, want = (teacher_logp(model, params, student_tok) for model, params in loaded)
  assert np.std(want) > 0.1  # a random model's scores, not a constant
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_gguf_teacher_with_another_tokenizer_is_refused_before_training(tmp_path, gguf_dir):
  # The student is llama.gguf; the teacher's vocabulary has its size and special ids but other
  # merges, so the same text is other ids.
  config, _ = smoke_exp(distill_teacher=str(gguf_dir / "digits.gguf"))
  with config.unlocked():
    config.model.checkpoint = str(gguf_dir / "llama.gguf")
  with pytest.raises(trainer.ConfigError, match="teacher's tokenizer is not the student's") as e:
    trainer.train(config, str(tmp_path / "run"))
  assert "ids of a probe text" in str(e.value)
  assert not os.listdir(tmp_path / "run" / "checkpoints")
  # A teacher of another vocabulary than the tiny student's (the sentencepiece one).
  _, exp = smoke_exp(distill_teacher=str(gguf_dir / "llama.gguf"))
  with pytest.raises(teacher_lib.TokenizerMismatch, match="vocabulary size: teacher 600"):
    teacher_lib.load(exp, policy_lib.load_tokenizer(exp.model))


def word_level_tokenizer_dir(path, weights):
  """A Hugging Face directory of `weights` with a 6-token word-level tokenizer.json."""
  models.save_hf(weights, str(path))
  vocab = {w: i for i, w in enumerate(["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
  vocab.update({"Left": 4, "Right": 5})
  tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(
      json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
  )


def test_another_tokenizer_is_refused_before_training(tmp_path):
  _, exp = smoke_exp()
  word_level_tokenizer_dir(tmp_path / "teacher", models.create(exp.model.preset, jax.random.key(0)))
  config, _ = smoke_exp(distill_teacher=str(tmp_path / "teacher"))
  with pytest.raises(trainer.ConfigError, match="teacher's tokenizer is not the student's"):
    trainer.train(config, str(tmp_path / "run"))
  assert not os.listdir(tmp_path / "run" / "checkpoints")


def test_the_tokenizer_check_compares_ids_not_only_sizes():
  spm = tokenizers.load("sentencepiece")
  teacher_lib.check_tokenizer(spm, tokenizers.load("sentencepiece"))

  class Shifted:  # the same sizes and special ids, another id for every ordinary piece
    vocab_size, eos_id, pad_id = spm.vocab_size, spm.eos_id, spm.pad_id

    def encode(self, text):
      return [i if i in (spm.eos_id, spm.pad_id) else i + 1 for i in spm.encode(text)]

  with pytest.raises(teacher_lib.TokenizerMismatch, match="ids of a probe text"):
    teacher_lib.check_tokenizer(spm, Shifted())
  with pytest.raises(teacher_lib.TokenizerMismatch, match="vocabulary size"):
    teacher_lib.check_tokenizer(spm, tokenizers.load("qwen2.5"))


def test_the_memory_estimate_counts_the_teachers_parameters_and_scoring():
  _, exp = smoke_exp()
  c = policy_lib.model_config(exp)
  sharder = sharding.Sharder(exp.mesh)
  without = memory.estimate(exp, c, sharder)
  with_teacher = memory.estimate(exp, c, sharder, teacher_config=c)
  assert without["teacher"] == 0
  params = sum(np.prod(s) for s, _ in models.param_table(c).values()) * 4  # float32
  assert params < with_teacher["teacher"] < params + without["activations"]
  assert with_teacher["total"] == pytest.approx(without["total"] + with_teacher["teacher"])

"""GGUF checkpoints held to transformers' own GGUF loader, on files written here.

Every file is a tiny random decoder written by tests/gguf_files.py as llama.cpp's converter
writes one (gguf's tensor names, Llama's q/k rows in llama.cpp's rotary order, one tensor type
for every matrix, a byte-level BPE tokenizer trained there in the metadata). transformers
(`from_pretrained(dir, gguf_file=...)`, its own reader and dequantisers) then gives the
reference logits, greedy tokens, token ids and chat prompt.

Dimensions: B batch, T tokens, V vocabulary.
"""

import json
import os
import subprocess
import sys

import gguf
from gguf import GGMLQuantizationType as Q
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from ragen_jax import logging_utils
from ragen_jax import models
from ragen_jax import sampling
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.train import restore
from gguf_files import K_QUANT_SCALES  # pylint: disable=g-bad-import-order
from gguf_files import write_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference(path):
  """transformers' model and tokenizer from the GGUF file (its own loader and dequantisers)."""
  directory, name = os.path.split(str(path))
  model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=name, dtype=torch.float32
  )
  return model.eval(), transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


def _ids(vocab: int, batch=2, length=12):
  rng = np.random.default_rng(3)
  ids_BxT = rng.integers(3, vocab, (batch, length)).astype(np.int32)
  mask_BxT = np.ones_like(ids_BxT)
  mask_BxT[1, :4] = 0  # left padding
  return ids_BxT, mask_BxT


def _reference_logits(hf_model, ids_BxT, mask_BxT):
  with torch.no_grad():
    return hf_model(
        input_ids=torch.tensor(ids_BxT, dtype=torch.long), attention_mask=torch.tensor(mask_BxT)
    ).logits.numpy()


def _assert_logits_match(ours_BxTxV, theirs_BxTxV, mask_BxT):
  real = mask_BxT.astype(bool)  # transformers' logits at padding are not defined alike
  np.testing.assert_allclose(ours_BxTxV[real], theirs_BxTxV[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "arch,qtype",
    [("llama", q) for q in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, *K_QUANT_SCALES)]
    + [("qwen2", Q.Q8_0), ("qwen2", Q.F16), ("qwen3", Q.Q4_1), ("qwen3", Q.F32)],
    ids=lambda v: getattr(v, "name", v),
)
def test_logits_match_transformers_gguf_loader(tmp_path, arch, qtype):
  path = tmp_path / f"{arch}.gguf"
  config = write_gguf(path, arch, qtype)
  hf_model, _ = reference(path)
  model = models.load_gguf(str(path))
  assert model.config.model_type == arch and model.config.vocab_size == config["vocab_size"]
  ids_BxT, mask_BxT = _ids(config["vocab_size"])
  ours = np.asarray(model(jnp.asarray(ids_BxT), attention_mask=jnp.asarray(mask_BxT)))
  _assert_logits_match(ours, _reference_logits(hf_model, ids_BxT, mask_BxT), mask_BxT)


def test_greedy_tokens_match_transformers(tmp_path):
  path = tmp_path / "llama.gguf"
  config = write_gguf(path, "llama", Q.Q8_0)
  hf_model, _ = reference(path)
  ids_BxT = np.random.default_rng(5).integers(3, config["vocab_size"], (2, 9)).astype(np.int32)
  ours = sampling.generate(
      models.load_gguf(str(path)),
      ids_BxT,
      np.ones_like(ids_BxT),
      key=jax.random.key(0),
      options=sampling.SamplingOptions(max_new_tokens=8, temperature=0.0),
  )
  with torch.no_grad():
    theirs = hf_model.generate(
        torch.tensor(ids_BxT, dtype=torch.long), max_new_tokens=8, min_new_tokens=8, do_sample=False
    )
  np.testing.assert_array_equal(np.asarray(ours.tokens_BxN), theirs[:, 9:].numpy())


@pytest.fixture(scope="module", name="llama_file")
def llama_file_fixture(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "llama.gguf"
  write_gguf(path, "llama", Q.Q4_1, pre="llama-bpe")
  return path


def test_chat_template_and_special_tokens_match_transformers(llama_file):
  ours, (_, theirs) = tokenizers.load(str(llama_file)), reference(llama_file)
  messages = [
      {"role": "system", "content": "You are x"},
      {"role": "user", "content": "Turn 1:\n_G__\nP_O_"},
      {"role": "assistant", "content": "<think>go</think><answer>Down</answer>"},
  ]
  for generation in (True, False):
    text = ours.apply_chat_template(messages, add_generation_prompt=generation)
    assert text == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation
    )
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  assert ours.eos_id == theirs.convert_tokens_to_ids("<|im_end|>") == ours.encode("<|im_end|>")[0]
  assert ours.pad_id == theirs.convert_tokens_to_ids("<|endoftext|>")
  assert ours.decode(ours.encode("a<|im_end|>b"), skip_special_tokens=True) == "ab"


_TEXT = st.lists(
    st.sampled_from(list("abcPG_O#\n\t .,'!?<>|0123456789éü中🙂") + ["<|im_end|>", "  ", "'s"]),
    max_size=40,
).map("".join)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_token_ids_match_transformers(tmp_path, pre):
  path = tmp_path / "tok.gguf"
  write_gguf(path, "qwen2", Q.F32, pre=pre)
  ours, (_, theirs) = tokenizers.load(str(path)), reference(path)

  @hypothesis.given(_TEXT)
  @hypothesis.settings(max_examples=150)
  def same_ids(text):
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == text

  # hypothesis supplies `text`.
  same_ids()  # pylint: disable=no-value-for-parameter


def test_smollm_rule_splits_digits_first_where_transformers_does_not(tmp_path):
  """llama.cpp's "smollm" rule (SmolLM's own tokenizer) splits digits off before GPT-2's rule;
  transformers' GGUF conversion applies GPT-2's alone. They agree on text without a whitespace
  run before a digit, and differ on one."""
  path = tmp_path / "smollm.gguf"
  write_gguf(path, "llama", Q.F32, pre="smollm")
  ours, (_, theirs) = tokenizers.load(str(path)), reference(path)
  for text in ("Turn 1: 2048 + 17", "a 7 b", "(3, 1)\nGoal"):
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  # "x  7": GPT-2's rule gives "x", " ", " 7"; digits first give "x", "  ", "7".
  spaces = ours.encode("  ")
  assert len(spaces) == 1 and ours.encode("x  7") == ours.encode("x") + spaces + ours.encode("7")
  assert theirs.encode("x  7", add_special_tokens=False) != ours.encode("x  7")


def test_export_of_a_gguf_file_loads_in_transformers(tmp_path, llama_file):
  out = str(tmp_path / "hf")
  # Through the command: ragen_jax.export's flags would clash with ragen_jax.evaluate's in one
  # test process.
  run = subprocess.run(
      [sys.executable, "-m", "ragen_jax.export", f"--checkpoint={llama_file}", f"--out={out}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert run.returncode == 0 and f"exported {llama_file} to {out}" in run.stdout, run.stderr[-2000:]
  theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  model = models.load_gguf(str(llama_file))
  ids_BxT, mask_BxT = _ids(model.config.vocab_size)
  ours = np.asarray(model(jnp.asarray(ids_BxT), attention_mask=jnp.asarray(mask_BxT)))
  _assert_logits_match(ours, _reference_logits(theirs, ids_BxT, mask_BxT), mask_BxT)
  hf_tok, ours_tok = transformers.AutoTokenizer.from_pretrained(out), tokenizers.load(out)
  messages = [{"role": "user", "content": "Left || Up, 12"}]
  text = ours_tok.apply_chat_template(messages, add_generation_prompt=True)
  assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
  assert hf_tok.encode(text, add_special_tokens=False) == ours_tok.encode(text)
  assert tokenizers.load(str(llama_file)).encode(text) == ours_tok.encode(text)


def _error(fn, path) -> str:
  with pytest.raises((ValueError, FileNotFoundError)) as info:
    fn(str(path))
  message = str(info.value)
  assert str(path) in message and "\n" not in message, message
  return message


def test_bad_files_are_refused_in_one_line_naming_the_file(tmp_path, llama_file):
  data = llama_file.read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[: len(data) - 1000])
  assert "not a readable GGUF file, damaged or cut short" in _error(models.load_gguf, cut)
  header = tmp_path / "header.gguf"
  header.write_bytes(data[:200])
  assert "not a readable GGUF file" in _error(models.load_gguf, header)
  junk = tmp_path / "junk.gguf"
  junk.write_bytes(b"PK\x03\x04" + bytes(100))
  assert "not a readable GGUF file" in _error(models.load_gguf, junk)
  assert "no such GGUF file" in _error(models.load_gguf, tmp_path / "absent.gguf")

  missing = tmp_path / "missing.gguf"
  write_gguf(missing, "llama", drop=("blk.1.ffn_up.weight",))
  assert "missing tensor 'blk.1.ffn_up.weight'" in _error(models.load_gguf, missing)
  wrong = tmp_path / "wrong.gguf"
  write_gguf(
      wrong, "qwen2", edit_meta={"qwen2.feed_forward_length": (96, gguf.GGUFValueType.UINT32)}
  )
  assert "the metadata implies" in _error(models.load_gguf, wrong)
  scaled = tmp_path / "scaled.gguf"
  write_gguf(
      scaled, "llama", edit_meta={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)}
  )
  assert "RoPE frequency scaling" in _error(models.load_gguf, scaled)


def test_unsupported_architecture_tensor_type_and_tokenizer(tmp_path):
  arch = tmp_path / "gemma.gguf"
  writer = gguf.GGUFWriter(str(arch), "gemma")
  writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  assert "architecture 'gemma' is not supported" in _error(models.load_gguf, arch)
  assert "does not describe a tokenizer" in _error(tokenizers.load, arch)

  odd = tmp_path / "i32.gguf"
  write_gguf(odd, "qwen2", types={"blk.0.ffn_up.weight": Q.I32})
  assert "has type I32, which the gguf package cannot dequantise" in _error(models.load_gguf, odd)

  spm = tmp_path / "spm.gguf"
  write_gguf(spm, "qwen2", edit_meta={"tokenizer.ggml.model": ("llama", gguf.GGUFValueType.STRING)})
  assert "tokenizer.ggml.model 'llama' is not supported" in _error(tokenizers.load, spm)


def test_every_checkpoint_taker_reads_gguf(llama_file):
  config = models.checkpoint.read_config(str(llama_file))
  assert (config.model_type, config.num_layers, config.hidden_size) == ("llama", 2, 256)
  assert restore.checkpoint_kind(str(llama_file)) == "gguf"
  spec = cli.load_config_file("configs/bandit_ppo.py:smoke")
  spec.model.checkpoint, spec.model.warm_start = str(llama_file), False
  assert schema.from_config(spec).model.checkpoint == str(llama_file)


def test_one_rl_step_of_a_fetched_model_through_launch(tmp_path, llama_file):
  """`configs/frozenlake_ppo.py:smollm2,smoke` with the fetched file stood in for by a tiny one
  (XDG_CACHE_HOME): the config names it, launch.py trains a step with LoRA, then evaluates."""
  env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
  code = (
      "from ragen_jax.models import fetch; import os, shutil, sys; p = fetch.path(sys.argv[1]); "
      "os.makedirs(os.path.dirname(p)); shutil.copy(sys.argv[2], p)"
  )
  subprocess.run(
      [sys.executable, "-c", code, "smollm2-135m-instruct", str(llama_file)], env=env, check=True
  )
  workdir = tmp_path / "run"
  run = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, "launch.py"),
          "--config=configs/frozenlake_ppo.py:smollm2,smoke",
          "--config.trainer.total_steps=1",
          "--config.trainer.eval_every=1",
          f"--workdir={workdir}",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  stored = json.loads((workdir / "config.json").read_text())
  assert stored["model"]["checkpoint"].startswith(str(tmp_path / "cache"))
  assert stored["model"]["lora"]["rank"] == 64 and stored["sft"]["steps"] == 0
  scalars = logging_utils.read_scalars(str(workdir))
  assert [step for step, _ in scalars["actor/pg_loss"]] == [1]
  assert [step for step, _ in scalars["val/success"]][0] == 0
  assert (workdir / "checkpoints" / "1").is_dir()

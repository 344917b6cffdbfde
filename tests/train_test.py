"""The trainer end to end on the `:smoke` config: events, checkpoints, resumption (bfloat16
weights and moments too), Ctrl-C and SIGTERM, resuming under a changed config, NaN stop, export
to transformers, evaluation of a training checkpoint, mixed environments.

One uninterrupted smoke run (module fixture) is the reference the other tests compare against.
Dimension legend: B episodes, T tokens.
"""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import algos
from ragen_jax import checkpoints
from ragen_jax import evaluate
from ragen_jax import logging_utils
from ragen_jax.train import batching
from ragen_jax.config import cli
from ragen_jax.train import restore
from ragen_jax.train import trainer
from references import comparable, run_cut_at  # pylint: disable=g-bad-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke"
# Wall-clock metrics differ between runs; everything else must match exactly.


def smoke_config(spec=SMOKE):
  return cli.load_config_file(spec)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("reference"))
  summary = trainer.train(smoke_config(), workdir)
  return workdir, summary


def test_smoke_run_writes_events_checkpoints_and_trajectories(reference_run):
  workdir, summary = reference_run
  assert summary["step"] == 4
  scalars = logging_utils.read_scalars(workdir)
  for tag in (
      "train/success",
      "train/sokoban/success",
      "val/success",
      "val/sokoban/success",
      "actor/pg_loss",
      "actor/entropy",
      "critic/vf_loss",
      "rollout/in_group_reward_std",
      "timing_s/gen",
      "timing_s/update",
      "response_length/mean",
  ):
    assert tag in scalars, tag
  assert [s for s, _ in scalars["train/success"]] == [1, 2, 3, 4]
  # The rollout's time splits into the policy, the environments and the host, within the whole
  # collection; a fraction of the decode loop's row-steps sampled a token.
  for (_, gen), *parts in zip(
      *(scalars[f"timing_s/gen{p}"] for p in ("", "_decode", "_env", "_host"))
  ):
    assert all(v >= 0 for _, v in parts) and sum(v for _, v in parts) <= gen
  assert all(0 < v <= 1 for _, v in scalars["perf/decode_row_use"])
  # Diagnostics: reasoning metrics every step, the MI family at step 1 and every 2 (smoke).
  assert [s for s, _ in scalars["collapse/valid_thinking_rate"]] == [1, 2, 3, 4]
  assert [s for s, _ in scalars["reasoning_length/mean"]] == [1, 2, 3, 4]
  for family in ("first_turn", "multi_turn"):
    assert [s for s, _ in scalars[f"collapse/{family}/num_samples"]] == [1, 2, 4]
  for step, value in scalars["collapse/multi_turn/mi_estimate"]:
    bound = dict(scalars["collapse/multi_turn/mi_upper_bound"])[step]
    assert -0.5 < value <= bound + 1e-4
  assert not [t for t in scalars if t.startswith(("early_stopped/", "early_warning/"))]
  assert [s for s, _ in scalars["val/success"]] == [0, 2, 4]  # step 0 = starting point
  assert "sft/loss" not in scalars  # RL configs start from the shipped warm start
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [0, 2, 4]
  assert ckpt.meta()["next_train_seed"] == 10000 + 4 * 2
  ckpt.close()
  texts = logging_utils.read_texts(workdir)
  assert [s for s, _ in texts["val/sokoban/trajectories"]] == [0, 2, 4]
  assert "Turn 1:" in texts["val/sokoban/trajectories"][0][1]
  assert os.path.isfile(os.path.join(workdir, "eval", "step_4.jsonl"))
  assert sorted(os.listdir(os.path.join(workdir, "viewer"))) == [
      "step_0.html",
      "step_2.html",
      "step_4.html",
  ]


def test_resumed_run_matches_the_uninterrupted_run(reference_run, tmp_path):
  ref_dir, _ = reference_run
  # The run as it was when it saved step 2 (of 4): the same call resumes it.
  workdir = run_cut_at(ref_dir, str(tmp_path / "resumed"), 2)
  assert trainer.train(smoke_config(), workdir)["step"] == 4
  ref, got = logging_utils.read_scalars(ref_dir), logging_utils.read_scalars(workdir)
  assert [s for s, _ in got["train/success"]] == [3, 4]  # step 2 not trained again
  expected = comparable(ref, {3, 4})
  assert ("actor/pg_loss", 3) in expected and ("val/success", 4) in expected
  assert comparable(got, {3, 4}) == expected
  # And the final weights are identical.
  a = restore.load_actor(ref_dir)[0]
  b = restore.load_actor(workdir)[0]
  ids = jnp.arange(12, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(np.asarray(a(ids)), np.asarray(b(ids)))


def test_bfloat16_run_resumes_exactly(tmp_path):
  """bfloat16 weights and moments (model.param_dtype, ppo.moment_dtype): the run resumed from its
  step-1 checkpoint logs step 2 and ends with the weights of the uninterrupted run."""

  def config():
    c = smoke_config()
    c.model.param_dtype, c.ppo.moment_dtype = "bfloat16", "bfloat16"
    c.trainer.total_steps, c.trainer.save_every = 2, 1
    return c

  ref_dir = str(tmp_path / "ref")
  trainer.train(config(), ref_dir)
  workdir = run_cut_at(ref_dir, str(tmp_path / "resumed"), 1)
  assert trainer.train(config(), workdir)["step"] == 2
  ref, got = logging_utils.read_scalars(ref_dir), logging_utils.read_scalars(workdir)
  assert [s for s, _ in got["train/success"]] == [2]
  assert comparable(ref, {2}) and comparable(got, {2}) == comparable(ref, {2})
  a, b = restore.load_actor(ref_dir)[0], restore.load_actor(workdir)[0]
  assert a.decoder.embedding[...].dtype == jnp.bfloat16
  jax.tree.map(np.testing.assert_array_equal, nnx.state(a), nnx.state(b))


def test_early_stop_rule_saves_ends_the_run_and_stays_stopped(tmp_path):
  workdir = str(tmp_path / "stopped")
  config = smoke_config()
  with config.unlocked():
    config.early_stop.low_val_threshold = 1.0  # this run's validations (< 1) count as "low"
    config.early_stop.low_val_patience = 2  # step 0 and step 2: fires at step 2
  summary = trainer.train(config, workdir)
  assert summary["step"] == 2 and summary["early_stopped"] == "low_val_success"
  scalars = logging_utils.read_scalars(workdir)
  assert scalars["early_stopped/low_val_success"] == [(2, 1.0)]
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.latest_step() == 2 and ckpt.meta()["early_stopped"]["rule"] == "low_val_success"
  ckpt.close()
  again = trainer.train(config, workdir)  # the same command: still stopped
  assert again == {"step": 2, "early_stopped": "low_val_success"}
  with config.unlocked():
    config.early_stop.low_val_success = "warn"  # the user chooses to go on
  resumed = trainer.train(config, workdir)
  assert resumed["step"] == 4 and "early_stopped" not in resumed


def _launch(command, *, signal_at=None, signum=signal.SIGTERM, timeout_s=300):
  """Runs launch.py `command`; with `signal_at` (a pattern), sends `signum` once a line of the
  log matches it. Returns (status, log, seconds from the signal to the exit). Fails, with the
  log's tail, when the command has not ended within `timeout_s`, whether or not it prints: a
  thread reads its output, so the deadline does not wait for a line."""
  proc = subprocess.Popen(
      command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  output = queue.Queue()

  def read():
    for line in proc.stdout:
      output.put(line)
    output.put(None)  # the end of the output

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  lines, sent = [], None
  deadline = time.monotonic() + timeout_s
  try:
    while True:
      try:
        line = output.get(timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        pytest.fail(f"no exit within {timeout_s} s; the log ends:\n" + "".join(lines[-20:]))
      if line is None:
        break
      lines.append(line)
      if signal_at and sent is None and re.search(signal_at, line):
        proc.send_signal(signum)
        sent = time.monotonic()
    status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    reader.join(10)
  return status, "".join(lines), None if sent is None else time.monotonic() - sent


def test_launch_helper_fails_a_silent_hang_at_its_deadline():
  began = time.monotonic()
  with pytest.raises(pytest.fail.Exception, match="no exit within 2 s"):
    _launch([sys.executable, "-c", "import time; time.sleep(120)"], timeout_s=2)
  assert time.monotonic() - began < 30


def _steps(workdir):
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  steps = ckpt.all_steps()
  ckpt.close()
  return steps


def test_signals_stop_cleanly_at_start_up_and_in_a_step_then_resume(reference_run, tmp_path):
  """launch.py stopped by SIGTERM (a scheduler's preemption) during start-up exits 0 at once
  having trained nothing; stopped by Ctrl-C (SIGINT) in the loop it finishes the step it is in,
  saves that step (not a periodic save: save_every is 10) and exits 0; the same command then
  resumes, and every step logs what the uninterrupted run logged. The two signals take one path
  (stop_signals.SIGNALS); SIGTERM in a step is multihost_test's SLURM preemption. One device:
  its programs are in the session's compile cache."""
  workdir = str(tmp_path / "preempted")
  command = [
      sys.executable,
      "launch.py",
      f"--config={SMOKE}",
      f"--workdir={workdir}",
      "--config.trainer.total_steps=3",
      "--config.trainer.save_every=10",
      "--config.diagnostics.compute_freq=0",
  ]
  # After the model is built: the starting point's validation (tens of seconds) is under way.
  status, log, seconds = _launch(command, signal_at=r"memory per device")
  assert status == 0, log[-3000:]
  assert "SIGTERM during start-up" in log and not re.search(r"step +1/3 ", log), log[-3000:]
  assert seconds < 120 and not os.path.exists(os.path.join(workdir, "config.json"))
  assert _steps(workdir) == []  # nothing saved: the next launch starts afresh
  status, log, _ = _launch(command, signal_at=r"^step +1/3 ", signum=signal.SIGINT)
  assert status == 0, log[-3000:]
  assert "run the same command to resume" in log and "Traceback" not in log
  trained = [s for s, _ in logging_utils.read_scalars(workdir)["train/success"]]
  assert _steps(workdir)[-1] == trained[-1] and 1 <= trained[-1] < 3
  status, log, _ = _launch(command)
  assert status == 0 and "resumed from" in log and "done at step 3" in log, log[-3000:]
  got = logging_utils.read_scalars(workdir)
  assert [s for s, _ in got["train/success"]] == [1, 2, 3]
  # The diagnostics, off here, change no rollout or update.
  want = {
      k: v
      for k, v in comparable(logging_utils.read_scalars(reference_run[0]), {1, 2, 3}).items()
      if not k[0].startswith("collapse/")
  }
  assert ("actor/pg_loss", 3) in want and ("val/success", 2) in want
  assert {k: v for k, v in comparable(got, {1, 2, 3}).items() if k in want} == want


def _files(workdir):
  """The bytes of each file directly in `workdir` (config.json, event files)."""
  out = {}
  for name in os.listdir(workdir):
    if os.path.isfile(os.path.join(workdir, name)):
      with open(os.path.join(workdir, name), "rb") as fp:
        out[name] = fp.read()
  return out


def _copy_of_run(ref_dir, workdir):
  shutil.copytree(ref_dir, workdir)
  return _files(workdir)


def test_resume_under_a_changed_config_is_refused_in_one_line(reference_run, tmp_path):
  """The learning rate, the seed and an environment option differ from the run's: launch.py
  names each with both values on one line, exits 2, and leaves the workdir byte for byte."""
  workdir = str(tmp_path / "changed")
  files = _copy_of_run(reference_run[0], workdir)
  assert "config.json" in files  # the record of the run, written by the trainer
  proc = subprocess.run(
      [
          sys.executable,
          "launch.py",
          f"--config={SMOKE}",
          f"--workdir={workdir}",
          "--config.ppo.actor_lr=0.002",
          "--config.seed.init=7",
          "--config.envs.sokoban.options.num_boxes=2",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  for change in (
      "ppo.actor_lr: 0.0001 -> 0.002",
      "seed.init: 0 -> 7",
      "envs.sokoban.options.num_boxes: 1 -> 2",
  ):
    assert change in last, last
  assert _files(workdir) == files
  assert _steps(workdir) == [0, 2, 4]


def test_allowed_and_overridden_config_changes_resume(reference_run, tmp_path, caplog):
  workdir = str(tmp_path / "allowed")
  _copy_of_run(reference_run[0], workdir)
  config = smoke_config()
  with config.unlocked():
    config.trainer.total_steps = 5  # allowed: the run goes on to step 5
    config.ppo.actor_lr = 3e-4  # refused unless allowed
  with caplog.at_level("INFO"):
    summary = trainer.train(config, workdir, allow_config_change=True)
  assert summary["step"] == 5
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert any("ppo.actor_lr: 0.0001 -> 0.0003" in w for w in warnings), warnings
  assert not any("total_steps" in w for w in warnings), warnings
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert json.loads(ckpt.meta(5)["config"])["ppo"]["actor_lr"] == 3e-4  # trained under it
  ckpt.close()
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as fp:
    assert json.load(fp)["ppo"]["actor_lr"] == 3e-4
  # The run is now one with that learning rate: the old one is the change.
  with config.unlocked():
    config.ppo.actor_lr = 1e-4
  with pytest.raises(trainer.ConfigError, match=r"ppo\.actor_lr: 0\.0003 -> 0\.0001"):
    trainer.train(config, workdir)
  with config.unlocked():
    config.ppo.actor_lr = 3e-4
    config.trainer.total_steps = 4  # shorter than the run: nothing left to train
  assert trainer.train(config, workdir)["step"] == 5
  assert _steps(workdir)[-1] == 5


def test_non_finite_loss_stops_without_saving(tmp_path, monkeypatch):
  real = algos.make_train_step

  def poisoned(*args, **kwargs):
    step_fn = real(*args, **kwargs)

    def step(state, batch, key, **kwargs):
      state, metrics = step_fn(state, batch, key, **kwargs)
      metrics = dict(metrics, **{"actor/pg_loss": jnp.where(state.step >= 2, jnp.nan, 0.0)})
      return state, metrics

    return step

  monkeypatch.setattr(algos, "make_train_step", poisoned)
  workdir = str(tmp_path / "nan")
  with pytest.raises(trainer.NonFiniteLossError, match="actor/pg_loss"):
    trainer.train(smoke_config(), workdir)
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [0]  # step 1 is not a save step; step 2 never saved
  ckpt.close()


def test_checkpoint_that_does_not_fit_the_config_is_a_clear_error(reference_run, tmp_path):
  ref_dir, _ = reference_run
  workdir = str(tmp_path / "other")
  shutil.copytree(os.path.join(ref_dir, "checkpoints"), os.path.join(workdir, "checkpoints"))
  config = smoke_config()
  with config.unlocked():
    config.ppo.adv_estimator = "grpo"  # no critic: the saved state has one
  with pytest.raises(trainer.ConfigError, match="ppo.adv_estimator: 'gae' -> 'grpo'"):
    trainer.train(config, workdir)
  # Allowed, the change still meets the checkpoint's own check of every entry.
  with pytest.raises(ValueError, match="does not fit"):
    trainer.train(config, workdir, allow_config_change=True)


def test_export_loads_in_transformers_with_the_same_logits(reference_run, tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  ref_dir, _ = reference_run
  out = str(tmp_path / "hf")
  proc = subprocess.run(
      [sys.executable, "-m", "ragen_jax.export", f"--checkpoint={ref_dir}", f"--out={out}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "exported step 4" in proc.stdout
  assert os.path.isfile(os.path.join(out, "ragen_sentencepiece.model"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
  actor = restore.load_actor(ref_dir)[0]
  ids = np.random.default_rng(0).integers(0, 2000, (2, 24))
  with torch.no_grad():
    expected = hf(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(
      np.asarray(actor(jnp.asarray(ids, jnp.int32))), expected, atol=1e-4, rtol=1e-4
  )


def test_evaluate_reads_a_training_checkpoint(reference_run, tmp_path):
  ref_dir, _ = reference_run
  metrics = evaluate.evaluate(None, checkpoint=ref_dir, output=str(tmp_path / "e.jsonl"))
  logged = logging_utils.read_scalars(ref_dir)
  # The trainer's final validation used the same policy, seeds and keys.
  assert metrics["val/success"] == logged["val/success"][-1][1]
  assert metrics["val/sokoban/response_length"] == pytest.approx(
      logged["val/sokoban/response_length"][-1][1]
  )
  assert metrics["val/num_episodes"] == 4


def test_sft_only_config_fine_tunes_validates_and_saves_step_0(tmp_path):
  workdir = str(tmp_path / "sft")
  summary = trainer.train(
      smoke_config(os.path.join(ROOT, "configs", "sokoban_sft.py:smoke")), workdir
  )
  assert summary["step"] == 0
  scalars = logging_utils.read_scalars(workdir)
  assert [s for s, _ in scalars["sft/loss"]] == [2] and "val/success" in scalars
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [0]
  ckpt.close()


@pytest.mark.parametrize("estimator", ["gae", "gigpo"])
def test_mixed_environments_share_one_batch(tmp_path, estimator):
  """GiGPO too: the environments' turn records (state keys hashed on the device) join."""
  config = smoke_config(os.path.join(ROOT, "configs", "mixed_ppo.py") + ":smoke")
  with config.unlocked():
    config.trainer.total_steps = 1
    config.sft.steps = 0
    config.ppo.adv_estimator = estimator
  summary = trainer.train(config, str(tmp_path / "mixed"))
  for tag in ("frozenlake", "bandit"):
    assert f"train/{tag}/success" in summary and f"val/{tag}/success" in summary
  assert summary["train/batch_size"] == 2 * 2 * 2
  # Every group's first turns act from its shared start state, so some share is positive.
  assert (estimator == "gigpo") == ("gigpo/step_group_share" in summary)
  assert summary.get("gigpo/step_group_share", 1.0) > 0


def test_join_batches_pads_and_offsets_group_ids():
  from ragen_jax.batch import RolloutBatch  # pylint: disable=g-import-not-at-top

  def batch(b, t, value):
    ones = np.ones((b, t), np.int32)
    return RolloutBatch(
        tokens_BxT=ones * value,
        attention_mask_BxT=ones,
        loss_mask_BxT=ones,
        logprobs_BxT=ones * 0.5,
        token_rewards_BxT=ones * 0.0,
        group_ids_B=np.repeat(np.arange(b // 2), 2),
        scores_B=np.arange(b, dtype=np.float32),
    )

  joined = batching.join_batches([batch(4, 5, 7), batch(2, 9, 8)], pad_multiple=4, pad_id=0)
  assert joined.tokens_BxT.shape == (6, 12)
  np.testing.assert_array_equal(np.asarray(joined.group_ids_B), [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(np.asarray(joined.tokens_BxT[0]), [0] * 7 + [7] * 5)
  np.testing.assert_array_equal(np.asarray(joined.attention_mask_BxT[4]), [0] * 3 + [1] * 9)
  # A batch bucketed wider than its longest sequence is cut back to that length, rounded up to
  # the multiple; the cut columns are padding only.
  wide = batch(2, 16, 9)
  wide.attention_mask_BxT[:, :10] = 0
  wide.tokens_BxT[:, :10] = 0
  cut = batching.join_batches([wide, batch(2, 3, 8)], pad_multiple=4, pad_id=0)
  assert cut.tokens_BxT.shape == (4, 8)
  np.testing.assert_array_equal(cut.tokens_BxT[0], [0, 0] + [9] * 6)
  np.testing.assert_array_equal(cut.attention_mask_BxT[3], [0] * 5 + [1] * 3)


def test_join_batches_pads_the_turn_records():
  from ragen_jax.batch import RolloutBatch, TurnBatch  # pylint: disable=g-import-not-at-top

  def batch(b, t, k):
    ones = np.ones((b, t), np.int32)
    token_turns = np.full((b, t), -1, np.int32)
    token_turns[:, -1] = k - 1
    turns = TurnBatch(
        rewards_BxK=np.ones((b, k), np.float32),
        mask_BxK=np.ones((b, k), np.int32),
        state_keys_BxK=np.full((b, k), k, np.int32),
        token_turns_BxT=token_turns,
    )
    return RolloutBatch(ones, ones, ones, ones * 0.5, ones * 0.0, np.zeros(b, np.int32),
                        np.zeros(b, np.float32), turns)  # fmt: skip

  joined = batching.join_batches([batch(2, 5, 3), batch(2, 9, 1)], pad_multiple=4, pad_id=0)
  turns = joined.turns
  assert turns.mask_BxK.tolist() == [[1, 1, 1]] * 2 + [[1, 0, 0]] * 2  # padded turns: invalid
  assert turns.state_keys_BxK[3].tolist() == [1, 0, 0]
  assert turns.token_turns_BxT.shape == joined.tokens_BxT.shape == (4, 12)
  assert turns.token_turns_BxT[0].tolist() == [-1] * 11 + [2]
  # Batches without records (hand-built ones) join without them.
  plain = batch(2, 5, 1).replace(turns=None)
  assert batching.join_batches([plain, plain], pad_multiple=4, pad_id=0).turns is None

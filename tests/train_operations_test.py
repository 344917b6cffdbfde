"""Operating a run, without training: which config changes a resume allows (config.drift),
stop signals (stop_signals, real signals sent to this process) and launch.py's one-line errors
and exit statuses (launch_utils). The end-to-end checks are in train_test.py."""

import json
import os
import signal
import time

import pytest

from ragen_jax import checkpoints
from ragen_jax.config import drift
from ragen_jax.config import cli
from ragen_jax.train import launch_utils
from ragen_jax.train import stop_signals
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "sokoban_ppo.py") + ":smoke"


def _config():
  return cli.load_config_file(SMOKE)


def test_compare_splits_allowed_from_refused_changes_with_both_values():
  stored = _config()
  now = _config()
  with now.unlocked():
    now.trainer.total_steps = 40
    now.early_stop.low_val_success = "warn"
    now.ppo.actor_lr = 3e-4
    now.envs.sokoban.options.dim_room = (7, 7)
    now.envs.sokoban.val_options = {"num_boxes": 2}  # a section empty in the stored config
  allowed, refused = drift.compare(stored.to_json_best_effort(), now.to_json_best_effort())
  assert allowed == [
      ("early_stop.low_val_success", "stop", "warn"),
      ("trainer.total_steps", 4, 40),
  ]
  assert refused == [
      ("envs.sokoban.options.dim_room", [6, 6], [7, 7]),
      ("envs.sokoban.val_options.num_boxes", drift.ABSENT, 2),
      ("ppo.actor_lr", 0.0001, 0.0003),
  ]
  assert drift.describe(refused) == (
      "envs.sokoban.options.dim_room: [6, 6] -> [7, 7]; "
      "envs.sokoban.val_options.num_boxes: (absent) -> 2; ppo.actor_lr: 0.0001 -> 0.0003"
  )
  same = stored.to_json_best_effort()
  assert drift.compare(same, same) == ([], [])


def test_a_key_added_since_the_run_was_saved_compares_at_its_default():
  """A checkpoint saved before `ppo.positive_advantages_only` existed stores no such key: the
  run behaved as its default does, so only a value other than the default is a change."""
  values = json.loads(_config().to_json_best_effort())
  del values["ppo"]["positive_advantages_only"]
  stored = json.dumps(values)
  assert drift.compare(stored, _config().to_json_best_effort()) == ([], [])
  now = _config()
  with now.unlocked():
    now.ppo.positive_advantages_only = True
  assert drift.compare(stored, now.to_json_best_effort())[1] == [
      ("ppo.positive_advantages_only", False, True)
  ]


def test_a_policy_loss_default_spelled_out_is_no_change():
  """A run saved when the clip range and aggregation were stored as 0.2 / 0.28 / token-mean
  trains as one leaving them to the "ppo" mode's defaults (None); a mode whose defaults differ
  changes them, and each setting is reported as the value in force."""
  values = json.loads(_config().to_json_best_effort())
  assert values["ppo"]["clip_low"] is None and values["ppo"]["policy_loss"] == "ppo"
  del values["ppo"]["policy_loss"]
  values["ppo"].update(clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
  stored = json.dumps(values)
  assert drift.compare(stored, _config().to_json_best_effort()) == ([], [])
  now = _config()
  with now.unlocked():
    now.ppo.policy_loss = "gspo"
  assert drift.compare(stored, now.to_json_best_effort())[1] == [
      ("ppo.agg_mode", "token-mean", "seq-mean-token-mean"),
      ("ppo.clip_high", 0.28, 0.0004),
      ("ppo.clip_low", 0.2, 0.0003),
      ("ppo.policy_loss", "ppo", "gspo"),
  ]
  with now.unlocked():
    now.ppo.update(clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
  assert drift.compare(stored, now.to_json_best_effort())[1] == [("ppo.policy_loss", "ppo", "gspo")]


def test_a_resume_under_another_param_or_moment_dtype_is_refused():
  """The checkpoint's arrays are in the stored dtypes; a resume in others would train another
  optimizer (and the Checkpointer refuses the arrays anyway, checkpoints_test.py)."""
  stored = _config().to_json_best_effort()
  for key, value in (("model.param_dtype", "bfloat16"), ("ppo.moment_dtype", "bfloat16")):
    now = _config()
    section, name = key.split(".")
    with now.unlocked():
      now[section][name] = value
    assert not drift.may_change(key)
    assert drift.compare(stored, now.to_json_best_effort()) == (
        [],
        [(key, "float32", "bfloat16")],
    )
  # A run saved before the keys existed trained in float32: it compares at the defaults.
  values = json.loads(stored)
  del values["model"]["param_dtype"], values["ppo"]["moment_dtype"]
  assert drift.compare(json.dumps(values), stored) == ([], [])


def test_may_change_names_keys_and_whole_sections():
  assert drift.may_change("trainer.total_steps")
  assert drift.may_change("early_stop.reward_std_patience")
  assert not drift.may_change("trainer.pad_multiple")
  assert not drift.may_change("early_stopping")
  assert not drift.may_change("seed.init")


def _wait_for_signal():
  time.sleep(5)  # a handler that raises ends the sleep at once
  raise AssertionError("no handler ran")


def test_a_signal_during_start_up_raises_at_once_then_waits_for_the_step():
  previous = signal.getsignal(signal.SIGTERM)
  with stop_signals.StopFlag(abort_start_up=True) as stop:
    with pytest.raises(stop_signals.StartUpInterrupted, match="SIGTERM"):
      os.kill(os.getpid(), signal.SIGTERM)
      _wait_for_signal()
  assert signal.getsignal(signal.SIGTERM) is previous
  with stop_signals.StopFlag(abort_start_up=True) as stop:
    stop.start_up_done()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    assert stop.requested  # the step goes on, then saves
    with pytest.raises(KeyboardInterrupt):  # a second signal aborts
      os.kill(os.getpid(), signal.SIGINT)
      _wait_for_signal()
  # A start-up signal whose exception a callback swallowed (JAX's gc hook does) still ends
  # start-up: the end of start-up raises it instead of going on to save.
  with stop_signals.StopFlag(abort_start_up=True) as stop:
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      _wait_for_signal()
    except stop_signals.StartUpInterrupted:
      pass  # swallowed, as by the callback
    with pytest.raises(stop_signals.StartUpInterrupted, match="SIGTERM"):
      stop.start_up_done()
  with stop_signals.StopFlag(abort_start_up=False) as stop:  # multi-process start-up
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    assert stop.requested
  assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize(
    "error, status",
    [
        (trainer.ConfigError("config: ppo.actor_lr must be > 0,\n  got -1"), 2),
        (trainer.NonFiniteLossError("step 3: actor/pg_loss is not finite (nan)"), 3),
        (trainer.EnvironmentFailure("step 2: 50% of the episodes\nFirst fault: boom"), 3),
        (checkpoints.NoUsableCheckpoint("No usable checkpoint in runs/x: step 4: ..."), 3),
        (checkpoints.SaveError("Could not save checkpoint step 4 in runs/x: the disk is full"), 3),
    ],
)
def test_operator_errors_exit_with_one_line_and_their_status(error, status, capsys):
  assert isinstance(error, launch_utils.OPERATOR_ERRORS)
  with pytest.raises(SystemExit) as exit_:
    launch_utils.fail(error)
  assert exit_.value.code == status
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err == f"error: {' '.join(str(error).split())}\n"

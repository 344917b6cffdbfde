"""`python -m ragen_jax.envs.serve ENTRY`: the command serves an environment on 127.0.0.1 until
SIGTERM (its port printed, an episode played through HttpEnv), and refuses a bad entry or bad
options in one line with exit status 2 before anything serves.
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from ragen_jax.envs.serve import server as env_server
from ragen_jax.envs.serve.client import HttpEnv

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)
TIMEOUT_S = 30.0  # generous: a loaded 2-core machine


def _cli(*args, **popen_options):
  pythonpath = [TESTS_DIR, REPO_DIR] + [p for p in [os.environ.get("PYTHONPATH")] if p]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
  return subprocess.Popen(
      [sys.executable, "-m", "ragen_jax.envs.serve", *args],
      cwd=REPO_DIR,
      env=env,
      text=True,
      **popen_options,
  )


def test_command_line_serves_until_terminated(tmp_path):
  stderr = open(tmp_path / "stderr.txt", "w+", encoding="utf-8")  # pylint: disable=consider-using-with
  process = _cli(
      "text_env_fixtures:Counter",
      "--port=0",
      "--options",
      '{"limit": 2}',
      stdout=subprocess.PIPE,
      stderr=stderr,
  )
  try:
    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
      first = lines.get(timeout=60)
    except queue.Empty:
      first = ""
    assert first.startswith("serving text_env_fixtures:Counter at http://127.0.0.1:"), (
        first,
        open(tmp_path / "stderr.txt", encoding="utf-8").read(),
    )
    url = first.split()[-1]
    with urllib.request.urlopen(url + "/health", timeout=TIMEOUT_S) as health:
      assert json.load(health) == {"ok": True, "episodes": 0}
    env = HttpEnv(url, timeout_s=TIMEOUT_S)
    assert env.reset(0) == "value 0"
    assert env.max_actions_per_turn == 2 and env.action_names == ["inc", "dec", "stop"]
    assert env.step("inc") == ("value 1", 0.0, False, {"success": False})
    process.terminate()  # mid-episode
    assert process.wait(TIMEOUT_S) == 0  # SIGTERM ends it cleanly
    start = time.monotonic()
    with pytest.raises(ConnectionError):
      env.step("inc")
    assert time.monotonic() - start < 5.0
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
    process.stdout.close()
    stderr.close()


def test_command_line_rejects_a_bad_import_path():
  process = _cli(
      "no_such_module_xyz:Env", "--port=0", stdout=subprocess.PIPE, stderr=subprocess.PIPE
  )
  try:
    out, err = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  assert process.returncode == 2 and not out, (out, err)
  assert (
      "error: environment entry 'no_such_module_xyz:Env': importing 'no_such_module_xyz' failed: "
      "ModuleNotFoundError" in err
  ), err


@pytest.mark.parametrize(
    "args, message",
    [
        (["text_env_fixtures:Nope"], "'text_env_fixtures' has no attribute 'Nope'"),
        (["text_env_fixtures:Counter.nope"], "has no attribute 'Counter.nope'"),
        (["text_env_fixtures:math"], "is not callable"),
        (["text_env_fixtures"], "must be 'package.module:Name'"),
        (["http://127.0.0.1:8000"], "is the URL of an environment served already"),
        (["text_env_fixtures:Counter", "--options", '{"nope": 1}'], "does not take"),
        (["text_env_fixtures:Counter", "--options", "[1]"], "must be a JSON object"),
        (["text_env_fixtures:Counter", "--options", "{"], "--options is not JSON"),
    ],
)
def test_command_line_rejects_bad_entries_and_options_clearly(capsys, args, message):
  # In process (the same main as the subprocess above): nothing starts serving.
  with pytest.raises(SystemExit) as exit_info:
    env_server.main([*args, "--port=0"])
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err

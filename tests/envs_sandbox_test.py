"""ragen_jax.envs.text.sandbox against real hostile programs: each ends within its limit plus a
second, is contained, and leaves no process of the sandbox's uids behind.

The isolation tests need root or user namespaces (CI runs as root); elsewhere they are skipped
with the reason the sandbox gives.
"""

import concurrent.futures
import json
import os
import socket
import subprocess
import tempfile
import textwrap
import uuid

import pytest

from ragen_jax.envs.text import sandbox as sb

LIMITS = sb.Limits(wall_s=1.5, cpu_s=1, memory_mb=256, processes=8, output_bytes=4096)
SLACK_S = 1.0  # "within its limit plus a second"


def _box(**limits) -> sb.Sandbox:
  values = {**vars(LIMITS), **limits}
  return sb.Sandbox(limits=sb.Limits(**values))


@pytest.fixture(scope="module", autouse=True)
def _isolation():
  try:
    sb.Sandbox().interpreter()
  except sb.SandboxUnavailable as e:
    pytest.skip(str(e))


def _sandbox_uids() -> range:
  return range(sb.Sandbox.uid_base, sb.Sandbox.uid_base + sb.UID_SLOTS)


def _run(code: str, stdin: str = "", **limits) -> sb.Result:
  box = _box(**limits)
  result = box.run(textwrap.dedent(code), stdin)
  assert result.wall_s < box.limits.wall_s + SLACK_S, result
  if os.geteuid() == 0:
    assert not sb.processes_of(_sandbox_uids()), "a sandboxed process is still running"
  return result


def test_runs_a_program_with_stdin_and_reports_the_interpreter():
  result = _run("import sys\nprint(sum(map(int, sys.stdin.read().split())))", "3 4 5\n")
  assert (result.status, result.stdout, result.returncode) == ("ok", "12\n", 0)
  assert os.path.isabs(result.interpreter) and result.isolation in ("root", "userns")
  failing = _run("raise ValueError('nope')")
  assert failing.status == "error" and failing.returncode == 1
  assert "ValueError: nope" in failing.stderr and 'File "solution.py"' in failing.stderr


def test_infinite_loop_is_stopped_by_the_cpu_or_wall_limit():
  result = _run("while True:\n  pass")
  assert result.timed_out and result.status == "timeout"
  assert result.killed_by in ("cpu", "wall")


def test_long_sleep_is_killed_at_the_wall_limit():
  result = _run(
      "import time\nprint('start', flush=True)\ntime.sleep(100)\nprint('end')", wall_s=1.0
  )
  assert (result.timed_out, result.killed_by) == (True, "wall")
  assert result.stdout == "start\n"  # what it printed before the kill is kept
  assert result.wall_s >= 1.0


def test_memory_bomb_hits_the_address_space_limit():
  result = _run("""
      blocks = []
      while True:
        blocks.append(bytearray(64 << 20))
      """)
  assert result.status == "oom" and "MemoryError" in result.stderr
  assert _run("x = bytearray(4 << 30)").status == "oom"


def test_fork_bomb_is_capped_by_the_process_limit():
  result = _run("""
      import os, time
      made = 0
      try:
        while True:
          if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
          made += 1
      except OSError as e:
        print(made, e.errno)
      """)
  made, error = result.stdout.split()
  assert int(made) < LIMITS.processes and int(error) == 11  # EAGAIN


def test_no_network_even_to_a_listener_on_localhost():
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    result = _run(f"""
        import socket
        try:
          socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"leak")
          print("connected")
        except OSError as e:
          print("refused", type(e).__name__)
        """)
    listener.settimeout(0.2)
    with pytest.raises(socket.timeout):
      listener.accept()
  assert result.stdout.startswith("refused"), result


def test_writes_reach_neither_the_checkout_nor_the_host_temp_dir():
  name = f"sandbox-escape-{uuid.uuid4().hex}"
  targets = [
      os.path.join(sb._CHECKOUT, name),
      os.path.join(tempfile.gettempdir(), name),
      os.path.join("/var/tmp", name),
      os.path.join("/", name),
  ]
  result = _run(f"""
      import os
      for path in {targets!r}:
        try:
          with open(path, "w") as f:
            f.write("escaped")
          print("wrote", path)
        except OSError as e:
          print("denied", path, e.errno)
      print(os.getcwd(), sorted(os.listdir(".")))
      """)
  for path in targets:
    assert not os.path.exists(path), path
  lines = result.stdout.splitlines()
  assert lines[0].startswith("denied")  # the checkout is hidden and read-only
  assert lines[1].startswith("wrote")  # /tmp is the run's own scratch tmpfs, gone after
  assert lines[3].startswith("denied")
  assert lines[4] == f"/tmp [{name!r}]"


def test_a_root_only_file_does_not_reach_the_output():
  if os.geteuid() != 0 or not os.path.exists("/etc/shadow"):
    pytest.skip("needs root and /etc/shadow")
  with open("/etc/shadow", encoding="utf-8") as f:
    secret = f.readline().strip()
  assert secret
  result = _run("""
      try:
        print(open("/etc/shadow").read())
      except OSError as e:
        print("denied", e.errno)
      """)
  assert result.stdout == "denied 13\n"
  assert secret not in result.stdout + result.stderr


def test_huge_output_is_truncated_and_bounded():
  result = _run("""
      import sys
      chunk = "x" * (1 << 20)
      for _ in range(200):
        sys.stdout.write(chunk)
      sys.stderr.write("y" * (1 << 20))
      """)
  assert result.stdout == "x" * LIMITS.output_bytes and result.stdout_truncated
  assert len(result.stderr) <= LIMITS.output_bytes


def test_a_child_left_behind_dies_with_the_run():
  result = _run("""
      import os, time
      pid = os.fork()
      if pid == 0:
        os.setsid()  # leaves the process group
        time.sleep(60)
        os._exit(0)
      print("left", pid)
      """)
  assert result.status == "ok" and result.stdout.startswith("left")
  assert not result.timed_out  # the run did not wait for its child


def test_environment_is_not_inherited(monkeypatch):
  monkeypatch.setenv("RAGEN_SECRET_TOKEN", "hunter2")
  result = _run("import os\nprint(sorted(os.environ))")
  assert "RAGEN_SECRET_TOKEN" not in result.stdout and "hunter2" not in result.stdout


def test_none_mode_runs_without_isolation_when_asked():
  box = sb.Sandbox(limits=LIMITS, sandbox="none", python=sb.SYSTEM_PYTHON)
  result = box.run("print(6 * 7)")
  assert (result.stdout, result.isolation) == ("42\n", "none")


def test_bad_configuration_is_refused():
  with pytest.raises(ValueError, match="sandbox 'off'"):
    sb.Sandbox(sandbox="off")
  with pytest.raises(ValueError, match="wall_s"):
    sb.Limits(wall_s=0)


# As an unprivileged user (the system's python, which that user can run; ragen_jax.envs's
# package init, which imports JAX, is bypassed): user namespaces, or a clear refusal.
_AS_USER = """
import json, sys, types
sys.path.insert(0, {root!r})
import ragen_jax
package = types.ModuleType("ragen_jax.envs")
package.__path__ = [{root!r} + "/ragen_jax/envs"]
sys.modules["ragen_jax.envs"] = package
from ragen_jax.envs.text import sandbox as sb
limits = sb.Limits(wall_s=1.5, cpu_s=1)
try:
  box = sb.Sandbox(limits=limits)
  run = box.run(sys.argv[1])
  print(json.dumps(["ran", box.isolation, run.stdout, run.status]))
except sb.SandboxUnavailable as e:
  none = sb.Sandbox(limits=limits, sandbox="none").run("print(7)")
  print(json.dumps(["refused", str(e), none.stdout, none.isolation]))
"""
_PROBE = """
import os, socket, time
try:
  socket.create_connection(("1.1.1.1", 53), timeout=1)
  print("network")
except OSError:
  print("no network")
if os.fork() == 0:
  os.setsid()
  time.sleep(60)
  os._exit(0)
print(os.getuid())
"""


def _as_nobody(*prefix: str) -> list:
  if os.geteuid() != 0 or not os.path.exists(sb.SYSTEM_PYTHON):
    pytest.skip("needs root (to become an unprivileged user) and the system's python")
  script = _AS_USER.format(root=sb._CHECKOUT)
  drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
  command = [*prefix, *drop, sb.SYSTEM_PYTHON, "-c", script, _PROBE]
  out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
  assert out.returncode == 0, out.stderr
  assert not sb.processes_of([65534]), "a process of the unprivileged user is left"
  return json.loads(out.stdout.splitlines()[-1])


def test_an_unprivileged_user_runs_in_user_namespaces():
  kind, isolation, stdout, status = _as_nobody()
  assert (kind, isolation, status) == ("ran", "userns", "ok")
  assert stdout.split() == ["no", "network", "65534"]


def test_without_user_namespaces_it_refuses_unless_none_is_explicit(tmp_path):
  # A chrooted process may not create user namespaces: the state of a host without them.
  root = tmp_path / "root"
  root.mkdir()
  inner = f'mount --rbind / {root} && exec chroot {root} "$@"'
  prefix = ["unshare", "--mount", "--propagation=private", "sh", "-c", inner, "sh"]
  kind, message, stdout, isolation = _as_nobody(*prefix)
  assert kind == "refused" and "sandbox='none'" in message and "user namespaces" in message
  assert (stdout, isolation) == ("7\n", "none")


def test_concurrent_runs_get_their_own_uids_and_process_counts():
  if os.geteuid() != 0:
    pytest.skip("uids are per run only as root")
  bomb = """
      import os, time
      while True:
        try:
          os.fork() or time.sleep(60)
        except OSError:
          break
      print(os.getuid())
      time.sleep(0.5)
      """
  calm = """
      import os, subprocess, time
      time.sleep(0.2)
      subprocess.run(["true"], check=True)
      print(os.getuid())
      """
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(lambda code: _box().run(textwrap.dedent(code)), [bomb, calm]))
  assert results[1].status == "ok", results[1]  # the other run's fork bomb took none of its slots
  uids = [int(r.stdout.split()[0]) for r in results]
  assert uids[0] != uids[1] and all(u in _sandbox_uids() for u in uids)
  assert not sb.processes_of(_sandbox_uids())

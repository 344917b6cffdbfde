"""A sandbox for untrusted Python (model-written code): one program, one isolated process tree.

    box = Sandbox(limits=Limits(wall_s=2.0, memory_mb=512))
    result = box.run("print(int(input()) * 2)", stdin="21\\n")
    result.stdout, result.status, result.returncode     # "42\\n", "ok", 0

Isolation (`sandbox="auto"`), every run, set up by a fresh launcher process
(ragen_jax.envs.text.sandbox_launcher) rather than in this (threaded) process:
  * its own session and process group, and its own PID namespace: on the wall-time limit the
    group is killed, and when the program's first process ends, every process it left behind
    dies with it (also ones that called setsid());
  * a fresh network namespace: only a loopback device that is down, so no connection anywhere,
    127.0.0.1 included;
  * a private mount namespace: the whole file tree read-only, an empty tmpfs (`scratch_mb`) at
    /tmp (the working directory), /var/tmp and /dev/shm, gone when the run ends; the `hidden`
    directories (the checkout and the home directory by default, the env's data directory)
    covered by empty ones; a /proc showing only the run's own processes;
  * as root, an unprivileged uid and gid of its own (one of `UID_SLOTS` from `uid_base`, locked
    per run, so RLIMIT_NPROC binds and concurrent runs never share a process count), no groups,
    no_new_privs; as another user, a user namespace with the same ids instead;
  * resource limits (`Limits`): CPU seconds, address space, processes, file size, open files,
    no core dumps; stdout and stderr are cut at `output_bytes` each (the pipe is then closed).
When the namespaces cannot be created (not root and no user namespaces) `run` raises
`SandboxUnavailable`; `sandbox="none"` (explicit) runs with the limits and the process group
only: no isolation at all.

The interpreter: `python` ("" = this process's). A virtualenv whose interpreter lives under a
root-only home cannot be run by the dropped uid: the first run probes it and falls back to the
system's (`SYSTEM_PYTHON`), logs which it chose, and every `Result.interpreter` says so.
docs/sandbox.md says what this does not protect against.
"""

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import pwd
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Optional, Tuple

from ragen_jax.config_checks import check_fields, PositiveFloat, PositiveInt
from ragen_jax.envs.text import sandbox_launcher as launcher

log = logging.getLogger("ragen_jax.envs.text.sandbox")

MODES = ("auto", "none")
SYSTEM_PYTHON = "/usr/bin/python3"
UID_SLOTS = 256  # concurrent runs as root; each holds one uid for its whole run
_LAUNCHER = os.path.abspath(launcher.__file__)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_LAUNCHER))))
_PROGRAM_ENV = {  # nothing of this process's environment (tokens, keys) reaches the program
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
}


class SandboxUnavailable(RuntimeError):
  """The isolation cannot be set up here (and `sandbox="none"` was not asked for)."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """One run's limits. `wall_s` is enforced here; the others are the kernel's rlimits."""

  wall_s: PositiveFloat = 2.0  # from start to kill, setup included
  cpu_s: PositiveInt = 2  # CPU seconds (SIGXCPU, then SIGKILL one second later)
  memory_mb: PositiveInt = 1024  # address space
  processes: PositiveInt = 16  # processes and threads of the run's uid
  file_mb: PositiveInt = 8  # the largest file it may write
  open_files: PositiveInt = 64
  output_bytes: PositiveInt = 65536  # kept of stdout and of stderr, each
  scratch_mb: PositiveInt = 64  # each tmpfs (/tmp, /var/tmp, /dev/shm)

  def __post_init__(self):
    check_fields(self, "sandbox limits")


@dataclasses.dataclass(frozen=True)
class Result:  # pylint: disable=too-many-instance-attributes
  """One run. `returncode` is negative for a signal (-9: SIGKILL), None only when killed
  before it could be read; `killed_by` is "" | "wall" | "cpu" | "signal"."""

  returncode: Optional[int]
  stdout: str
  stderr: str
  timed_out: bool  # the wall-time or the CPU-time limit ended it
  killed_by: str
  wall_s: float
  stdout_truncated: bool
  stderr_truncated: bool
  interpreter: str  # the program's interpreter (the configured one or SYSTEM_PYTHON)
  isolation: str  # "root" (uid drop), "userns", or "none"

  @property
  def status(self) -> str:
    """ok | error (nonzero exit) | timeout | oom (MemoryError) | killed (another signal)."""
    if self.timed_out:
      return "timeout"
    if self.returncode == 0:
      return "ok"
    if "MemoryError" in self.stderr[-2000:]:
      return "oom"
    return "killed" if self.returncode is None or self.returncode < 0 else "error"


_RESOLVED: Dict[tuple, str] = {}  # (python, sandbox, hidden) -> the interpreter that runs
_RESOLVE_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Sandbox:
  """Runs programs under `limits` (see the module doc). Picklable: the process pool ships it."""

  limits: Limits = Limits()
  sandbox: str = "auto"  # "auto" (namespaces; refuses where impossible) or "none"
  python: str = ""  # the program's interpreter; "" = sys.executable
  hidden: Tuple[str, ...] = ()  # more directories the program must not see
  uid_base: int = 64000  # as root, runs use uids uid_base .. uid_base + UID_SLOTS - 1

  def __post_init__(self):
    if self.sandbox not in MODES:
      raise ValueError(f"sandbox {self.sandbox!r} is not one of {MODES}")
    if not 1000 <= self.uid_base <= 2**31 - UID_SLOTS:
      raise ValueError(f"sandbox uid_base {self.uid_base} must be >= 1000 (an unused range)")

  @property
  def isolation(self) -> str:
    if self.sandbox == "none":
      return "none"
    return "root" if os.geteuid() == 0 else "userns"

  def interpreter(self) -> str:
    """The interpreter programs run with: probed once per process (see the module doc)."""
    key = (self.python or sys.executable, self.sandbox, tuple(self._hidden()))
    with _RESOLVE_LOCK:
      if key not in _RESOLVED:
        _RESOLVED[key] = self._probe(key[0])
      return _RESOLVED[key]

  def _probe(self, wanted: str) -> str:
    tried = []
    for python in dict.fromkeys((wanted, SYSTEM_PYTHON)):
      result = self._launch("import sys", "", python, Limits(wall_s=20.0))
      if result.returncode == launcher.SETUP_FAILED and launcher.SETUP_PREFIX in result.stderr:
        raise SandboxUnavailable(
            f"the sandbox cannot isolate programs here ({result.stderr.strip()}); it needs root "
            "or user namespaces. Set sandbox='none' to run model-written code unisolated."
        )
      if result.returncode == 0:
        # A configured interpreter that cannot run is worth a warning; the default one (a
        # virtualenv under a root-only home) is the expected case.
        say = log.warning if python != wanted and self.python else log.info
        reason = f" ({wanted} cannot run in the sandbox)" if python != wanted else ""
        say(f"sandbox: programs run with {python}{reason}; {self.isolation} isolation")
        return python
      tried.append(f"{python}: {result.status} {result.stderr.strip()[-200:]!r}")
    raise SandboxUnavailable(f"no interpreter runs in the sandbox; tried {'; '.join(tried)}")

  def run(self, code: str, stdin: str = "") -> Result:
    """Runs `code` as __main__ with `stdin`; never raises for anything the program does."""
    return self._launch(code, stdin, self.interpreter(), self.limits)

  def _launch(self, code: str, stdin: str, python: str, limits: Limits) -> Result:
    with _uid_slot(self.uid_base) if self.isolation == "root" else _no_slot() as uid:
      spec = {
          "namespaces": self.sandbox != "none",
          "as_root": uid is not None,
          "uid": uid,
          "gid": uid,
          "python": python,
          "env": _PROGRAM_ENV,
          "hidden": self._hidden(),
          "scratch_mb": limits.scratch_mb,
          "limits": {k: getattr(limits, k) for k in _RLIMITS},
      }
      return _execute(spec, code, stdin, limits, python, self.isolation)

  def _hidden(self) -> list:
    home = os.path.expanduser("~")
    checkout = _CHECKOUT if os.path.exists(os.path.join(_CHECKOUT, "setup.py")) else ""
    wanted = (checkout, home, *self.hidden)
    return sorted({os.path.abspath(d) for d in wanted if d and os.path.abspath(d) != "/"})


_RLIMITS = ("cpu_s", "memory_mb", "processes", "file_mb", "open_files")


def run_python(code: str, stdin: str = "", **options) -> Result:
  """`Sandbox(**options).run(code, stdin)`; `limits` may also be given as a dict."""
  if isinstance(options.get("limits"), dict):
    options["limits"] = Limits(**options["limits"])
  return Sandbox(**options).run(code, stdin)


def _memfd(name: str, data: bytes) -> int:
  fd = os.memfd_create(name, 0)  # no path anywhere; inherited by the launcher, then closed
  os.write(fd, data)
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


def _execute(spec: dict, code: str, stdin: str, limits: Limits, python: str, isolation: str):
  program = _memfd("program", code.encode("utf-8", "surrogateescape"))
  stdin_fd = _memfd("stdin", stdin.encode("utf-8", "surrogateescape"))
  spec_read, spec_write = os.pipe()
  spec["program_fd"] = program
  os.write(spec_write, json.dumps(spec).encode())  # far below a pipe's buffer
  os.close(spec_write)
  start = time.monotonic()
  try:
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-I", "-S", _LAUNCHER, str(spec_read)],
        stdin=stdin_fd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(spec_read, program),
        start_new_session=True,
        env={},
    )
  finally:
    for fd in (program, stdin_fd, spec_read):
      os.close(fd)
  outputs, cut, timed_out = _collect(proc, start + limits.wall_s, limits.output_bytes)
  returncode = proc.returncode
  killed_by = "wall" if timed_out else ""
  if returncode == -signal.SIGXCPU:
    timed_out, killed_by = True, "cpu"
  elif not timed_out and returncode is not None and returncode < 0:
    killed_by = "signal"
  text = [b.decode("utf-8", "replace") for b in outputs]
  return Result(
      returncode=returncode,
      stdout=text[0],
      stderr=text[1],
      timed_out=timed_out,
      killed_by=killed_by,
      wall_s=time.monotonic() - start,
      stdout_truncated=cut[0],
      stderr_truncated=cut[1],
      interpreter=python,
      isolation=isolation,
  )


def _collect(proc: subprocess.Popen, deadline: float, keep: int):
  """Reads stdout and stderr (the first `keep` bytes of each) until both end or `deadline`;
  then kills the process group. Returns ([stdout, stderr], [truncated x2], timed_out)."""
  streams = [proc.stdout, proc.stderr]
  outputs, cut = [bytearray(), bytearray()], [False, False]
  timed_out = False
  with selectors.DefaultSelector() as selector:
    for index, stream in enumerate(streams):
      selector.register(stream, selectors.EVENT_READ, index)
    while selector.get_map():
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        timed_out = True
        break
      for key, _ in selector.select(remaining):
        index = key.data
        chunk = os.read(key.fd, 65536)
        if chunk:
          outputs[index] += chunk[: keep + 1 - len(outputs[index])]
        if not chunk or len(outputs[index]) > keep:
          cut[index] = len(outputs[index]) > keep
          del outputs[index][keep:]
          selector.unregister(key.fileobj)
          streams[index].close()  # the program's next write fails (EPIPE)
  if not timed_out:
    try:
      proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
  if timed_out:  # the launcher kills and reaps the namespace's first process, then the group
    with contextlib.suppress(ProcessLookupError):
      proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
      proc.wait(0.5)
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  for stream in streams:
    stream.close()
  return outputs, cut, timed_out


@contextlib.contextmanager
def _no_slot():
  yield None


def _lock_dir() -> str:
  path = os.path.join(tempfile.gettempdir(), "ragen_jax_sandbox_uids")
  os.makedirs(path, mode=0o700, exist_ok=True)
  st = os.lstat(path)
  if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not os.path.isdir(path):
    raise SandboxUnavailable(f"{path} must be a directory only this user can write")
  return path


@contextlib.contextmanager
def _uid_slot(base: int):
  """A uid no other run holds (an flock per uid, across processes), swept before and after."""
  folder = _lock_dir()
  first = (os.getpid() * 7 + threading.get_ident()) % UID_SLOTS
  for k in range(UID_SLOTS):
    uid = base + (first + k) % UID_SLOTS
    if _named(uid):
      continue
    fd = os.open(os.path.join(folder, str(uid)), os.O_CREAT | os.O_RDWR, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      continue
    try:
      sweep(uid)
      yield uid
      return
    finally:
      sweep(uid)
      os.close(fd)
  raise SandboxUnavailable(f"all {UID_SLOTS} sandbox uids from {base} are in use")


def _named(uid: int) -> bool:
  try:
    pwd.getpwuid(uid)
    return True
  except KeyError:
    return False


def processes_of(uids) -> list:
  """The pids whose real uid is one of `uids` (an int or a collection; read from /proc)."""
  uids = {uids} if isinstance(uids, int) else set(uids)
  found = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
        for line in f:
          if line.startswith("State:") and line.split()[1] == "Z":
            break  # a zombie runs nothing; its parent reaps it
          if line.startswith("Uid:"):
            if int(line.split()[1]) in uids:
              found.append(int(name))
            break
    except (OSError, ValueError):
      continue  # it ended meanwhile
  return found


def sweep(uid: int, rounds: int = 100) -> None:
  """Kills every process of `uid` (normally none: the PID namespace already took them)."""
  for _ in range(rounds):
    pids = processes_of(uid)
    if not pids:
      return
    for pid in pids:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.01)
  log.warning(f"sandbox: processes of uid {uid} survive {rounds} sweeps: {processes_of(uid)}")

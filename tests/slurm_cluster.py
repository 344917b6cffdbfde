"""A throw-away SLURM cluster on this machine, for tests: munged, slurmctld and one slurmd.

    with slurm_cluster.LocalSlurm(tmp_dir) as cluster:    # raises Unavailable(reason) if it can't
      job = cluster.submit(["--ntasks=2", "experiments/launch/slurm.sh", ...], env=...)
      cluster.wait(job, timeout=300)                        # the job's final state
    # every daemon it started is stopped, by its pid file

Debian's packages (`apt-get install slurmctld slurmd slurm-client munge`, as `.ci/run` does) and
root are needed: the daemons run as root with no cgroups (proctrack/linuxproc), and munged as the
`munge` user the package creates. Everything the cluster writes (config, state, spool, logs, pid
files, munge's socket) lives under the given directory; nothing under /etc/slurm is read, and a
munged or slurm daemon already running elsewhere is left alone (own socket, own free ports).
Every client call has a timeout: with slurmctld down, sinfo and squeue hang ~9 s per call.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol")
_KEY = "/etc/munge/munge.key"
_CLIENT_TIMEOUT_S = 10
# A job's end: what `squeue` no longer lists, read from `scontrol show job`.
_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


class Unavailable(Exception):
  """This machine cannot host the cluster; the message says why (a test skips with it)."""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _which(name: str) -> Optional[str]:
  return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def missing() -> Optional[str]:
  """Why this machine cannot host the cluster, or None."""
  absent = [b for b in _BINARIES if _which(b) is None]
  if absent:
    return f"no {', '.join(absent)}: apt-get install slurmctld slurmd slurm-client munge"
  if os.geteuid() != 0:
    return "the local SLURM cluster runs its daemons as root"
  if not os.path.exists(_KEY):
    return f"no {_KEY} (the munge package writes it)"
  return None


class LocalSlurm:
  """One node, `localhost`, with `cpus` CPUs, in partition `ci` (see the module doc)."""

  def __init__(self, directory: str, cpus: int = 2, start_timeout_s: float = 60.0):
    self.dir = os.path.abspath(directory)
    self.cpus, self.start_timeout_s = cpus, start_timeout_s
    self.conf = os.path.join(self.dir, "slurm.conf")
    self._pid_files: List[str] = []
    self._munge_dir = None
    self.pids: List[int] = []  # the daemons it started, as their pid files named them

  # ------------------------------------------------------------------ up and down

  def __enter__(self) -> "LocalSlurm":
    reason = missing()
    if reason:
      raise Unavailable(reason)
    try:
      self._start()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def _start(self) -> None:
    for sub in ("ctld", "log", "spool"):
      os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
    # munged (the munge user) wants every directory above its socket searchable by all and
    # writable by root alone; a test's temporary directory is private, so it gets its own.
    munge_dir = self._munge_dir = tempfile.mkdtemp(prefix="ragen_jax_munge_")
    os.chmod(munge_dir, 0o755)
    shutil.chown(munge_dir, "munge", "munge")
    self.socket = os.path.join(munge_dir, "socket")
    self._daemon(
        "munged",
        [
            "runuser",
            "-u",
            "munge",
            "--",
            _which("munged"),
            f"--socket={self.socket}",
            f"--pid-file={munge_dir}/munged.pid",
            f"--seed-file={munge_dir}/seed",
            f"--log-file={munge_dir}/munged.log",
        ],
        os.path.join(munge_dir, "munged.pid"),
    )  # yapf: disable
    ctld_port, node_port = _free_port(), _free_port()
    d = self.dir
    lines = [
        "ClusterName=ci",
        "SlurmctldHost=localhost",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={self.socket}",
        "MpiDefault=none",
        # No cgroups: containers and CI machines seldom delegate a cgroup tree.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        # JAX's coordinator listens on 61440 + job id % 4096: a random first id keeps two test
        # sessions on one machine off each other's ports.
        f"FirstJobId={random.randrange(1, 4000)}",
        f"StateSaveLocation={d}/ctld",
        f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd.log",
        f"SlurmctldPort={ctld_port}",
        f"NodeName=localhost Port={node_port} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN",
        "PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
    ]
    with open(self.conf, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
    self._daemon("slurmctld", [_which("slurmctld"), "-f", self.conf], f"{d}/slurmctld.pid")
    self._daemon(
        "slurmd", [_which("slurmd"), "-f", self.conf, "-N", "localhost"], f"{d}/slurmd.pid"
    )
    deadline = time.monotonic() + self.start_timeout_s
    while time.monotonic() < deadline:
      if self.client(["sinfo", "-h", "-o", "%t"], check=False).strip() == "idle":
        return
      time.sleep(0.5)
    raise Unavailable(
        f"the node did not become idle in {self.start_timeout_s:.0f} s:\n{self.logs()}"
    )

  def _daemon(self, name: str, command: List[str], pid_file: str) -> None:
    """Starts a daemon that forks and writes `pid_file`; waits for the file."""
    self._pid_files.append(pid_file)
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=30, check=False, env=self.env()
    )
    deadline = time.monotonic() + 15
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
      time.sleep(0.05)
    if proc.returncode != 0 or not os.path.exists(pid_file):
      raise Unavailable(f"{name} did not start ({proc.returncode}): {proc.stderr.strip()}")

  def __exit__(self, *exc_info) -> None:
    if os.path.exists(self.conf):
      self.client(["scancel", "--full", "--user=root"], check=False)
    for pid_file in reversed(self._pid_files):  # slurmd, slurmctld, then munged
      try:
        with open(pid_file, encoding="utf-8") as f:
          pid = int(f.read().strip())
      except (OSError, ValueError):
        continue
      self.pids.append(pid)
      self._stop(pid)
    if self._munge_dir:
      shutil.rmtree(self._munge_dir, ignore_errors=True)

  @staticmethod
  def _stop(pid: int) -> None:
    try:
      os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
      return
    deadline = time.monotonic() + 15  # slurmctld saves its state before it exits
    while time.monotonic() < deadline:
      try:
        os.kill(pid, 0)
      except ProcessLookupError:
        return
      time.sleep(0.1)
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  # ------------------------------------------------------------------ clients

  def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a client (or a job submitted with --export=ALL) runs in."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**base, **(extra or {}), "SLURM_CONF": self.conf}

  def client(self, command: List[str], check: bool = True, env=None, cwd=None) -> str:
    """A SLURM client command's stdout (stderr too when `check` and it fails)."""
    try:
      proc = subprocess.run(
          command,
          cwd=cwd,
          capture_output=True,
          text=True,
          timeout=_CLIENT_TIMEOUT_S,
          env=env or self.env(),
          check=False,
      )
    except subprocess.TimeoutExpired:
      if check:
        raise
      return ""
    if check and proc.returncode != 0:
      raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout

  def submit(self, args: List[str], env: Optional[Dict[str, str]] = None, cwd=None) -> int:
    """`sbatch --parsable ARGS` from `cwd` (the job's SLURM_SUBMIT_DIR); the job id."""
    out = self.client(["sbatch", "--parsable", *args], env=self.env(env), cwd=cwd)
    return int(out.strip().split(";")[0])

  def job(self, job_id: int) -> Dict[str, str]:
    """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...)."""
    out = self.client(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    return dict(item.split("=", 1) for item in out.split() if "=" in item)

  def wait(self, job_id: int, timeout_s: float, until=_FINAL) -> Dict[str, str]:
    """Polls the job until its state is in `until`; the job record. TimeoutError after
    `timeout_s` (the job is cancelled first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      record = self.job(job_id)
      if record.get("JobState") in until:
        return record
      time.sleep(0.5)
    self.client(["scancel", str(job_id)], check=False)
    raise TimeoutError(f"job {job_id} not {until} after {timeout_s:.0f} s: {self.job(job_id)}")

  def logs(self) -> str:
    parts = []
    for name in ("slurmctld.log", "slurmd.log"):
      path = os.path.join(self.dir, "log", name)
      if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
          parts.append(f"--- {name}\n" + "".join(f.readlines()[-20:]))
    return "\n".join(parts)

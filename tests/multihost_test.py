"""Multi-process training as users start it: 2 CPU processes equal one process on as many devices,
started by a real SLURM scheduler through experiments/launch/slurm.sh, and by Open MPI's mpirun
(joining with explicit flags is checked in tests/distributed_test.py, in seconds).

The run under test: `launch.py --config=configs/sokoban_ppo.py:smoke` in 2 processes of one CPU
device each (gloo collectives), on the mesh data=1, fsdp=2, tensor=1, so the parameters and
optimizer states are split across the processes, and each process plays 2 of the 4 episodes of
every rollout. The reference: the same config on one process with 2 devices and the same mesh, 3
steps, run once for the module.

Checked against it (`multihost_runs.assert_matches`): every logged metric at every step (rollout,
validation, collapse diagnostics, losses) is identical, except actor/critic/collapse metrics
(float reductions whose order cross-process collectives could change), which must agree to 1e-5
relative; the validation trajectories are the same.
- SLURM (a one-machine cluster, tests/slurm_cluster.py): `scancel --signal=TERM` after step 1
  stops the job, which saves the checkpoint both processes write; `scontrol requeue` runs it
  again and it resumes to step 3. The
  script's own requeue (a run that ended with little time left), a failing task taking the job
  down, and `launch.py` outside srun, each with stub or real commands, in seconds; a cluster that
  does not come up in time is torn down, no daemon left.
- Open MPI: `mpirun -np 2` through the same detection, 2 steps; only process 0 writes events and
  prints progress.
Each launch has a timeout (mpirun's kills its whole session) and a process that dies takes its
peer down, so a deadlock fails the test instead of hanging it. Every process of a launch writes
the session's compilation cache (multihost_site/sitecustomize.py), so the resumed run and the
later launches load the programs an earlier launch compiled instead of compiling them again.
Without Debian's slurm or openmpi packages those tests skip, saying what to install (.ci/run
installs both).
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import multihost_runs as runs
import slurm_cluster

ROOT = runs.ROOT
# Every process of a launched run writes the compilation cache (multihost_site/sitecustomize.py):
# a resumed or second 2-process launch then compiles nothing the first one compiled.
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_site")
_MESH = ["--config.trainer.total_steps=3"]
_WAIT_S = 420  # a 2-process smoke job on 2 loaded cores takes 1-4 minutes


def _env(devices: int):
  env = runs.env(devices)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_SITE, env.get("PYTHONPATH")) if p)
  return env


def _read_eval(workdir: str, step: int):
  with open(os.path.join(workdir, "eval", f"step_{step}.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The one-process run on as many devices: (workdir, scalars)."""
  workdir = str(tmp_path_factory.mktemp("one_process"))
  proc = subprocess.run(
      [sys.executable, *runs.SMOKE, f"--workdir={workdir}", *_MESH],
      cwd=ROOT,
      env=_env(2 * runs.DEVICES_PER_PROCESS),
      capture_output=True,
      text=True,
      timeout=runs.TIMEOUT_S,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return workdir, runs.scalars(workdir)


# ------------------------------------------------------------------ SLURM


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  try:
    with slurm_cluster.LocalSlurm(str(tmp_path_factory.mktemp("slurm"))) as cluster:
      yield cluster
  except slurm_cluster.Unavailable as e:
    pytest.skip(f"no local SLURM cluster: {e}")


def test_a_cluster_that_does_not_come_up_is_torn_down(tmp_path):
  if slurm_cluster.missing():
    pytest.skip(f"no local SLURM cluster: {slurm_cluster.missing()}")
  cluster = slurm_cluster.LocalSlurm(str(tmp_path), start_timeout_s=0)
  with pytest.raises(slurm_cluster.Unavailable, match="did not become idle in 0 s"):
    with cluster:
      pass
  assert len(cluster.pids) == 3  # munged, slurmctld, slurmd: each stopped by its pid file
  for pid in cluster.pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def _job_env(**extra):
  return {**_env(runs.DEVICES_PER_PROCESS), "PYTHON": sys.executable, **extra}


def _log(path: str) -> str:
  if not os.path.exists(path):
    return ""
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


def _stub(tmp_path, body: str) -> str:
  """An executable standing in for the python that slurm.sh runs (`$PYTHON launch.py ...`)."""
  path = tmp_path / "stub_python"
  path.write_text("#!/usr/bin/env bash\n" + body)
  path.chmod(0o755)
  return str(path)


def _skip_requeue_delay(slurm, job: int, restarts: int) -> None:
  """SLURM holds a requeued batch job ~2 minutes before it may start again; start it sooner.
  Not at once: slurmd revokes the ended run's credential, and refuses a launch whose credential
  was issued in the same second or earlier ("Killing non-startable batch JobId=..: Job credential
  revoked", the job FAILED 1:0 with no output), which a start within the second of the requeue
  met under load."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    record = slurm.job(job)
    if record.get("Restarts") == str(restarts) and record.get("JobState") == "PENDING":
      time.sleep(2)  # clock seconds past the revocation
      slurm.client(["scontrol", "update", f"JobId={job}", "StartTime=now"])
      return
    time.sleep(0.2)
  raise TimeoutError(f"job {job} was not requeued: {slurm.job(job)}")


def test_slurm_job_stopped_by_the_scheduler_resumes_when_requeued(slurm, tmp_path, reference):
  ref_dir, want = reference
  workdir, log = str(tmp_path / "run"), str(tmp_path / "job.log")
  job = slurm.submit(
      [
          "--ntasks-per-node=2",
          "--cpus-per-task=1",
          f"--output={log}",
          "experiments/launch/slurm.sh",
          *runs.SMOKE[1:],
          *_MESH,
          f"--workdir={workdir}",
      ],
      env=_job_env(),
      cwd=ROOT,
  )  # yapf: disable
  deadline = time.monotonic() + _WAIT_S
  while "step 1/3 [" not in _log(log):
    assert time.monotonic() < deadline, _log(log)[-4000:]
    assert slurm.job(job).get("JobState") in ("PENDING", "RUNNING"), _log(log)[-4000:]
    time.sleep(0.3)
  slurm.client(["scancel", "--signal=TERM", str(job)])  # every task of the job's step
  record = slurm.wait(job, _WAIT_S)
  text = _log(log)
  assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
  stopped = re.search(r"stopped at step (\d+);", text)  # the step under way, or rarely step 1
  assert stopped and int(stopped[1]) < 3, text[-4000:]
  assert "requeueing" not in text  # it had time left: the script does not requeue

  slurm.client(["scontrol", "requeue", str(job)])
  _skip_requeue_delay(slurm, job, restarts=1)
  record = slurm.wait(job, _WAIT_S)
  text = _log(log)  # --open-mode=append: both runs
  assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
  assert f"checkpoints at step {stopped[1]}" in text and "done at step 3" in text
  assert "over 2 devices (2 processes)" in text
  runs.assert_matches(want, runs.scalars(workdir), upto=3)
  assert _read_eval(workdir, 3) == _read_eval(ref_dir, 3)


def test_slurm_script_requeues_a_run_that_ended_near_its_time_limit(slurm, tmp_path):
  # First run: ends at once, 2 minutes before a 2-minute limit's end (under REQUEUE_WITHIN): the
  # script requeues. Second run: gives the job 30 minutes, so it ends with time to spare.
  marks = tmp_path / "runs"
  stub = _stub(
      tmp_path,
      f"echo run >> {marks}\n"
      f'if [ "$(wc -l < {marks})" -ge 2 ]; then '
      "scontrol update JobId=$SLURM_JOB_ID TimeLimit=30; fi\n",
  )
  log = str(tmp_path / "job.log")
  job = slurm.submit(
      ["--time=2", f"--output={log}", "experiments/launch/slurm.sh", "--ignored"],
      env=_job_env(PYTHON=stub, REQUEUE_WITHIN="600"),
      cwd=ROOT,
  )
  _skip_requeue_delay(slurm, job, restarts=1)
  record = slurm.wait(job, 120)
  assert (record["JobState"], record["Restarts"]) == ("COMPLETED", "1"), _log(log)
  assert marks.read_text().count("run") == 2
  assert _log(log).count("requeueing job") == 1


def test_slurm_a_failing_task_ends_the_job(slurm, tmp_path):
  stub = _stub(tmp_path, 'if [ "$SLURM_PROCID" = 1 ]; then exit 3; fi\nsleep 300\n')
  log = str(tmp_path / "job.log")
  start = time.monotonic()
  job = slurm.submit(
      ["--ntasks-per-node=2", f"--output={log}", "experiments/launch/slurm.sh"],
      env=_job_env(PYTHON=stub),
      cwd=ROOT,
  )
  record = slurm.wait(job, 120)
  assert record["JobState"] == "FAILED" and record["ExitCode"] != "0:0", _log(log)
  assert time.monotonic() - start < 60  # task 0 was killed, not waited for
  assert "requeueing" not in _log(log)


def test_slurm_launch_outside_srun_says_to_use_srun(slurm, tmp_path):
  log = str(tmp_path / "job.log")
  job = slurm.submit(
      [
          "--ntasks-per-node=2",
          f"--output={log}",
          f"--wrap={sys.executable} launch.py --config=configs/sokoban_ppo.py:smoke",
      ],
      env=_job_env(),
      cwd=ROOT,
  )  # yapf: disable
  record = slurm.wait(job, 120)
  assert (record["JobState"], record["ExitCode"]) == ("FAILED", "2:0"), _log(log)
  assert "outside srun" in _log(log) and "Traceback" not in _log(log)


# ------------------------------------------------------------------ Open MPI


def _session_pids(sid: int):
  """Every process of session `sid` (/proc/PID/stat's 6th field)."""
  pids = []
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      with open(stat, encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (command)"
    except (OSError, IndexError):
      continue
    if int(fields[3]) == sid:
      pids.append(int(stat.split("/")[2]))
  return pids


def _run_in_own_session(command, env) -> subprocess.CompletedProcess:
  """subprocess.run in a session of its own that a timeout kills whole: mpirun's ranks are its
  children in process groups of their own, and killing mpirun alone leaves them training, on
  the cores the rest of the suite runs on."""
  with subprocess.Popen(
      command,
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=runs.TIMEOUT_S)
    except subprocess.TimeoutExpired:
      for pid in _session_pids(proc.pid):
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      proc.communicate()
      raise
  return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def test_openmpi_two_processes_match_one_process(tmp_path, reference):
  mpirun = shutil.which("mpirun")
  if mpirun is None:
    pytest.skip("no mpirun: apt-get install openmpi-bin")
  ref_dir, want = reference
  workdir = str(tmp_path / "run")
  proc = _run_in_own_session(
      [
          mpirun,
          "-np",
          "2",
          "--allow-run-as-root",
          "--oversubscribe",
          "-x",
          "XLA_FLAGS",
          "-x",
          "JAX_PLATFORMS",
          "-x",
          "PYTHONPATH",
          sys.executable,
          *runs.SMOKE,
          f"--workdir={workdir}",
          "--config.trainer.total_steps=2",
      ],
      env=_env(runs.DEVICES_PER_PROCESS),
  )  # yapf: disable
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  assert "(openmpi) as process 0" in out and "over 2 devices (2 processes)" in out
  # Process 0 alone prints progress and writes events (mpirun merges both outputs).
  assert out.count("step 2/2 [") == 1
  assert len(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))) == 1
  assert {
      ("train/success", 2),
      ("val/success", 2),
      ("actor/pg_loss", 2),
      ("collapse/multi_turn/mi_estimate", 1),
      ("critic/vf_loss", 1),
  } <= set(want)
  runs.assert_matches(want, runs.scalars(workdir), upto=2)
  assert _read_eval(workdir, 2) == _read_eval(ref_dir, 2)

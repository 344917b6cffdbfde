"""The sandbox's first process (ragen_jax.envs.text.sandbox): isolates itself, then runs the program.

Started by `sandbox.run_python` as `<trusted python> -I -S sandbox_launcher.py SPEC_FD`, a fresh
single-threaded process (no fork from the threaded parent, so nothing here can deadlock on a lock
another thread held), already the leader of its own session and process group. It reads its spec
(JSON) from SPEC_FD and then:

  1. enters new mount, network and PID namespaces (plus a user namespace when not root);
  2. forks: the child is PID 1 of the new PID namespace, so when it ends, or this launcher is
     killed and the child's parent-death signal fires, the kernel kills every process left in
     the namespace, including ones that left the process group with setsid();
  3. in the child: makes every mount private, remounts the whole tree read-only, mounts an empty
     tmpfs over /tmp (the scratch directory and working directory), /var/tmp, /dev/shm and the
     spec's hidden directories, and a fresh /proc that shows only the namespace's processes;
  4. sets the resource limits, drops to the spec's uid and gid (root) with no supplementary
     groups and no_new_privs, arms the parent-death signal, and execs the program's interpreter
     on a bootstrap that reads the program from an inherited file descriptor.
The launcher waits for the child and ends the same way (its exit code, or the same signal); on
SIGTERM it kills the child and reaps it first.
A setup failure exits with SETUP_FAILED and one line on stderr starting with SETUP_PREFIX; an
interpreter that cannot be executed, with EXEC_FAILED and EXEC_PREFIX.

Only the standard library: this file runs under `-I -S`, before anything is isolated.
"""

import ctypes
import errno
import json
import os
import resource
import signal
import sys

SETUP_FAILED = 125
SETUP_PREFIX = "sandbox setup failed: "
EXEC_FAILED = 126
EXEC_PREFIX = "sandbox cannot start the interpreter: "

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MOUNT_ATTR_RDONLY = 0x1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
SYS_MOUNT_SETATTR = 442  # the same number on x86-64 and arm64
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# The untrusted program: read from the inherited descriptor, which is then closed, and run as
# __main__ (tracebacks name "solution.py").
BOOTSTRAP = (
    "import os,sys\n"
    "f=os.fdopen(int(sys.argv[1]),'rb');s=f.read();f.close()\n"
    "sys.argv=['solution.py']\n"
    "c=compile(s,'solution.py','exec');del f,s\n"
    "exec(c,{'__name__':'__main__','__builtins__':__builtins__})\n"
)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
  if result != 0:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source, target: str, kind, flags: int, data=None) -> None:
  encode = lambda s: None if s is None else s.encode()
  _check(
      _libc.mount(
          encode(source), encode(target), encode(kind), ctypes.c_ulong(flags), encode(data)
      ),
      f"mount {target}",
  )


class _MountAttr(ctypes.Structure):
  _fields_ = [
      ("attr_set", ctypes.c_uint64),
      ("attr_clr", ctypes.c_uint64),
      ("propagation", ctypes.c_uint64),
      ("userns_fd", ctypes.c_uint64),
  ]


def _read_only_tree() -> None:
  """Every mount read-only (mount_setattr, Linux >= 5.12; else one bind remount per mount)."""
  attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
  syscall = _libc.syscall
  result = syscall(
      ctypes.c_long(SYS_MOUNT_SETATTR),
      ctypes.c_int(AT_FDCWD),
      ctypes.c_char_p(b"/"),
      ctypes.c_uint(AT_RECURSIVE),
      ctypes.byref(attr),
      ctypes.c_size_t(ctypes.sizeof(attr)),
  )
  if result == 0:
    return
  if ctypes.get_errno() != errno.ENOSYS:
    _check(result, "mount_setattr /")
  with open("/proc/self/mountinfo", encoding="utf-8") as f:
    points = [line.split()[4] for line in f]
  for point in points:
    flags = 0
    try:
      st = os.statvfs(point)
    except OSError:
      continue  # shadowed by a later mount
    for bit in (MS_NOSUID, MS_NODEV, MS_NOEXEC):  # locked flags must be kept
      flags |= bit if st.f_flag & bit else 0
    _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)


def _isolate_filesystem(spec: dict) -> None:
  _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
  _read_only_tree()
  tmpfs = f"size={int(spec['scratch_mb'])}m,mode=1777"
  for target in ("/tmp", "/var/tmp", "/dev/shm"):
    if os.path.isdir(target):
      _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
  for target in spec["hidden"]:
    if os.path.isdir(target):
      _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=755")
  _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _limit(spec: dict) -> None:
  limits = spec["limits"]
  mib = 1 << 20
  pairs = {
      resource.RLIMIT_CPU: (limits["cpu_s"], limits["cpu_s"] + 1),
      resource.RLIMIT_AS: (limits["memory_mb"] * mib,) * 2,
      resource.RLIMIT_NPROC: (limits["processes"],) * 2,
      resource.RLIMIT_FSIZE: (limits["file_mb"] * mib,) * 2,
      resource.RLIMIT_NOFILE: (limits["open_files"],) * 2,
      resource.RLIMIT_CORE: (0, 0),
  }
  for which, (soft, hard) in pairs.items():
    resource.setrlimit(which, (int(soft), int(hard)))


def _drop(spec: dict) -> None:
  if spec["uid"] is not None:
    os.setgroups([])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  # Armed after the uid change (a credential change clears it); kept across execve.
  _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")


def _child(spec: dict) -> None:
  if spec["namespaces"]:
    _isolate_filesystem(spec)
    os.chdir("/tmp")
  _limit(spec)
  _drop(spec)
  argv = [spec["python"], "-I", "-c", BOOTSTRAP, str(spec["program_fd"])]
  try:
    os.execve(spec["python"], argv, spec["env"])
  except OSError as e:  # not a setup failure: this interpreter cannot run here (unreadable)
    sys.stderr.write(f"{EXEC_PREFIX}{e!r}\n")
    sys.stderr.flush()
    os._exit(EXEC_FAILED)


def _enter_namespaces(spec: dict) -> None:
  flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
  if not spec["as_root"]:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare (user namespace)")
    with open("/proc/self/setgroups", "w", encoding="ascii") as f:
      f.write("deny")
    with open("/proc/self/uid_map", "w", encoding="ascii") as f:  # the same ids inside: the
      f.write(f"{uid} {uid} 1")  # capabilities set up the mounts, then go at execve
    with open("/proc/self/gid_map", "w", encoding="ascii") as f:
      f.write(f"{gid} {gid} 1")
  else:
    _check(_libc.unshare(flags), "unshare")


def main() -> None:
  with os.fdopen(int(sys.argv[1]), "rb") as f:
    spec = json.loads(f.read())
  try:
    if spec["namespaces"]:
      _enter_namespaces(spec)
    pid = os.fork()
  except OSError as e:
    sys.stderr.write(f"{SETUP_PREFIX}{e}\n")
    os._exit(SETUP_FAILED)
  if pid == 0:
    try:
      _child(spec)
    except BaseException as e:  # anything before execve: report, never run the program
      sys.stderr.write(f"{SETUP_PREFIX}{e!r}\n")
      sys.stderr.flush()
    os._exit(SETUP_FAILED)
  os.close(spec["program_fd"])
  # SIGTERM (the wall-time limit): kill the namespace's first process and reap it here, so no
  # orphan is left for init to reap.
  signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
      signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
  os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
  main()

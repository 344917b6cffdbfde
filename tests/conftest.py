"""Test-wide settings: strict JAX shape rules, reproducible property tests, one compile cache."""

import atexit
import os
import re
import shutil
import tempfile

# Before JAX starts: the tests' programs are compiled without LLVM's optimisations, with
# XLA:CPU's classic elemental emitters instead of its MLIR fusion emitters (whose set-up for each
# fusion dominates the compile of a small program), and as one LLVM module rather than split for
# parallel code generation (the two test workers already keep both cores busy). On 2 CPU cores
# compiling is most of the suite's time (BENCHMARKS.md, "The test suite"). The subprocesses and
# notebook kernels the tests start inherit the flags (`cpu_devices` keeps them where a test sets
# its own device count).
SESSION_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1"
)
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SESSION_XLA_FLAGS}".strip()

import hypothesis  # pylint: disable=wrong-import-position
import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

# Implicit rank promotion hides shape bugs (a [B] array meeting a [B, 1] one); tests forbid it.
jax.config.update("jax_numpy_rank_promotion", "raise")

# CI replays the same examples every run so a red build is reproducible; locally hypothesis
# keeps exploring new ones.
hypothesis.settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
hypothesis.settings.register_profile("dev", deadline=None, print_blob=True)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "dev")

# One persistent XLA compilation cache per test session, shared with the subprocesses and
# notebook kernels the tests start (they inherit the environment). The end-to-end tests compile
# the same `:smoke` programs again and again, and on 2 CPU cores compiling is most of their time.
# A fresh directory each session (removed at exit): no session reads another's entries. Every
# program is stored, however quickly it compiled: a `:smoke` launch makes some 150 small ones,
# and with all of them cached a second launch takes 12 s instead of 17 s (34 s cold;
# BENCHMARKS.md, "The test suite").
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache_dir = tempfile.mkdtemp(prefix="ragen_jax_test_xla_cache_")
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)


# The end-to-end files hold most of the suite's time. Collected first (with pytest-xdist's
# `--dist loadfile` in pytest.ini), they start first on the two workers of the README's command
# instead of last, when the other worker would have little left to run beside them. The other
# files that hold a long test follow, longest first (the README command's slowest tests, e.g.
# train_lora_test's ~2 minutes): in alphabetical order they came last, where one of them could
# keep a worker busy after the other had run out of files.
_LONG_FILES = (
    "multihost_test.py",
    "train_test.py",
    "train_text_envs_test.py",
    "sharding_test.py",
    "notebooks_test.py",
    "evaluate_test.py",
)
_EARLY_FILES = (
    "train_lora_test.py",
    "train_visual_test.py",
    "learn_from_pixels_test.py",
    "experiments_gpu_learn_test.py",
    "rollout_windows_test.py",
    "api_policy_test.py",
    "diagnostics_scoring_test.py",
    "train_step_test.py",
    "algos_policy_modes_test.py",
    "train_sft_test.py",
    "rollout_text_envs_test.py",
    "envs_sokoban_test.py",
    "logging_trackers_test.py",
    "rollout_dynamic_sampling_test.py",
)


def pytest_collection_modifyitems(items):
  first = _LONG_FILES + _EARLY_FILES
  for item in items:  # the slow tier (pytest.ini): `pytest -m "not slow"` runs the rest
    if os.path.basename(str(item.fspath)) in first:
      item.add_marker(pytest.mark.slow)

  def rank(item):
    name = os.path.basename(str(item.fspath))
    return first.index(name) if name in first else len(first)

  items.sort(key=rank)  # stable: the order within and among the other files is kept


# ------------------------------------------------------------------ time limits, and skips in CI

# pytest.ini's per-test limit, longer for the end-to-end files: one test there may run several
# smoke trainings in subprocesses, after its module fixture's own.
_LONG_TIMEOUT_S = 1800


def pytest_itemcollected(item):
  if os.path.basename(str(item.fspath)) in _LONG_FILES and not item.get_closest_marker("timeout"):
    item.add_marker(pytest.mark.timeout(_LONG_TIMEOUT_S))


# Under CI (CI set and not "0"/"false", as CI services set it), a skip is a failure: .ci/run
# installs every dependency the tests need ([dev], Chromium) and runs as root, so a skip there
# means a broken install, not a missing optional piece. Only tests for an accelerator the
# machine lacks may skip; their reasons name it.
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false")
_ACCELERATOR_SKIP = re.compile(r"\b(GPU|TPU)\b|CPU program")


def _fail_skip_under_ci(report):
  if not _CI or not report.skipped or hasattr(report, "wasxfail"):
    return
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
  if not _ACCELERATOR_SKIP.search(reason):
    report.outcome = "failed"
    report.longrepr = f"skipped under CI, where nothing may be missing: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  _fail_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  outcome = yield  # a module-level importorskip skips the whole file here
  _fail_skip_under_ci(outcome.get_result())

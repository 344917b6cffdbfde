"""Orbax checkpoints of a training run: atomic, last-k kept, verified on restore, never NaN.

  ckpt = checkpoints.Checkpointer(workdir / "checkpoints", keep=3)
  ckpt.save(step, state, meta={"seed_counter": 40})    # state: any pytree (TrainState, dicts)
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(like=state)              # the newest usable step, shapes checked

Each step is one directory holding the state (Orbax's standard pytree format) and a JSON
metadata item; Orbax writes into a temporary directory and renames it when complete, so an
interrupted save never leaves a readable half checkpoint. A state with a NaN or infinite
value is refused (`NonFiniteError`) so a diverged run can never overwrite good weights.

Restore checks what it reads against a record saved with the step (`checkpoint_integrity`:
each array's shape, dtype and checksums) and that floating arrays are finite. A step that does
not read or fails the check (truncated or emptied files, missing metadata, an empty directory
left by an interrupted copy, changed bytes) is skipped with one warning for the next older one;
when none is usable, `NoUsableCheckpoint` lists every step tried and why. A readable checkpoint
that does not fit the expected state (another model size, another optimizer) raises a
`ValueError` naming the first mismatching entry instead: no older step of that run would fit.
`latest_step()` counts a damaged step until restore has tried it, so a run whose checkpoints
are all damaged stops instead of starting afresh over them; saving that step number again
renames the damaged directory to `<step>.unusable`, kept for inspection.

A save that fails (a full disk) raises `SaveError`, one line naming the directory and its free
space, and removes its temporary directory; those of killed saves go at the first save of the
next run (not on opening: evaluating a live run must not touch a save in progress).

Multi-process runs: every process calls save and restore (orbax writes and reads each array's
shards from the processes that hold them, and the JSON metadata from process 0 only); the
directory must be on a filesystem all processes share. All processes follow process 0's listing
of the steps and skip a step that any of them found unusable, so they restore the same one.
"""

import contextlib
import errno
import logging as std_logging
import os
import re
import shutil
import sys
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from ragen_jax import checkpoint_integrity as integrity
from ragen_jax import distributed

# Orbax 0.12.8 writes step N into "N.orbax-checkpoint-tmp" (older versions add "-<timestamp>").
_TMP_NAME = re.compile(r"(\d+)\.orbax-checkpoint-tmp.*")
# Files every complete step holds (orbax's names): their absence is a clearer reason than the
# error reading them raises.
_REQUIRED_FILES = ("meta/metadata", "state/_METADATA")


class NonFiniteError(ValueError):
  """Raised instead of saving a state that holds NaN or infinite values."""


class NoUsableCheckpoint(RuntimeError):
  """Raised by restore when every step tried is unreadable or damaged; names each and why."""


class SaveError(RuntimeError):
  """Raised when a checkpoint could not be written (a full disk); the message is one line."""


class _Unusable(Exception):
  """A step that cannot be restored; the message is the reason."""


def _finite_checks(flat: Dict[str, Any]) -> Dict[str, integrity.Check]:
  sums = integrity.checks(flat)
  for path, (_, _, finite) in sums.items():
    if not finite:
      raise NonFiniteError(f"Refusing to save a non-finite state: {path} holds NaN or inf.")
  return sums


def check_finite(state) -> None:
  """Raises NonFiniteError naming the first floating leaf that holds NaN or inf."""
  _finite_checks(integrity.flat(integrity.savable(state)))


def _reason(error: BaseException) -> str:
  """One line for an exception: its type and the first line of its message, shortened."""
  text = (str(error).strip().splitlines() or [""])[0]
  text = text if len(text) <= 300 else text[:297] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _agreed(problem: Optional[str]) -> Optional[str]:
  """The first process's problem (None: no process had one), the same on every process."""
  problems = distributed.allgather(problem)
  for index, found in enumerate(problems):
    if found is not None:
      return found if len(problems) == 1 else f"process {index}: {found}"
  return None


def _skip_if_any(problem: Optional[str]) -> None:
  """Raises _Unusable on every process when any process found a problem with the step."""
  problem = _agreed(problem)
  if problem:
    raise _Unusable(problem)


def _size(num_bytes: float) -> str:
  for unit in ("bytes", "KiB", "MiB", "GiB"):
    if num_bytes < 1024 or unit == "GiB":
      return f"{num_bytes:.0f} {unit}" if unit == "bytes" else f"{num_bytes:.1f} {unit}"
    num_bytes /= 1024
  raise AssertionError("unreachable")


def _out_of_space(error: Optional[BaseException]) -> bool:
  while error is not None:
    if getattr(error, "errno", None) == errno.ENOSPC or os.strerror(errno.ENOSPC) in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


_ORBAX_DIR = os.path.dirname(ocp.__file__)


def _through_orbax(tb) -> bool:
  while tb is not None:
    if tb.tb_frame.f_code.co_filename.startswith(_ORBAX_DIR):
      return True
    tb = tb.tb_next
  return False


def _quiet_orbax_failure_reports() -> None:
  """Keeps the reports of work orbax abandons off the console (installed once, process-wide).

  When one array fails to write or read, the failure reaches the caller as one exception, and
  is reported once (`SaveError`, a step found unusable). Orbax closes its event loop under the
  work still pending, whose callbacks then report "Event loop is closed", whose futures
  "exception was never retrieved" and whose coroutines an ImportError at exit, each with a
  traceback: hundreds for a large state, during the failure and long after it. Only these are
  held back (a successful read or write makes none); anything else still shows.
  """
  if getattr(sys.unraisablehook, "quiets_orbax", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)
    abandoned = str(getattr(code, "co_filename", "")).startswith(_ORBAX_DIR)
    closed = isinstance(unraisable.exc_value, RuntimeError) and (
        str(unraisable.exc_value) == "Event loop is closed"
    )
    if not (abandoned or closed):
      previous(unraisable)

  def keep(record) -> bool:
    return not (record.exc_info and _through_orbax(record.exc_info[2]))

  hook.quiets_orbax = True
  sys.unraisablehook = hook
  std_logging.getLogger("asyncio").addFilter(keep)


@contextlib.contextmanager
def _orbax_errors_held_back():
  """Keeps orbax's error records off the console while a save runs: each of its writer threads
  logs a failure, with a traceback, before it reaches the caller as one exception."""

  def keep(record) -> bool:
    return not (record.pathname.startswith(_ORBAX_DIR) and record.levelno >= std_logging.ERROR)

  logger = logging.get_absl_logger()
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)


class Checkpointer:
  """Saves and restores training state under `directory`, keeping the newest `keep` steps."""

  def __init__(self, directory: str, keep: int = 3):
    if keep < 1:
      raise ValueError(f"keep must be at least 1, got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    # Handlers named up front, so a new process can read metadata of steps it did not write.
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        },
    )
    _quiet_orbax_failure_reports()
    self._unusable = set()  # steps found unusable by restore or meta
    self._saved_once = False
    self._steps = self._listing()

  def _listing(self) -> List[int]:
    # Process 0's view: a shared filesystem may show a new step to processes at different
    # moments, and every process must make the same choice.
    return distributed.allgather(sorted(self._manager.all_steps()))[0]

  def latest_step(self) -> Optional[int]:
    """The newest step on disk not found unusable (a damaged one counts until restore tries
    it), or None for a directory without checkpoints."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def all_steps(self) -> List[int]:
    return [s for s in self._steps if s not in self._unusable]

  # ------------------------------------------------------------------ save

  def save(self, step: int, state: Any, meta: Optional[Dict[str, Any]] = None) -> None:
    """Writes `state` (checked finite) and JSON-serialisable `meta` as step `step`; blocks.

    Raises:
      NonFiniteError: `state` holds NaN or inf (nothing is written).
      SaveError: the checkpoint could not be written (its temporary directory is removed).
    """
    step, meta = int(step), dict(meta or {})
    if integrity.RECORD_KEY in meta:
      raise ValueError(f"meta must not use the key {integrity.RECORD_KEY!r}: it holds the record")
    savable = integrity.savable(state)
    flat = integrity.flat(savable)
    meta[integrity.RECORD_KEY] = integrity.record(flat, _finite_checks(flat))
    self._clear_the_way(step)
    try:
      with _orbax_errors_held_back():
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(savable), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-exception-caught
      raise SaveError(self._failed_save(step, e, flat)) from e
    self._steps = self._listing()

  def _clear_the_way(self, step: int) -> None:
    """Before the first save: removes temporary directories of killed saves. Moves aside a
    directory at `step` that restore found unusable (the run went back past it)."""
    first, self._saved_once = not self._saved_once, True
    moved = step in self._steps and step in self._unusable
    if jax.process_index() == 0:
      if first:
        leftovers = self._temporary_dirs()
        for name in leftovers:
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        if leftovers:
          logging.warning(
              "removed %d incomplete checkpoint saves from %s: %s",
              len(leftovers),
              self.directory,
              ", ".join(leftovers),
          )
      if moved:
        source = os.path.join(self.directory, str(step))
        target, n = f"{source}.unusable", 1
        while os.path.exists(target):
          n += 1
          target = f"{source}.unusable{n}"
        os.rename(source, target)
        logging.warning("moved the unusable checkpoint step %d aside to %s", step, target)
    if moved:
      self._unusable.discard(step)
      distributed.sync("checkpoints_move_aside")
      self._manager.reload()
      self._steps = self._listing()

  def _temporary_dirs(self, step: Optional[int] = None) -> List[str]:
    names = os.listdir(self.directory) if os.path.isdir(self.directory) else []
    found = [(n, _TMP_NAME.fullmatch(n)) for n in names]
    return sorted(n for n, m in found if m and (step is None or int(m.group(1)) == step))

  def _failed_save(self, step: int, error: Exception, flat: Dict[str, Any]) -> str:
    """Removes what the failed save of `step` left; returns the line that reports it."""
    for name in self._temporary_dirs(step):
      shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    try:
      free = f"{_size(shutil.disk_usage(self.directory).free)} free there"
    except OSError as e:
      free = f"free space unknown: {_reason(e)}"
    if _out_of_space(error):
      state = sum(np.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in flat.values())
      cause = f": the disk is full ({free}, the state is {_size(state)} before compression)"
    else:
      cause = f" ({free}): {_reason(error)}"
    return (
        f"Could not save checkpoint step {step} in {self.directory}{cause}; the incomplete save "
        "was removed and the earlier steps are untouched."
    )

  # ------------------------------------------------------------------ restore

  def restore(self, like: Any, step: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]:
    """Restores step `step` (default: the newest usable one) into the structure of `like`.

    Args:
      like: a state of the expected structure, shapes and dtypes (e.g. a freshly initialised
        one); its values are not used.
      step: which step; None for the newest that reads back intact (older steps are tried,
        one warning each, when newer ones are unreadable or damaged).

    Returns:
      (state, meta): the state rebuilt with `like`'s types, and the saved metadata.

    Raises:
      FileNotFoundError: no checkpoint (at that step).
      NoUsableCheckpoint: every step tried is unreadable or damaged; the message lists each.
      ValueError: the checkpoint does not fit `like`; the message names the first difference.
    """
    target = integrity.savable(like)
    expected = {path: integrity.spec(x) for path, x in integrity.flat(target).items()}
    state, meta = self._first_usable(
        self._candidates(step), lambda s: self._restore_step(s, target, expected)
    )
    return integrity.typed(like, state), meta

  def meta(self, step: Optional[int] = None) -> Dict[str, Any]:
    """The JSON metadata saved with step `step` (default: the newest whose metadata reads),
    without the state."""
    return self._first_usable(self._candidates(step), self._read_meta_agreed)

  def _candidates(self, step: Optional[int]) -> List[int]:
    """The steps to try, newest first."""
    steps = self.all_steps() if step is None else [int(step)]
    if not steps or steps[0] not in self._steps:
      raise FileNotFoundError(
          f"No checkpoint{'' if step is None else f' at step {step}'} in {self.directory}."
      )
    return steps[::-1]

  def _first_usable(self, steps: List[int], attempt):
    """attempt(step) for each of `steps` until one does not raise _Unusable."""
    tried = []
    for i, step in enumerate(steps):
      try:
        return attempt(step)
      except _Unusable as e:
        self._unusable.add(step)
        tried.append(f"step {step}: {e}")
        if jax.process_index() == 0:
          then = f"trying step {steps[i + 1]}" if i + 1 < len(steps) else "no other step to try"
          logging.warning(
              "checkpoint step %d in %s is unusable (%s); %s", step, self.directory, e, then
          )
    raise NoUsableCheckpoint(
        f"No usable checkpoint in {self.directory}: {'; '.join(tried)}. Move these step "
        "directories aside to start the run afresh, or put an intact copy in their place."
    )

  def _read_meta(self, step: int) -> Dict[str, Any]:
    """The step's JSON metadata, record included; raises _Unusable when it does not read."""
    step_dir = os.path.join(self.directory, str(step))
    try:
      if not os.listdir(step_dir):
        raise _Unusable("its directory is empty")
    except OSError as e:
      raise _Unusable(f"its directory does not list: {_reason(e)}") from e
    for name in _REQUIRED_FILES:
      if not os.path.isfile(os.path.join(step_dir, name)):
        raise _Unusable(f"{name} is missing")
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-exception-caught
      raise _Unusable(f"its metadata does not read: {_reason(e)}") from e
    if not isinstance(meta["meta"], dict):
      raise _Unusable(f"its metadata is not a JSON object: {meta['meta']!r:.80}")
    return dict(meta["meta"])

  def _read_meta_agreed(self, step: int) -> Dict[str, Any]:
    meta, problem = None, None
    try:
      meta = self._read_meta(step)
    except _Unusable as e:
      problem = str(e)
    _skip_if_any(problem)
    meta.pop(integrity.RECORD_KEY, None)
    return meta

  def _restore_step(self, step: int, target, expected) -> Tuple[Any, Dict[str, Any]]:
    """One step read and verified; every process reaches the same verdict at each stage."""
    meta, rec, saved, problem = None, None, None, None
    try:
      meta = self._read_meta(step)
      rec = meta.pop(integrity.RECORD_KEY, None)
      try:
        saved = {
            path: integrity.spec(x)
            for path, x in integrity.flat(self._manager.item_metadata(step)["state"]).items()
        }
      except Exception as e:  # pylint: disable=broad-exception-caught
        raise _Unusable(f"its array metadata does not read: {_reason(e)}") from e
      # The record is written with the arrays but apart from orbax's own array metadata, so a
      # damaged one is told apart from a checkpoint of another model.
      differs = rec is not None and integrity.difference(saved, integrity.record_specs(rec))
      if differs:
        raise _Unusable(f"its array metadata disagrees with the record saved with it: {differs}")
    except _Unusable as e:
      problem = str(e)
    _skip_if_any(problem)
    misfit = _agreed(
        integrity.difference(integrity.record_specs(rec) if rec is not None else saved, expected)
    )
    if misfit:
      raise ValueError(
          f"The checkpoint step {step} in {self.directory} does not fit this run: {misfit}."
      )
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    state = None
    try:
      state = self._manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
      )["state"]
    except Exception as e:  # pylint: disable=broad-exception-caught
      problem = f"its arrays do not read: {_reason(e)}"
    _skip_if_any(problem)
    _skip_if_any(integrity.damage(rec, integrity.flat(state)))  # every process sums its shards
    return state, meta

  def close(self) -> None:
    self._manager.close()

"""Stopping a run on a signal: Ctrl-C (SIGINT) or SIGTERM, what SLURM, Kubernetes and TPU
maintenance send before they kill a job.

    with stop_signals.StopFlag(abort_start_up=True) as stop:
      ...                          # start-up: the first signal raises StartUpInterrupted
      stop.start_up_done()         # from here the first signal only sets `stop.requested`
      ... if stop.requested: save, exit 0

In the training loop the first signal asks the run to finish its current step, save a
checkpoint and exit with status 0 (a requeued job then resumes where it stopped); a second
signal raises KeyboardInterrupt (abort without saving). During start-up (building the model,
restoring, the warm start, step-0 validation) nothing trained is at stake: with
`abort_start_up` the first signal raises `StartUpInterrupted` at once, so the process exits
within the grace period a scheduler allows, leaving the workdir as it found it (checkpoints are
written atomically). Multi-process runs pass `abort_start_up=False`: a signal reaching only some
processes must not leave the others waiting in a collective, so every process finishes start-up
and they stop together at the first check (`distributed.any_across`).
"""

import signal

from absl import logging

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartUpInterrupted(BaseException):
  """A stop signal arrived during start-up, before anything was trained.

  A BaseException, as KeyboardInterrupt is: raised wherever the main thread happens to be, it
  must pass the `except Exception` of library code (logging swallows errors of its handlers).
  """


class StopFlag:
  """Handles `SIGNALS` while entered (main thread only; elsewhere signals act as usual)."""

  def __init__(self, abort_start_up: bool):
    self.requested = False
    self._signal = ""  # the first signal's name
    self._abort = abort_start_up
    self._previous = {}

  def __enter__(self):
    for signum in SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: no handler
        pass
    return self

  def start_up_done(self) -> None:
    """From now on the first signal waits for the current step (and a save) to finish.

    Raises StartUpInterrupted if a signal came during start-up and its exception was lost:
    raised inside a callback that swallows exceptions (JAX's garbage-collection hook does),
    it never reached the caller.
    """
    if self._abort and self.requested:
      raise StartUpInterrupted(self._signal)
    self._abort = False

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.requested:
      raise KeyboardInterrupt(f"second stop signal ({name})")
    self.requested, self._signal = True, name
    if self._abort:
      raise StartUpInterrupted(name)
    logging.warning(
        "%s: finishing this step, saving a checkpoint, then exiting "
        "(send it again to abort without saving)",
        name,
    )

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      # None: the previous handler was not installed from Python (e.g. by a C++ library).
      signal.signal(signum, signal.SIG_DFL if previous is None else previous)

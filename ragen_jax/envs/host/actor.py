"""One episode's host env instance: its actor thread and the checks of what it returns.

`Actor` owns one instance on its own daemon thread and serves that episode's calls in order,
turning whatever the env does into a `Start`, an `Outcome` or an `EnvFault` (the records of
ragen_jax.envs.host.records). Both modes of `ragen_jax.envs.host.pool.HostPool` run their episodes
in actors (in mode="process", inside the worker processes of `ragen_jax.envs.host.workers`); the
fault kinds are documented in ragen_jax.envs.host.pool.
"""

from collections.abc import Mapping, Sequence
import math
import numbers
import queue
import threading
import traceback as traceback_lib
from typing import Any, Callable

from ragen_jax.envs import tools as tools_lib
from ragen_jax.envs.host.records import EnvFault
from ragen_jax.envs.host.records import log as _log
from ragen_jax.envs.host.records import one_line
from ragen_jax.envs.host.records import Outcome
from ragen_jax.envs.host.records import Plan
from ragen_jax.envs.host.records import Start

# ---------------------------------------------------------------------------------------------
# Calling one env and checking what it returns.


class _Failed(Exception):
  """Ends the current env call with `fault`."""

  def __init__(self, fault: EnvFault):
    super().__init__(fault.message)
    self.fault = fault


def _fail(kind: str, message: str):
  raise _Failed(EnvFault(kind, one_line(message)))


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def _call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
  """fn(*args); whatever it raises becomes a "raised" fault naming `what`."""
  try:
    return fn(*args)
  except BaseException as exc:  # an env's SystemExit must not end its actor silently
    detail = f": {exc}" if str(exc) else ""
    message = one_line(f"{what} raised {type(exc).__name__}{detail}")
    tb = "".join(traceback_lib.format_exception(exc))
    raise _Failed(EnvFault("raised", message, tb)) from None


def _scalar(value: Any, dtype_kinds: str) -> Any:
  """A Python or NumPy real number as is, a 0-d array (NumPy, JAX) of those kinds as its item;
  None for anything else."""
  if isinstance(value, numbers.Real):
    return value
  dtype = getattr(value, "dtype", None)
  if getattr(value, "shape", None) == () and getattr(dtype, "kind", None) in tuple(dtype_kinds):
    return value.item()
  return None


def _check_reward(value: Any) -> float:
  number = _scalar(value, "biuf")
  try:
    reward = None if number is None else float(number)
  except (OverflowError, TypeError, ValueError):
    reward = None
  if reward is None or not math.isfinite(reward):
    _fail("bad_reward", f"step returned the reward {_short(value)}, not a finite real number")
  return reward


def _check_done(value: Any) -> bool:
  flag = _scalar(value, "biu")
  if isinstance(flag, bool) or (isinstance(flag, numbers.Integral) and flag in (0, 1)):
    return bool(flag)
  return _fail("bad_output", f"step returned done={_short(value)}, not a bool")


def _info_flag(info: Mapping, key: str, default: bool) -> bool:
  value = info.get(key, default)
  try:
    return bool(value)
  except Exception:  # e.g. a NumPy array of several elements
    return _fail("bad_output", f"step returned info[{key!r}]={_short(value)}, not a bool")


def _check_step(output: Any) -> tuple[str, float, bool, Mapping]:
  if isinstance(output, (str, bytes)) or not isinstance(output, Sequence):
    _fail("bad_output", f"step returned a {type(output).__name__}, not a 4-tuple")
  if len(output) != 4:
    _fail(
        "bad_output",
        f"step returned a {type(output).__name__} of {len(output)} items, not "
        "(observation, reward, done, info)",
    )
  observation, reward, done, info = output
  if not isinstance(observation, str):
    _fail("bad_observation", f"step returned a {type(observation).__name__} observation")
  reward, done = _check_reward(reward), _check_done(done)
  if info is None:
    info = {}
  elif not isinstance(info, Mapping):
    _fail("bad_output", f"step returned a {type(info).__name__} info, not a dict or None")
  return observation, reward, done, info


def _check_start(env: Any, observation: Any) -> Start:
  if not isinstance(observation, str):
    _fail("bad_observation", f"reset returned a {type(observation).__name__}, not a str")
  instruction = _call("reading instruction", getattr, env, "instruction", "")
  instruction = "" if instruction is None else instruction
  if not isinstance(instruction, str):
    _fail("bad_output", f"instruction is a {type(instruction).__name__}, not a str")
  names = _call("reading action_names", getattr, env, "action_names", None)
  if names is not None:
    try:
      names = None if isinstance(names, (str, bytes)) else tuple(names)
    except TypeError:
      names = None
    if names is None or not all(isinstance(name, str) for name in names):
      _fail("bad_output", f"action_names={_short(names)} is not a sequence of str or None")
  per_turn = _call("reading max_actions_per_turn", getattr, env, "max_actions_per_turn", None)
  if per_turn is not None:
    if isinstance(per_turn, bool) or not isinstance(per_turn, numbers.Integral) or per_turn < 1:
      _fail("bad_output", f"max_actions_per_turn={_short(per_turn)} is not a positive int or None")
    per_turn = int(per_turn)
  tools = _call("reading tools", getattr, env, "tools", None)
  try:
    tools = tools_lib.as_tools(tools)
  except TypeError as e:
    _fail("bad_output", str(e))
  return Start(observation, instruction, names, per_turn, tools)


class Actor:
  """One episode's instance on its own daemon thread, serving that episode's calls in order.

  Calls: ("reset", seed) -> Start | EnvFault, ("step", actions) -> Outcome | EnvFault,
  ("expert", None) -> Plan | EnvFault, ("close", None) -> None (and the thread ends). `reply(result)` runs on the actor's thread.
  """

  def __init__(self, factory: Callable[[], Any], name: str):
    self._factory = factory
    self._env = None
    self._observation = ""
    self._done = False
    self._inbox = queue.SimpleQueue()
    threading.Thread(target=self._serve, name=name, daemon=True).start()

  def submit(self, op: str, payload: Any, reply: Callable[[Any], None]) -> None:
    self._inbox.put((op, payload, reply))

  def _serve(self) -> None:
    while True:
      op, payload, reply = self._inbox.get()
      result = None
      try:
        if op == "reset":
          result = self._reset(payload)
        elif op == "step":
          result = self._step(payload)
        elif op == "expert":
          result = self._expert()
        else:
          self._close()
      except _Failed as failed:
        result = failed.fault
      except Exception as exc:  # a bug here: report it rather than time out
        message = one_line(f"host pool error in {op}: {type(exc).__name__}: {exc}")
        result = EnvFault("pool", message, "".join(traceback_lib.format_exception(exc)))
      try:
        reply(result)
      except Exception:
        _log.debug("host pool: delivering a result failed", exc_info=True)
      if op == "close":
        return

  def _reset(self, seed: int) -> Start:
    self._env = _call("the env factory", self._factory)
    observation = _call("reset", self._reset_env, seed)
    start = _check_start(self._env, observation)
    self._observation = observation
    return start

  def _reset_env(self, seed: int) -> Any:
    return self._env.reset(seed)

  def _step_env(self, action: str) -> Any:
    return self._env.step(action)

  def _step(self, actions: Sequence[str]) -> Outcome:
    reward, success, executed, effective, valid = 0.0, False, 0, 0, True
    for action in actions:
      if self._done:
        break
      observation, step_reward, done, info = _check_step(_call("step", self._step_env, action))
      self._observation, self._done = observation, done
      reward += step_reward
      executed += 1
      success = _info_flag(info, "success", False) or success
      effective += _info_flag(info, "action_is_effective", True)
      valid = _info_flag(info, "action_is_valid", True) and valid
    return Outcome(self._observation, reward, self._done, success, executed, effective, valid)

  def _expert(self) -> Plan:
    out = _call("expert", self._env.expert)
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not isinstance(out[1], str):
      _fail("bad_output", f"expert() returned {_short(out)}, not (answers or None, thought)")
    answers, thought = out
    if answers is not None:
      if isinstance(answers, (str, bytes)) or not all(isinstance(a, str) for a in answers):
        _fail("bad_output", f"expert() answers {_short(answers)} are not a list of str")
      answers = tuple(answers)
    return Plan(answers, thought)

  def _close(self) -> None:
    try:
      if callable(getattr(self._env, "close", None)):
        self._env.close()
    except Exception:
      _log.debug("host pool: an env's close() raised", exc_info=True)

"""HostPool: results equal direct stepping, every fault kind ends only its own episode, hung envs
block neither the caller nor interpreter exit, and worker processes are isolated and cleaned up.
"""

import functools
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import hypothesis
from hypothesis import strategies as st
import pytest

from ragen_jax.envs.host import records
from ragen_jax.envs.host.pool import HostPool
import text_env_fixtures as fixtures

REPO = pathlib.Path(__file__).resolve().parent.parent
# Far below any hang in the fixtures; far above what a healthy call takes on a busy machine.
TIMEOUT_S = 1.0
# "Did not hang": generous next to TIMEOUT_S, far below the fixtures' 30 s sleeps.
PROMPT_S = 10.0
WALK_TURNS = [["up"], ["stay", "junk"], ["bare", "np"], ["up", "up", "up", "up"], ["up"]]


def _replay(factory, seed, turns):
  """The reference: one instance stepped directly, in order, with the pool's accounting."""
  env = factory()
  observation = env.reset(seed)
  names = env.action_names
  start = records.Start(
      observation,
      env.instruction or "",
      None if names is None else tuple(names),
      env.max_actions_per_turn,
  )
  outcomes, done = [], False
  for actions in turns:
    reward, success, executed, effective, valid = 0.0, False, 0, 0, True
    for action in actions:
      if done:
        break
      observation, step_reward, step_done, info = env.step(action)
      info = info or {}
      reward += float(step_reward)
      done = bool(step_done)
      executed += 1
      success = success or bool(info.get("success", False))
      effective += bool(info.get("action_is_effective", True))
      valid = valid and bool(info.get("action_is_valid", True))
    outcomes.append(records.Outcome(observation, reward, done, success, executed, effective, valid))
  return start, outcomes


def _play(pool, seeds, turns):
  """Resets `seeds` and steps every episode through `turns`; results per episode."""
  starts = pool.reset(seeds)
  outcomes = [[] for _ in seeds]
  for actions in turns:
    results = pool.step({i: actions for i in range(len(seeds))})
    assert list(results) == list(range(len(seeds)))
    for i, result in results.items():
      outcomes[i].append(result)
  return starts, outcomes


def _expected(factory, seeds, turns):
  pairs = [_replay(factory, seed, turns) for seed in seeds]
  return [start for start, _ in pairs], [outcomes for _, outcomes in pairs]


def _kinds(results):
  return {i: r.kind if isinstance(r, records.EnvFault) else type(r).__name__ for i, r in results}


# ---------------------------------------------------------------------------------------------
# Thread mode: results.


def test_thread_mode_equals_direct_stepping():
  factory = functools.partial(fixtures.PoolWalk, goal=4)
  seeds = [0, 1, 2, 5, 7]
  with HostPool(factory, step_timeout_s=30) as pool:
    got = _play(pool, seeds, WALK_TURNS)
    assert got == _expected(factory, seeds, WALK_TURNS)
    # A second batch on the same pool: fresh instances.
    assert _play(pool, seeds[::-1], WALK_TURNS) == _expected(factory, seeds[::-1], WALK_TURNS)


def test_outcome_fields():
  with HostPool(functools.partial(fixtures.PoolWalk, goal=4)) as pool:
    start = pool.reset([2])[0]  # starts at 2
    assert start == records.Start("at 2", "Walk from 2 to 4.", fixtures.PoolWalk.action_names, 3)
    # Defaults when info is None: effective and valid, no success.
    assert pool.step({0: ["bare"]})[0] == records.Outcome(
        "at 2 after bare", 0.25, False, False, 1, 1, True
    )
    assert pool.step({0: ["junk", "stay"]})[0] == records.Outcome(
        "at 2 after stay", -0.6, False, False, 2, 0, False
    )
    # Done after the second action: the rest is not executed (PoolWalk raises if it were).
    assert pool.step({0: ["up", "up", "up", "junk"]})[0] == records.Outcome(
        "at 4 after up", 2.0, True, True, 2, 2, True
    )
    # A finished episode executes nothing.
    assert pool.step({0: ["up"]})[0] == records.Outcome(
        "at 4 after up", 0.0, True, False, 0, 0, True
    )
    assert pool.step({}) == {}


def test_step_steps_only_the_keys_given_in_their_order():
  with HostPool(fixtures.PoolWalk) as pool:
    pool.reset([0, 0, 0])
    results = pool.step({2: ["up"], 0: ["up", "up"]})
    assert list(results) == [2, 0]
    assert (results[2].observation, results[0].observation) == ("at 1 after up", "at 2 after up")
    assert pool.step({1: ["stay"]})[1].observation == "at 0 after stay"
    with pytest.raises(IndexError):
      pool.step({3: ["up"]})
    with pytest.raises(TypeError):
      pool.step({0: "up"})


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    seeds=st.lists(st.integers(0, 100), min_size=1, max_size=4),
    turns=st.lists(
        st.lists(st.sampled_from(fixtures.PoolWalk.action_names), max_size=5), max_size=5
    ),
    goal=st.integers(1, 5),
)
def test_property_pool_equals_in_order_replay(seeds, turns, goal):
  factory = functools.partial(fixtures.PoolWalk, goal=goal)
  with HostPool(factory, step_timeout_s=30) as pool:
    assert _play(pool, seeds, turns) == _expected(factory, seeds, turns)


# ---------------------------------------------------------------------------------------------
# Thread mode: faults, each ending only its own episode.


def test_reset_raises():
  with HostPool(fixtures.PoolFaulty, step_timeout_s=TIMEOUT_S) as pool:
    starts = pool.reset([0, -1, 1])
    fault = starts[1]
    assert fault.kind == "raised"
    assert fault.message == "reset raised ZeroDivisionError: integer division or modulo by zero"
    assert "Traceback" in fault.traceback and "ZeroDivisionError" in fault.traceback
    assert starts[0] == records.Start("seed 0", "", None, None)
    assert starts[2].observation == "seed 1"
    results = pool.step({0: ["a"], 1: ["a"], 2: ["b"]})
    assert results[1].kind == "pool" and "already failed (raised)" in results[1].message
    assert results[0].observation == "did a" and results[2].observation == "did b"


def test_factory_raises():
  def factory():
    raise OSError("no display")

  with HostPool(factory) as pool:
    (fault,) = pool.reset([0])
    assert fault.kind == "raised"
    assert fault.message == "the env factory raised OSError: no display"


def test_step_raises_with_traceback():
  with HostPool(fixtures.PoolFaulty, step_timeout_s=TIMEOUT_S) as pool:
    pool.reset([0, 1])
    results = pool.step({0: ["ok", "raise", "ok"], 1: ["ok"]})
    fault = results[0]
    assert fault.kind == "raised"
    assert fault.message == "step raised ZeroDivisionError: division by zero"
    assert "Traceback" in fault.traceback and "return 1 / 0" in fault.traceback
    assert results[1] == records.Outcome("did ok", 1.0, False, False, 1, 1, True)
    again = pool.step({0: ["ok"], 1: ["ok"]})
    assert again[0].kind == "pool" and "episode 0 already failed" in again[0].message
    assert again[1].observation == "did ok"


def test_step_hangs_past_the_timeout():
  factory = functools.partial(fixtures.PoolFaulty, hang_s=30)
  with HostPool(factory, step_timeout_s=TIMEOUT_S) as pool:
    pool.reset([0, 1, 2])
    began = time.monotonic()
    results = pool.step({0: ["ok", "hang"], 1: ["ok", "ok"], 2: ["raise"]})
    assert time.monotonic() - began < PROMPT_S
    assert results[0].kind == "timeout" and "abandoned" in results[0].message
    assert results[1] == records.Outcome("did ok", 2.0, False, False, 2, 2, True)
    assert results[2].kind == "raised"
    assert pool.step({0: ["ok"], 1: ["ok"]})[1].observation == "did ok"
    began = time.monotonic()
    pool.close()  # the hung instance is not waited for
    assert time.monotonic() - began < PROMPT_S


def test_reset_hangs_past_the_timeout():
  factory = functools.partial(fixtures.PoolFaulty, hang_s=30)
  with HostPool(factory, step_timeout_s=TIMEOUT_S) as pool:
    began = time.monotonic()
    starts = pool.reset([-3, 4])
    assert time.monotonic() - began < PROMPT_S
    assert starts[0].kind == "timeout" and starts[1].observation == "seed 4"
    assert pool.reset([5])[0].observation == "seed 5"  # not blocked by the hung instance


def test_reset_returns_a_non_string():
  with HostPool(fixtures.PoolFaulty) as pool:
    starts = pool.reset([-2, 0])
    assert starts[0].kind == "bad_observation" and "int" in starts[0].message
    assert starts[1].observation == "seed 0"


@pytest.mark.parametrize(
    "action, kind",
    [
        ("int_obs", "bad_observation"),
        ("nan", "bad_reward"),
        ("inf", "bad_reward"),
        ("str_reward", "bad_reward"),
        ("list_out", "bad_output"),
        ("five", "bad_output"),
        ("bad_info", "bad_output"),
        ("bad_done", "bad_output"),
    ],
)
def test_step_returns_bad_values(action, kind):
  with HostPool(fixtures.PoolFaulty, step_timeout_s=TIMEOUT_S) as pool:
    pool.reset([0, 1])
    results = pool.step({0: ["ok", action, "ok"], 1: ["ok"]})
    assert results[0].kind == kind and results[0].message.startswith("step returned")
    assert "\n" not in results[0].message
    assert results[1].observation == "did ok"


@pytest.mark.parametrize("which", ["action_names", "max_actions_per_turn", "instruction"])
def test_malformed_attributes(which):
  with HostPool(functools.partial(fixtures.PoolNoisyAttributes, which)) as pool:
    (fault,) = pool.reset([0])
    assert fault.kind == "bad_output" and which in fault.message


def test_close_closes_live_instances_once():
  factory = functools.partial(fixtures.PoolFaulty, hang_s=30, close_raises=True)
  fixtures.PoolFaulty.closed.clear()
  pool = HostPool(factory, step_timeout_s=TIMEOUT_S)
  pool.reset([0, 1, 2])
  pool.step({2: ["hang"]})  # abandoned: never closed
  pool.reset([3, 4])  # closes episodes 0 and 1 of the first batch (close raises: swallowed)
  assert len(fixtures.PoolFaulty.closed) == 2
  pool.close()
  pool.close()
  assert len(fixtures.PoolFaulty.closed) == 4
  with pytest.raises(RuntimeError, match="closed"):
    pool.step({0: ["ok"]})
  with pytest.raises(RuntimeError, match="closed"):
    pool.reset([0])


def _run_script(script, timeout):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
  return subprocess.run(
      [sys.executable, "-c", textwrap.dedent(script)],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
  )


def test_hung_env_does_not_block_interpreter_exit():
  # No close(): the hung actor must not keep the interpreter alive (it sleeps 10 minutes).
  done = _run_script(
      """
      import functools
      from ragen_jax.envs.host.pool import HostPool
      import text_env_fixtures as fixtures
      pool = HostPool(
          functools.partial(fixtures.PoolFaulty, hang_s=600), step_timeout_s=0.5)
      pool.reset([0, 1])
      results = pool.step({0: ["hang"], 1: ["ok"]})
      print(results[0].kind, type(results[1]).__name__)
      """,
      timeout=120,
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["timeout", "Outcome"]


def test_validation_of_arguments():
  with pytest.raises(ValueError, match="mode"):
    HostPool(fixtures.PoolWalk, mode="fork")
  with pytest.raises(ValueError, match="step_timeout_s"):
    HostPool(fixtures.PoolWalk, step_timeout_s=0)
  with pytest.raises(TypeError):
    HostPool(fixtures.PoolWalk())


# ---------------------------------------------------------------------------------------------
# Process mode.


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def _wait_gone(pids, within_s=PROMPT_S):
  deadline = time.monotonic() + within_s
  while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  return [pid for pid in pids if _alive(pid)]


def test_process_mode_equals_thread_mode():
  factory = functools.partial(fixtures.PoolWalk, goal=3)
  seeds = [0, 1, 2, 3, 4]
  with HostPool(factory, mode="process", workers=2, step_timeout_s=30) as pool:
    got = _play(pool, seeds, WALK_TURNS)
    assert len(pool.worker_pids()) == 2
    again = _play(pool, seeds[:2], WALK_TURNS)  # the same workers serve the next batch
    assert len(pool.worker_pids()) == 2
  assert got == _expected(factory, seeds, WALK_TURNS)
  assert again == _expected(factory, seeds[:2], WALK_TURNS)
  with HostPool(factory, step_timeout_s=30) as pool:
    assert _play(pool, seeds, WALK_TURNS) == got


def test_process_mode_faults_and_hang_on_one_worker():
  factory = functools.partial(fixtures.PoolFaulty, hang_s=30)
  # One worker: every episode shares it with the hung one.
  with HostPool(factory, mode="process", workers=1, step_timeout_s=TIMEOUT_S) as pool:
    starts = pool.reset([0, 1, -1, 3])
    assert starts[2].kind == "raised" and "ZeroDivisionError" in starts[2].traceback
    (pid,) = pool.worker_pids()
    began = time.monotonic()
    results = pool.step({0: ["hang"], 1: ["ok", "ok"], 3: ["nan"]})
    assert time.monotonic() - began < PROMPT_S
    assert _kinds(results.items()) == {0: "timeout", 1: "Outcome", 3: "bad_reward"}
    assert results[1].reward == 2.0
    later = pool.step({0: ["ok"], 1: ["ok"]})  # the worker still serves episode 1
    assert later[0].kind == "pool" and later[1].observation == "did ok"
    # The worker holding the hung actor is replaced at the next reset.
    assert pool.reset([7])[0].observation == "seed 7"
    assert pool.worker_pids() != [pid] and not _wait_gone([pid])
    assert pool.step({0: ["ok"]})[0].observation == "did ok"


def test_killed_worker_fails_its_episodes_and_is_restarted():
  factory = functools.partial(fixtures.PoolFaulty, slow_s=1.5)
  with HostPool(factory, mode="process", workers=2, step_timeout_s=60) as pool:
    pool.reset([0, 1, 2, 3])  # worker 0: episodes 0 and 2
    pids = pool.worker_pids()
    killer = threading.Timer(0.3, os.kill, (pids[0], signal.SIGKILL))
    killer.start()
    began = time.monotonic()
    results = pool.step({i: ["slow"] for i in range(4)})
    killer.join(PROMPT_S)
    assert not killer.is_alive() and time.monotonic() - began < PROMPT_S
    assert _kinds(results.items()) == {0: "pool", 1: "Outcome", 2: "pool", 3: "Outcome"}
    assert str(pids[0]) in results[0].message
    assert pool.step({2: ["ok"]})[2].kind == "pool"
    starts = pool.reset([5, 6, 7, 8])
    assert [s.observation for s in starts] == ["seed 5", "seed 6", "seed 7", "seed 8"]
    new_pids = pool.worker_pids()
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert all(r.observation == "did ok" for r in pool.step({i: ["ok"] for i in range(4)}).values())


def test_unpicklable_factory_is_refused():
  with pytest.raises(ValueError, match="mode='thread'"):
    # pylint: disable-next=unnecessary-lambda
    HostPool(lambda: fixtures.PoolWalk(), mode="process")

  class Local(fixtures.PoolWalk):
    pass

  with pytest.raises(ValueError, match="module-level"):
    HostPool(Local, mode="process")
  HostPool(Local).close()  # fine in thread mode


def test_process_close_leaves_no_children():
  with HostPool(fixtures.PoolWalk, mode="process", workers=2) as pool:
    assert pool.worker_pids() == []  # started lazily
    pool.reset([0, 1, 2])
    pids = pool.worker_pids()
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
  assert not _wait_gone(pids, within_s=0.0)  # close() joined them
  assert not {p.pid for p in multiprocessing.active_children()} & set(pids)
  pool.close()  # idempotent


def test_process_workers_do_not_outlive_the_interpreter():
  done = _run_script(
      """
      from ragen_jax.envs.host.pool import HostPool
      import text_env_fixtures as fixtures
      pool = HostPool(fixtures.PoolWalk, mode="process", workers=2)
      pool.reset([0, 1])
      print(*pool.worker_pids(), flush=True)
      """,
      timeout=120,
  )
  assert done.returncode == 0, done.stderr
  pids = [int(pid) for pid in done.stdout.split()]
  assert len(pids) == 2
  assert not _wait_gone(pids)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_expert_calls_the_instances_own_expert(mode):
  with HostPool(fixtures.PoolExpert, mode=mode, workers=2) as pool:
    pool.reset([0, 1, 2])
    plans = pool.expert([2, 0])
    assert list(plans) == [2, 0]
    assert plans[0] == records.Plan(("up",) * 4, "4 to go.")
    assert plans[2] == records.Plan(("up",) * 2, "2 to go.")
    pool.step({0: ["up"]})
    assert pool.expert([0])[0].answers == ("up",) * 3  # the state after the step
  with HostPool(functools.partial(fixtures.PoolExpert, goal=99), mode=mode) as pool:
    pool.reset([0, 1])
    plans = pool.expert([0, 1])
    assert plans[0].kind == "bad_output" and "expert() returned" in plans[0].message
    assert isinstance(plans[1], records.Plan)
    assert pool.step({0: ["up"]})[0].kind == "pool"  # the failed episode is not called again

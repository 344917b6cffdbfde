"""Test-only: every process of the runs tests/multihost_test.py launches writes the XLA cache.

Python imports this module at start-up from PYTHONPATH, which those tests point here. JAX writes
persistent compilation cache entries from process 0 alone, and on CPU each process's cache key
holds that process's own device topology, so without this process 1 would compile every program
of every 2-process launch, the resumed run and the Open MPI run included, with the others waiting
for it in their first collective. Here each process writes its own entries (different keys, so
never the same file). What the processes compute and exchange is unchanged. Without the private
function wrapped here (another JAX), nothing changes but the time.
"""

try:
  from jax._src import compiler as _compiler
  from jax._src import distributed as _distributed
except ImportError:  # pragma: no cover - a JAX without these modules: leave it alone
  _compiler = None

if _compiler is not None and hasattr(_compiler, "_cache_write"):
  _process_0_write = _compiler._cache_write  # pylint: disable=protected-access

  def _cache_write(*args, **kwargs):
    # Its one process check reads the global state's process id: this process passes as 0.
    state = _distributed.global_state
    process_id, state.process_id = state.process_id, 0
    try:
      return _process_0_write(*args, **kwargs)
    finally:
      state.process_id = process_id

  _compiler._cache_write = _cache_write  # pylint: disable=protected-access

#!/usr/bin/env bash
# One process of a multi-process run, on any machines that reach each other over TCP.
#
# Run the same command on every host (or several times on one host), changing only PROCESS_ID:
#   COORDINATOR=host0:12355 NUM_PROCESSES=2 PROCESS_ID=0 experiments/launch/multinode.sh \
#       --config=configs/sokoban_ppo.py --workdir=/shared/runs/sokoban_ppo
# COORDINATOR is process 0's host and a free port (process 0 listens there). The workdir must be
# on a filesystem every process sees (NFS, ...): all of them write the orbax checkpoints.
# Extra arguments go to launch.py. Two CPU processes on this machine, 2 devices each:
#   for i in 0 1; do COORDINATOR=localhost:12355 NUM_PROCESSES=2 PROCESS_ID=$i JAX_PLATFORMS=cpu \
#     XLA_FLAGS=--xla_force_host_platform_device_count=2 experiments/launch/multinode.sh \
#     --config=configs/sokoban_ppo.py:smoke --workdir=/tmp/sokoban_2proc & done; wait
set -euo pipefail
: "${COORDINATOR:?set COORDINATOR=host:port (process 0)}"
: "${NUM_PROCESSES:?set NUM_PROCESSES}"
: "${PROCESS_ID:?set PROCESS_ID (0 .. NUM_PROCESSES-1)}"
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
# launch.py reads these (ragen_jax/distributed.py); flags would do the same.
export JAX_COORDINATOR_ADDRESS="$COORDINATOR" JAX_NUM_PROCESSES="$NUM_PROCESSES" \
  JAX_PROCESS_ID="$PROCESS_ID"
exec "$PYTHON" launch.py "$@"

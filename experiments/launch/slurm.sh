#!/usr/bin/env bash
# SLURM: one process per host (all its GPUs) or one per GPU; every process runs launch.py.
# Submit from the repository root (sbatch runs a copy of this script elsewhere).
#
#   sbatch --nodes=2 experiments/launch/slurm.sh --config=configs/sokoban_ppo.py:qwen2.5-0.5b-h100 \
#       --config.model.checkpoint=/shared/Qwen2.5-0.5B-Instruct --workdir=/shared/runs/qwen05b
#   sbatch --nodes=2 --ntasks-per-node=8 experiments/launch/slurm.sh ...    # one process per GPU
#
# JAX finds the coordinator (the first node), the process count and each process's index in
# SLURM's variables (jax.distributed.initialize() with no arguments). With one process per GPU,
# process i of a node uses that node's GPU SLURM_LOCALID; GPUs are allocated per node, not bound
# per task, so each process can select its own. The workdir must be on a shared filesystem.
#SBATCH --job-name=ragen_jax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --output=ragen_jax_%j.log
# Preemption: SIGTERM 180 s before the kill lets the run finish its step and save (exit 0);
# a requeued job resumes from that checkpoint.
#SBATCH --signal=TERM@180
#SBATCH --requeue
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
# srun starts the tasks; each one decides its GPUs from its own SLURM variables.
srun --kill-on-bad-exit=1 bash -c '
  if [ "${SLURM_NTASKS_PER_NODE:-1}" = 1 ]; then
    # One process per host: without this JAX would give it only GPU SLURM_LOCALID (= 0).
    gpus="${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L | wc -l)}"
    export JAX_LOCAL_DEVICE_IDS="$(seq -s, 0 $((gpus - 1)))"
  fi
  exec "$0" launch.py "$@"' "$PYTHON" "$@"

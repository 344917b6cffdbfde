#!/usr/bin/env bash
# SLURM: one process per node (all its GPUs) or one per GPU; every process runs launch.py.
# Submit from the repository root (sbatch runs a copy of this script elsewhere). Resources are
# submit-time options, so the script fits any cluster:
#
#   sbatch --nodes=2 --gpus-per-node=8 --cpus-per-task=32 experiments/launch/slurm.sh \
#       --config=configs/sokoban_ppo.py:qwen2.5-0.5b-h100 \
#       --config.model.checkpoint=/shared/Qwen2.5-0.5B-Instruct --workdir=/shared/runs/qwen05b
#   sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=4 \
#       experiments/launch/slurm.sh ...                      # one process per GPU
#   sbatch --nodes=1 --ntasks-per-node=2 experiments/launch/slurm.sh \
#       --config=configs/sokoban_ppo.py:smoke --config.mesh.fsdp=2 --workdir=runs/smoke2  # 2 CPU processes
#
# JAX finds the coordinator (the first node), the process count and each process's index in
# SLURM's variables (jax.distributed.initialize() with no arguments, inside srun). With one
# process per GPU, process i of a node uses that node's GPU SLURM_LOCALID; GPUs are allocated per
# node, not bound per task, so each process can select its own. The workdir must be on a shared
# filesystem. Tested under a one-node SLURM 22.05 cluster (tests/multihost_test.py).
#
# Stopping: 180 s before the time limit every task gets SIGTERM (--signal below); the run
# finishes its step, saves and exits 0, and this script then requeues the job (it ended with
# under REQUEUE_WITHIN seconds left), which resumes from that checkpoint: a long run goes on
# across time limits by itself. `scancel --signal=TERM <job>` stops a run the same way, without
# the requeue; submitting the same command again resumes it. Preemption is the cluster's policy:
# SLURM sends SIGTERM at once and SIGKILL after the partition's GraceTime (the run saves if that
# covers a step and a checkpoint), the --signal warning only with
# SlurmctldParameters=preempt_send_user_signal, and requeues only under PreemptMode=REQUEUE.
#SBATCH --job-name=ragen_jax
#SBATCH --nodes=1
#SBATCH --time=24:00:00
#SBATCH --output=ragen_jax_%j.log
#SBATCH --open-mode=append
#SBATCH --signal=TERM@180
#SBATCH --requeue
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
REQUEUE_WITHIN="${REQUEUE_WITHIN:-300}"
# srun starts the tasks; each one decides its GPUs from its own SLURM variables.
srun --kill-on-bad-exit=1 bash -c '
  per_node="${SLURM_STEP_TASKS_PER_NODE:-1}"  # "2" or "2(x3)": this node'"'"'s tasks first
  if [ "${per_node%%[(,]*}" = 1 ]; then
    # One process per node: without this JAX would give it only GPU SLURM_LOCALID (= 0).
    gpus="${SLURM_GPUS_ON_NODE:-}"
    if [ -z "$gpus" ] && command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L | wc -l); fi
    if [ "${gpus:-0}" -gt 0 ]; then export JAX_LOCAL_DEVICE_IDS="$(seq -s, 0 $((gpus - 1)))"; fi
  fi
  exec "$0" launch.py "$@"' "$PYTHON" "$@"

# The run exited 0: finished, or stopped and saved. Stopped by the time-limit signal, it has
# little time left: requeue the job (same id, same command), which resumes the run.
seconds_left() {  # squeue's %L: [days-][hours:]minutes:seconds, or UNLIMITED / NOT_SET
  local left days=0 h=0 m=0 s=0
  left=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null || true)
  [[ "$left" =~ ^([0-9]+-)?([0-9:]+)$ ]] || { echo 999999; return; }
  [ -n "${BASH_REMATCH[1]}" ] && days=${BASH_REMATCH[1]%-}
  IFS=: read -r -a parts <<<"${BASH_REMATCH[2]}"
  case ${#parts[@]} in
    3) h=${parts[0]} m=${parts[1]} s=${parts[2]} ;;
    2) m=${parts[0]} s=${parts[1]} ;;
    *) s=${parts[0]} ;;
  esac
  echo $(((10#$days * 24 + 10#$h) * 3600 + 10#$m * 60 + 10#$s))
}
if [ -n "${SLURM_JOB_ID:-}" ] && [ "$(seconds_left)" -le "$REQUEUE_WITHIN" ]; then
  echo "ragen_jax: under ${REQUEUE_WITHIN} s left; requeueing job $SLURM_JOB_ID to resume"
  scontrol requeue "$SLURM_JOB_ID"
fi

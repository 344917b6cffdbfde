#!/usr/bin/env bash
# A Cloud TPU VM slice of several hosts (v5litepod-16, v4-32, ...): copy the repository to every
# worker, install it there, and start the same launch.py command on all workers at once.
#
#   TPU_NAME=my-v5e-16 ZONE=us-west4-a WORKDIR=/mnt/shared/runs/qwen05b \
#     experiments/launch/tpu_pod.sh --config=configs/sokoban_ppo.py:qwen2.5-0.5b-v5e8 \
#     --config.mesh.data=-1 --config.model.checkpoint=/mnt/shared/Qwen2.5-0.5B-Instruct
#
# (v5litepod-16 is 2 hosts of 8 chips: the variant's fsdp=8 within a host, data=-1 = 2 across.)
#
# Run from your own machine, in the repository. Each worker finds its index and the coordinator
# (worker 0) through the TPU metadata server; RAGEN_JAX_INIT=1 tells launch.py to initialise
# jax.distributed from it. WORKDIR (and the checkpoint) must be on storage every worker mounts
# (a Filestore NFS share, a gcsfuse-mounted bucket): all workers write the orbax checkpoints.
# SETUP=0 skips the copy (of the committed tree, git archive HEAD) and the install when the
# workers are already set up.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR (shared storage)}"
cd "$(dirname "$0")/../.."
tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$ZONE" ${PROJECT:+--project="$PROJECT"} --worker=all)
if [ "${SETUP:-1}" = 1 ]; then
  git archive --format=tar.gz -o /tmp/ragen_jax.tar.gz HEAD
  "${tpu[@]}" scp /tmp/ragen_jax.tar.gz "$TPU_NAME":/tmp/ "${where[@]}"
  "${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --command='
    set -e; mkdir -p ~/ragen_jax && tar -xzf /tmp/ragen_jax.tar.gz -C ~/ragen_jax && cd ~/ragen_jax
    command -v python3.11 >/dev/null || { sudo apt-get update -q &&
      sudo apt-get install -y -q python3.11 python3.11-venv; }   # ragen_jax needs 3.11+
    python3.11 -m venv .venv && .venv/bin/pip install -q -e . "jax[tpu]==0.10.2" \
      -f https://storage.googleapis.com/jax-releases/libtpu_releases.html'
fi
args=""
if [ $# -gt 0 ]; then args=$(printf " %q" "$@"); fi
"${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --command="cd ~/ragen_jax && \
  RAGEN_JAX_INIT=1 .venv/bin/python launch.py --workdir=$(printf %q "$WORKDIR")$args"

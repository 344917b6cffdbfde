#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md in one command, on a machine with one NVIDIA GPU and JAX's
# CUDA build installed (the pinned pure-Python packages may be given as wheels in .whl/).
#   bash experiments/bench/run_gpu.sh [OUTDIR] [PART ...]
#       parts: kernels ceilings decode bound train sizes trainer (default all), learn (alone:
#       ~7 min), windows (alone: ~8 min); STEP_TIMEOUT=s bounds each step (default 1800);
#       LEARN_SECONDS=s trains each learn run that long (default 300), WINDOW_SECONDS each
#       windows run (default 420)
# kernels: the GPU-only attention tests (cuDNN's fused kernel is in the program and matches);
# ceilings: the card's matmul and memory ceilings; decode: decode/prefill vs transformers
# generate (CUDA, bf16) on a Qwen2.5-0.5B-shaped random model; bound: decode at batch 64-256
# against the memory-bandwidth bound; train: the StarPO train step's tokens/s and MFU at T=1024;
# sizes: 0.5B- and 3B-shaped models at T=2048 and 4096, bf16, our forward+backward (cuDNN
# attention) against PyTorch sdpa and the StarPO step's share of peak; trainer: the real trainer
# for a few steps of sokoban_ppo on a random 0.5B checkpoint (rollout and train tokens/s);
# learn: experiments/gpu_learn.py, the tiny model's warm start trained at 512 episodes a step
# and evaluated before and after on 512 held-out Sokoban levels (learn.md, learn.json, learn.png);
# windows: configs/game2048_ppo.py with full context (8 moves) against a window of 5 turns (8 and
# 16 moves), one seed each, with experiments/bench/context_window.py beside them.
set -uo pipefail
out=${1:-/tmp/gpu_bench}
shift || true
parts=" ${*:-kernels ceilings decode bound train sizes trainer} "
want() { [[ "$parts" == *" $1 "* ]]; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import jax, flax, optax, orbax.checkpoint as o, torch, transformers as t; \
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, \
'orbax', o.__version__ if hasattr(o, '__version__') else '?', 'torch', torch.__version__, \
'transformers', t.__version__, jax.devices())"
step() {
  echo "=== $1" | tee -a "$out/bench.log"; shift
  timeout "${STEP_TIMEOUT:-1800}" /usr/bin/time -f "(%e s)" "$@" 2>&1 | tee -a "$out/bench.log"
}
bench_step=experiments/bench/train_step.py
size() {  # size PRESET T B JAX_PARTS: the JAX rows, then PyTorch's in a process of its own
  local common=(--preset "$1" --seq "$2" --batch "$3" --dtype bfloat16 --remat --micro_batches 1
                --vocab_chunk 16384 --matmul_n 8192 --steps 2)
  step "size $1 T=$2 B=$3 jax" python3 $bench_step "${common[@]}" --parts "$4"
  step "size $1 T=$2 B=$3 torch" env XLA_PYTHON_CLIENT_PREALLOCATE=false \
      python3 $bench_step "${common[@]}" --parts torch
}
want learn && step learn python3 -m experiments.gpu_learn --out "$out" \
    --seconds "${LEARN_SECONDS:-300}"
if want windows; then  # alone: WINDOW_SECONDS (default 420) of each run, all at once
  arm() {  # arm NAME ARGS...: configs/game2048_ppo.py, stopped by SIGTERM (it saves and exits)
    local name=$1; shift
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout -s TERM -k 60 "${WINDOW_SECONDS:-420}" \
        python3 launch.py "$@" --workdir="$out/2048_$name" --config.trainer.eval_every=5 \
        > "$out/2048_$name.log" 2>&1 &
  }
  arm full8 --config=configs/game2048_ppo.py:full
  arm window8 --config=configs/game2048_ppo.py --config.rollout.max_turns=8 \
      --config.envs.game2048.max_actions_per_traj=8
  arm window16 --config=configs/game2048_ppo.py
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout "${WINDOW_SECONDS:-420}" python3 -m \
      experiments.bench.context_window --turns 8,16,32 --episodes 32 > "$out/window_bench.log" 2>&1
  wait
  rm -rf "$out"/2048_*/checkpoints  # the events and the config stay
fi
want kernels && step kernels python3 -m pytest -q -p no:cacheprovider -n 0 \
    tests/models_attention_test.py -k "cudnn or gpu"
want ceilings && step ceilings python3 experiments/bench/ceilings.py
want decode && step decode python3 experiments/bench/sampling.py --preset qwen2.5-0.5b --dtype bfloat16 \
    --batches 32,64,128 --prompt 256 --new 128 --iters 3 --skip_rollout
want bound && step bound python3 experiments/bench/sampling.py --preset qwen2.5-0.5b \
    --dtype bfloat16 --batches 64,128,256 --prompt 256 --new 128 --iters 2 --skip_rollout --hbm_tbs 0
if want sizes; then
  size qwen2.5-0.5b 2048 16 fwdbwd,actor,ppo
  size qwen2.5-3b 2048 8 fwdbwd,actor
  size qwen2.5-0.5b 4096 8 fwdbwd,actor
  size qwen2.5-3b 4096 4 fwdbwd
fi
want train && step train_step env XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 python3 experiments/bench/train_step.py --preset qwen2.5-0.5b --dtype bfloat16 \
    --remat --batch 16 --seq 1024 --micro_batches 2 --vocab_chunk 16384 --matmul_n 8192 --steps 3
want trainer || exit 0
ckpt=/tmp/qwen05_random
python3 -c "import jax, jax.numpy as jnp; from ragen_jax import models; \
models.save_hf(models.create('qwen2.5-0.5b', jax.random.key(0), dtype=jnp.bfloat16), '$ckpt')"
step trainer python3 launch.py --config=configs/sokoban_ppo.py:qwen2.5-0.5b-h100 \
    --config.model.checkpoint=$ckpt --workdir=/tmp/run05 --config.trainer.total_steps=3 \
    --config.trainer.eval_every=100 --config.envs.sokoban.val_groups=16 \
    --config.diagnostics.compute_freq=2
# Events and the console log only: the checkpoints of a 0.5B actor + critic are ~12 GB.
cp /tmp/run05/events.* "$out/" 2>/dev/null; cp /tmp/run05/*.json "$out/" 2>/dev/null
true

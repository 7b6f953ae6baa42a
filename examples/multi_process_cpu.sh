#!/usr/bin/env bash
# Data-parallel training with 2 processes on a CPU (gloo): the command that runs on many
# GPUs, with ACCELERATE_USE_CPU=1. All ranks share one run dir; each reads its own shard.
#   bash examples/multi_process_cpu.sh [more hydra overrides]
# Environment: NUM_PROCESSES (2), MAIN_PORT (29500, the rendezvous port), PYTHON (default:
# the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
ACCELERATE_USE_CPU=1 "$PYTHON" -m accelerate.commands.launch --multi_gpu \
  --num_processes "${NUM_PROCESSES:-2}" --num_machines 1 --mixed_precision no \
  --dynamo_backend no --main_process_port "${MAIN_PORT:-29500}" \
  -m mlmkit train train.max_steps=200 "$@"

#!/usr/bin/env bash
# Data-parallel training with 2 processes on a CPU (gloo): the command that runs on many
# GPUs, with ACCELERATE_USE_CPU=1. All ranks share one run dir; each reads its own shard.
set -euo pipefail
cd "$(dirname "$0")/.."
ACCELERATE_USE_CPU=1 .venv/bin/accelerate launch --multi_gpu --num_processes 2 \
  --num_machines 1 --mixed_precision no --dynamo_backend no \
  train.py train.max_steps=200 "$@"

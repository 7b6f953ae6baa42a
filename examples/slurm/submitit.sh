#!/usr/bin/env bash
# Submit runs to SLURM through Hydra's submitit launcher (pip install hydra-submitit-launcher,
# or: pip install -e ".[slurm]"). Each value of a swept setting becomes one SLURM job; on
# the time limit submitit requeues the job (up to max_num_timeout times) after mlmkit's
# checkpoint, and train.resume=auto continues it.
#   bash examples/slurm/submitit.sh optim.lr=1e-3,3e-3
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python train.py -m hydra/launcher=submitit_slurm \
  hydra.launcher.partition="${PARTITION:-gpu}" \
  hydra.launcher.nodes=1 hydra.launcher.tasks_per_node=1 hydra.launcher.gpus_per_node=1 \
  hydra.launcher.cpus_per_task=16 hydra.launcher.timeout_min=1440 \
  hydra.launcher.max_num_timeout=5 \
  train.resume=auto "$@"

#!/usr/bin/env bash
# Submit runs to SLURM through Hydra's submitit launcher (pip install hydra-submitit-launcher,
# or: pip install -e ".[slurm]"). Each value of a swept setting becomes one SLURM job.
# Before the time limit (signal_delay_s, 120 s) and on preemption SLURM sends the job
# submitit's signal, SIGUSR2: mlmkit saves a checkpoint and hands the signal to submitit,
# which requeues the job (after a time limit up to max_num_timeout times); the requeued job
# runs in the same run dir, and train.resume=auto continues it.
#   bash examples/slurm/submitit.sh optim.lr=1e-3,3e-3 [more hydra overrides]
# Environment: PARTITION (gpu), PYTHON (default: the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
"$PYTHON" -m mlmkit train -m hydra/launcher=submitit_slurm \
  hydra.launcher.partition="${PARTITION:-gpu}" \
  hydra.launcher.nodes=1 hydra.launcher.tasks_per_node=1 hydra.launcher.gpus_per_node=1 \
  hydra.launcher.cpus_per_task=16 hydra.launcher.timeout_min=1440 \
  hydra.launcher.max_num_timeout=5 \
  train.resume=auto "$@"

#!/usr/bin/env bash
# A learning-rate sweep with Hydra's multirun, then one table of the runs' final figures
# and one plot of their curves.
#   bash examples/sweep_lr.sh [more hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
SWEEP=multirun/lr-sweep-$(date +%Y%m%d-%H%M%S)
.venv/bin/python train.py -m optim.lr=1e-3,3e-3,1e-2 train.max_steps=1000 train.eval_every=250 \
  hydra.sweep.dir="$SWEEP" "$@"
.venv/bin/python -m mlmkit sweep "$SWEEP"
.venv/bin/python -m mlmkit plot "$SWEEP"/* --out "$SWEEP/curves.png"
